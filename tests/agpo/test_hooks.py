"""Step hooks: the no-op default leaves a step alone; the adaptive hooks probe, clip per group and observe."""

import pytest
import torch

from agpo.adaptive import AdaptiveConfig, AdaptiveController
from agpo.hooks import AdaptiveHooks, PlainStep, StepHooks
from agpo.rollout_batch import RolloutBatch


def never_probe(temperature):
    raise AssertionError("the no-op hooks must not sample a probe")


def test_the_plain_step_changes_nothing():
    hooks: StepHooks = PlainStep()
    assert hooks.choose_temperatures(0.7, 3, never_probe) == ([0.7] * 3, [])
    assert hooks.clip_ranges(None, [], []) is None
    assert hooks.observe_update(None, [], [], None) == {}
    assert not hooks.reads_old_policy and hooks.state_dict() is None


def batch_of(group_ids, probe_stats):
    rows = len(group_ids)
    return RolloutBatch(
        prompt_ids=[[1]] * rows,
        response_ids=[[2]] * rows,
        rewards=[0.0] * rows,
        group_ids=group_ids,
        temperatures=[1.0] * rows,
        finish_reasons=["stop"] * rows,
        answers=[None] * rows,
        rollout_logprobs=[[0.0]] * rows,
        probe_stats=probe_stats,
    )


def test_adaptive_hooks_probe_at_tau_base_and_clip_each_group_with_its_own_range():
    hooks = AdaptiveHooks(AdaptiveController(AdaptiveConfig(tau_base=0.9)), group_size=2)
    asked = []

    def probe(temperature):
        asked.append(temperature)
        return [1.0, 0.0, 1.0, 1.0], ["a", "b", "a", "a"]  # prompt 0 uncertain, prompt 1 certain

    temperatures, stats = hooks.choose_temperatures(1.0, 2, probe)
    assert asked == [0.9] and len(temperatures) == len(stats) == 2
    assert temperatures[0] == pytest.approx(0.9)  # the first prompt seeds the baseline: c = 0
    assert temperatures[1] < temperatures[0]  # less uncertain than the baseline: cooler
    assert stats[0].dispersion > 0 and stats[1].dispersion == 0

    batch = batch_of([7, 7, 8, 8], {7: stats[0], 8: stats[1]})
    eps = hooks.clip_ranges(batch, [torch.ones(4, 1)], [torch.ones(4, 1)])
    assert eps[0] == eps[1] and eps[2] == eps[3] and eps[0] < eps[2]  # dispersion shrinks the range
    assert hooks.state_dict()["entropy_ref"] == 1.0


def test_adaptive_hooks_state_is_required_on_resume():
    hooks = AdaptiveHooks(AdaptiveController(), group_size=2)
    state = hooks.state_dict()
    hooks.load_state_dict(state)
    assert hooks.state_dict() == state
    with pytest.raises(ValueError, match="needs its controller state"):
        hooks.load_state_dict(None)
