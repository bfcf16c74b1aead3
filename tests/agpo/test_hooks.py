"""Step hooks: the no-op default leaves a step alone; the adaptive hooks probe, clip per group and observe."""

import math

import pytest
import torch

from agpo.adaptive import AdaptiveConfig, AdaptiveController, ProbeStats
from agpo.hooks import AdaptiveHooks, PlainStep
from agpo.logprobs import response_tensors, token_log_probs
from agpo.step_interfaces import RolloutBatch, StepHooks
from agpo.update import micro_batch_rows


def never_probe(temperature):
    raise AssertionError("the no-op hooks must not sample a probe")


def adaptive_hooks(eps_low=0.2, eps_high=0.2, **config):
    return AdaptiveHooks(AdaptiveController(AdaptiveConfig(**config)), group_size=2, eps_low=eps_low, eps_high=eps_high)


def test_the_plain_step_changes_nothing():
    hooks: StepHooks = PlainStep()
    assert hooks.choose_temperatures(0.7, 3, never_probe) == ([0.7] * 3, [])
    assert hooks.clip_ranges(None, [], []) is None
    assert hooks.observe_update(None, None, [], [], None) == {}
    assert not hooks.reads_old_policy and hooks.state_dict() is None


def batch_of(group_ids, probe_stats, responses=None, temperatures=None):
    rows = len(group_ids)
    return RolloutBatch(
        prompt_ids=[[10 + g % 3, 11, 12] for g in group_ids],
        response_ids=responses or [[2]] * rows,
        rewards=[0.0] * rows,
        group_ids=group_ids,
        temperatures=temperatures or [1.0] * rows,
        finish_reasons=["stop"] * rows,
        answers=[None] * rows,
        rollout_logprobs=[[0.0] * len(r) for r in responses or [[2]] * rows],
        probe_stats=probe_stats,
    )


def test_adaptive_hooks_probe_at_tau_base_and_clip_each_group_with_its_own_range():
    hooks = adaptive_hooks(tau_base=0.9)
    asked = []

    def probe(temperature):
        asked.append(temperature)
        # prompt 0 uncertain, prompt 1 certain
        return [1.0, 0.0, 1.0, 1.0], ["a", "b", "a", "a"], ["a", "b", "a", "a"]

    temperatures, stats = hooks.choose_temperatures(1.0, 2, probe)
    assert asked == [0.9] and len(temperatures) == len(stats) == 2
    assert temperatures[0] == pytest.approx(0.9)  # the first prompt seeds the baseline: c = 0
    assert temperatures[1] < temperatures[0]  # less uncertain than the baseline: cooler
    assert stats[0].dispersion > 0 and stats[1].dispersion == 0

    batch = batch_of([7, 7, 8, 8], {7: stats[0], 8: stats[1]})
    low, high = hooks.clip_ranges(batch, [torch.ones(4, 1)], [torch.ones(4, 1)])
    assert low[0] == low[1] and low[2] == low[3] and low[0] < low[2]  # dispersion shrinks the range
    assert torch.equal(low, high)  # no clip-higher configured: symmetric
    assert hooks.state_dict()["entropy_ref"] == 1.0


def test_unparseable_probe_answers_vote_for_their_own_text():
    hooks = adaptive_hooks()

    def probe(temperature):
        return [0.0] * 4, [None, None, None, None], ["  foo", "bar", "same", "same "]

    _, stats = hooks.choose_temperatures(1.0, 2, probe)
    assert [s.vote_entropy for s in stats] == [pytest.approx(math.log(2)), 0.0]  # was 0 and 0 (one None bucket)


def test_each_group_clips_with_its_own_entropy_and_clip_higher_keeps_the_ratio():
    hooks = adaptive_hooks(eps_low=0.2, eps_high=0.3)  # flat probe statistics below: eps = 0.2 * H_pol / H_ref
    batch = batch_of([4, 4, 9, 9], {4: ProbeStats(0.0, 0.0, 0.0), 9: ProbeStats(0.0, 0.0, 0.0)})
    # micro-batches [rows 0-2] (width 2) and [row 3] (width 3); masked entries are 9 and must not count
    entropies = [torch.tensor([[0.5, 1.5], [1.0, 9.0], [3.0, 3.0]]), torch.tensor([[2.0, 4.0, 3.0]])]
    masks = [torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]), torch.ones(1, 3)]
    # H_pol: group 4 (0.5 + 1.5 + 1) / 3 = 1, group 9 (3 + 3 + 2 + 4 + 3) / 5 = 3; H_ref seeded by their mean 2
    # ratios 0.5 and 1.5 -> eps 0.1 and 0.3; clip-higher 0.2 / 0.3 -> eps_high 0.15 and 0.45
    low, high = hooks.clip_ranges(batch, entropies, masks)
    assert low.tolist() == pytest.approx([0.1, 0.1, 0.3, 0.3])
    assert high.tolist() == pytest.approx([0.15, 0.15, 0.45, 0.45])
    assert hooks.state_dict()["entropy_ref"] == pytest.approx(2.0)
    # a group without a response token is left out of the batch mean (1, group 4's alone) and takes it as H_pol
    masks[1] = torch.zeros(1, 3)
    masks[0][2] = 0.0
    low, _ = hooks.clip_ranges(batch, entropies, masks)
    assert low.tolist() == pytest.approx([0.1] * 4)  # both groups: H_pol 1 against H_ref 2
    assert hooks.state_dict()["entropy_ref"] == pytest.approx(0.01 * 1.0 + 0.99 * 2.0)


@pytest.mark.parametrize("micro_batch_size", [64, 3, 1])
def test_step_kl_is_taken_once_per_step_whatever_the_micro_batches(tiny_model, micro_batch_size):
    hooks = adaptive_hooks()
    responses = [[5, 6], [7, 8, 9, 10], [11, 12, 13], [14]]
    batch = batch_of([0, 0, 1, 1], {}, responses=responses, temperatures=[1.0, 1.0, 0.7, 0.7])
    tensors = [response_tensors(batch, r, pad_token_id=0) for r in micro_batch_rows(4, micro_batch_size)]
    # pi_old = pi_new + a per-row log-ratio d on response tokens (100 on padding, which must not count):
    # group 0: (2 * 0.6 + 4 * 0.15) / 6 = 0.3; group 1: -0.2 -> max(0, .) = 0; KL_step = (0.3 + 0) / 2 = 0.15
    # (one token mean over all 10 tokens would give 0.1, and one EMA update per micro-batch more)
    d = torch.tensor([0.6, 0.15, -0.2, -0.2])
    start, old = 0, []
    for t in tensors:
        rows = len(t["mask"])
        with torch.no_grad():
            new = token_log_probs(tiny_model, t)[0]
        old.append(new + t["mask"] * d[start : start + rows, None] + (1 - t["mask"]) * 100)
        start += rows
    clip = (torch.full((4,), 0.2), torch.full((4,), 0.3))
    metrics = hooks.observe_update(tiny_model, batch, tensors, old, clip)
    assert metrics["step_kl"] == pytest.approx(0.15, abs=1e-5)
    assert metrics["step_kl_ema"] == hooks.controller.step_kl_ema == pytest.approx(0.015, abs=1e-6)
    assert metrics["clip_eps_mean"] == pytest.approx(0.2)


def test_adaptive_hooks_state_is_required_on_resume():
    hooks = adaptive_hooks()
    state = hooks.state_dict()
    hooks.load_state_dict(state)
    assert hooks.state_dict() == state
    with pytest.raises(ValueError, match="needs its controller state"):
        hooks.load_state_dict(None)
