"""Adaptive AGPO controllers against hand-computed values, and their state round trip."""

import math

import pytest
import torch

from agpo.adaptive import (
    AdaptiveConfig,
    AdaptiveController,
    ProbeStats,
    adjusted_skewness,
    advantage_rule,
    clip_bounds,
    group_probe_statistics,
    group_token_means,
    mean_over_groups,
    probe_statistics,
    reward_dispersion,
    vote_entropy,
    vote_keys,
)
from agpo.adaptive_config import algorithm_names
from agpo.advantages import GroupIndex
from agpo.surrogates import clipped_surrogate

LN2, LN4 = math.log(2), math.log(4)


def t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_dispersions():
    assert reward_dispersion(t([1, 0, 0, 0]), "std") == pytest.approx(0.5)  # sqrt(0.75 / 3)
    assert reward_dispersion(t([1, 0, 0, 0]), "mad") == 0.0  # median 0, median |dev| 0
    assert reward_dispersion(t([1, 0, 0, 0]), "iqr") == pytest.approx(0.25 / 1.349)
    assert reward_dispersion(t([0, 1, 2, 3, 4]), "std") == pytest.approx(math.sqrt(2.5))
    assert reward_dispersion(t([0, 1, 2, 3, 4]), "mad") == pytest.approx(1.4826)
    assert reward_dispersion(t([0, 1, 2, 3, 4]), "iqr") == pytest.approx(2 / 1.349)
    assert reward_dispersion(t([1.0]), "std") == 0.0
    with pytest.raises(ValueError, match="dispersion must be one of"):
        reward_dispersion(t([1, 0]), "var")


def test_vote_entropy():
    assert vote_entropy(["a", "a", "b", "b"]) == pytest.approx(LN2)
    assert vote_entropy(["a"] * 4) == 0.0
    assert vote_entropy(["a", "b", "c", "d"]) == pytest.approx(LN4)
    assert vote_entropy([]) == 0.0


def test_unparseable_answers_vote_for_their_own_stripped_text():
    keys = vote_keys([None, None, "a", "a"], [" x ", "y", "<answer>a</answer>", "a"])
    assert keys == [("unparsed", "x"), ("unparsed", "y"), "a", "a"]
    # {x: 1, y: 1, a: 2}: two different unparseable answers are two categories, not one shared "None" (ln 2)
    assert vote_entropy(keys) == pytest.approx(-(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5)))
    assert vote_entropy(vote_keys([None, None], ["x", " x\n"])) == 0.0  # the same text after stripping
    assert vote_entropy(vote_keys([None, "x"], ["x", "x"])) == pytest.approx(LN2)  # never equals a parsed "x"
    with pytest.raises(ValueError, match="one response text per answer"):
        vote_keys([None], [])


def test_adjusted_skewness():
    # [1,0,0,0]: m2 = 0.1875, m3 = 0.09375, g1 = 1.1547, G1 = sqrt(12)/2 * g1 = 2
    assert adjusted_skewness(t([1, 0, 0, 0])) == pytest.approx(2.0)
    assert adjusted_skewness(t([0, 1, 1, 1])) == pytest.approx(-2.0)
    assert adjusted_skewness(t([0, 0, 0, 0])) == 0.0
    assert adjusted_skewness(t([1, 0])) == 0.0
    assert adjusted_skewness(t([1] + [0] * 200)) == 10.0  # clipped


def test_probe_statistics():
    stats = probe_statistics([1.0, 0.0, 0.0, 0.0], ["3", "2", "2", "2"])
    assert stats == ProbeStats(
        dispersion=pytest.approx(0.5),
        vote_entropy=pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))),
        skewness=pytest.approx(2.0),
    )
    with pytest.raises(ValueError, match="one reward per answer"):
        probe_statistics([1.0, 0.0], ["3"])


def test_temperature_follows_centred_uncertainty():
    controller = AdaptiveController()
    first = ProbeStats(dispersion=0.5, vote_entropy=LN2, skewness=0.0)  # U1 = 1.193147
    calm = ProbeStats(dispersion=0.0, vote_entropy=0.0, skewness=0.0)  # U2 = 0
    wild = ProbeStats(dispersion=1.0, vote_entropy=LN4, skewness=0.0)  # U3 = 2.386294
    assert controller.temperature(first) == 1.0  # the first prompt sets the baseline, c = 0
    assert controller.temperature(calm) == pytest.approx(0.85)  # c = -1 -> 1 * (1 - 0.15)
    m = 0.9 * (0.5 + LN2)
    c = (1.0 + LN4 - m) / (m + 1e-8)
    assert controller.temperature(wild) == pytest.approx(1 + 0.15 * c)
    assert controller.state_dict()["uncertainty_baseline"] == pytest.approx(0.1 * (1 + LN4) + 0.9 * m)


def test_temperature_is_clipped_and_baseline_reseeds_while_zero():
    controller = AdaptiveController(AdaptiveConfig(lambda_T=10.0))
    calm = ProbeStats(0.0, 0.0, 0.0)
    busy = ProbeStats(1.0, 0.0, 0.0)
    assert controller.temperature(calm) == 1.0
    assert controller.temperature(busy) == 1.0  # baseline still 0: re-seeded, c = 0 (no 1e8 blow-up)
    assert controller.temperature(calm) == 0.5  # c = -1, lambda_T 10 -> clipped at tau_min
    assert controller.temperature(ProbeStats(9.0, 0.0, 0.0)) == 1.5  # clipped at tau_max


def test_baseline_reseeds_while_it_is_zero_check_values():
    controller = AdaptiveController()  # w_r = 1, lambda_T = 0.15, rate 0.1: U = dispersion here
    seen = []
    for u in (0.0, 0.0, 0.5, 1.0):
        tau = controller.temperature(ProbeStats(u, 0.0, 0.0))
        seen.append((tau, controller.state_dict()["uncertainty_baseline"]))
    # U 0: seed (c 0, m 0); U 0: m <= 1e-8, re-seed (c 0, m 0); U 0.5: re-seed (c 0, m 0.5);
    # U 1.0: c = (1 - 0.5) / (0.5 + 1e-8), tau = 1 + 0.15 c, m = 0.1 * 1 + 0.9 * 0.5 = 0.55
    c = 0.5 / (0.5 + 1e-8)
    assert seen == [(1.0, 0.0), (1.0, 0.0), (1.0, 0.5), (pytest.approx(1 + 0.15 * c), pytest.approx(0.55))]


def test_clip_eps_formula_and_entropy_reference():
    controller = AdaptiveController()
    stats = [ProbeStats(0.5, LN2, 2.0), ProbeStats(0.0, 0.0, 0.0)]
    eps = controller.clip_eps(stats, [1.0, 1.0], 1.0)  # H_ref seeded by the batch H_pol: ratio 1
    assert eps.tolist() == pytest.approx([0.2 * (1 + 0.1 * LN2) / 1.5, 0.2], abs=1e-6)
    eps = controller.clip_eps(stats, [2.0, 2.0], 2.0)  # ratio 2 -> clipped to 1.5
    assert eps.tolist() == pytest.approx([0.3 * (1 + 0.1 * LN2) / 1.5, 0.3], abs=1e-6)
    assert controller.state_dict()["entropy_ref"] == pytest.approx(0.01 * 2.0 + 0.99 * 1.0)
    wide = AdaptiveController(AdaptiveConfig(eps_base=1.0, eps_max=0.4))
    assert wide.clip_eps([ProbeStats(0.0, 0.0, 0.0)], [1.0], 1.0).tolist() == pytest.approx([0.4])


def test_each_group_clips_with_its_own_policy_entropy():
    controller = AdaptiveController()
    flat = [ProbeStats(0.0, 0.0, 0.0)] * 2
    # step 1: H_pol 1 and 3, batch mean 2 seeds H_ref: ratios 0.5 and 1.5 -> eps 0.1 and 0.3; H_ref stays 2
    assert controller.clip_eps(flat, [1.0, 3.0], 2.0).tolist() == pytest.approx([0.1, 0.3])
    assert controller.state_dict()["entropy_ref"] == pytest.approx(2.0)
    # step 2: H_pol 2 and 4 against H_ref 2: ratios 1 and 2 (-> 1.5); then H_ref = 0.01 * 3 + 0.99 * 2, once
    assert controller.clip_eps(flat, [2.0, 4.0], 3.0).tolist() == pytest.approx([0.2, 0.3])
    assert controller.state_dict()["entropy_ref"] == pytest.approx(2.01)


def test_entropy_reference_reseeds_while_it_is_zero():
    """A first step without an unmasked token has batch H_pol 0: H_ref = 0 would pin every ratio at 1.5 for the
    ~110 steps the 0.01-rate EMA takes to climb. Like the baseline m, H_ref is re-seeded while <= 1e-8."""
    controller = AdaptiveController()
    flat = [ProbeStats(0.0, 0.0, 0.0)] * 2
    controller.clip_eps(flat, [0.0, 0.0], 0.0)  # step 1: nothing unmasked
    assert controller.state_dict()["entropy_ref"] == 0.0
    # step 2: H_ref 0 is re-seeded by the batch mean 2: ratios 1 / 2 and 3 / 2 -> eps 0.1 and 0.3 (not 1.5 and
    # 1.5 against H_ref 0 -> 0.3, 0.3), and H_ref = 2 (not 0.01 * 2 + 0.99 * 0 = 0.02)
    assert controller.clip_eps(flat, [1.0, 3.0], 2.0).tolist() == pytest.approx([0.1, 0.3])
    assert controller.state_dict()["entropy_ref"] == pytest.approx(2.0)
    # step 3: an ordinary EMA step from there
    assert controller.clip_eps(flat, [2.0, 4.0], 3.0).tolist() == pytest.approx([0.2, 0.3])
    assert controller.state_dict()["entropy_ref"] == pytest.approx(2.01)


def test_group_token_means_do_not_depend_on_the_micro_batch_cut():
    groups = GroupIndex.from_ids([7, 7, 8, 9])
    values = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0], [-1.0, -3.0, 9.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    means, tokens = group_token_means([values], [mask], groups)
    assert means.tolist() == [2.0, -2.0, 0.0] and tokens.tolist() == [3.0, 2.0, 0.0]  # (1 + 2 + 3) / 3
    split = group_token_means([values[:1, :2], values[1:]], [mask[:1, :2], mask[1:]], groups)
    assert [x.tolist() for x in split] == [means.tolist(), tokens.tolist()]
    assert mean_over_groups(means, tokens) == 0.0  # (2 - 2) / 2: the group without a token is left out
    assert mean_over_groups(means.clamp(min=0), tokens) == 1.0  # KL_step: max(0, .) per group first
    assert mean_over_groups(means, torch.zeros(3)) == 0.0
    # over ranks: all_reduce_sum adds [sum, count] of every rank (here a second rank with [4, 2])
    assert mean_over_groups(means, tokens, lambda v: [v[0] + 4.0, v[1] + 2.0]) == 1.0


def test_step_kl_shrinks_the_clip_range():
    controller = AdaptiveController()
    assert controller.observe_step_kl(0.05) == pytest.approx(0.005)  # one step: one EMA update
    assert controller.observe_step_kl(0.0) == pytest.approx(0.0045)
    eps = controller.clip_eps([ProbeStats(0.0, 0.0, 0.0)], [1.0], 1.0)
    assert eps.item() == pytest.approx(0.2 / (1 + 0.5 * 0.0045))


def test_clip_higher_keeps_the_configured_ratio():
    eps = torch.tensor([0.1, 0.25])
    low, high = clip_bounds(eps, 0.2, 0.28)
    assert low.tolist() == pytest.approx([0.1, 0.25]) and high.tolist() == pytest.approx([0.14, 0.35])
    for symmetric in ((0.2, 0.2), (0.3, 0.2)):  # no clip-higher: the adaptive eps for both bounds
        assert [b.tolist() for b in clip_bounds(eps, *symmetric)] == [eps.tolist(), eps.tolist()]
    # positive advantage, ratio 1.12: inside (1 - 0.1, 1 + 0.14), outside 1 + 0.1; ratio 1.16: outside both
    log_ratio = torch.tensor([[1.12], [1.16]]).log()

    def clipped(pair):
        low, high = clip_bounds(torch.tensor([0.1, 0.1]), *pair)
        surrogate = clipped_surrogate(log_ratio, torch.zeros(2, 1), torch.ones(2), eps_low=low, eps_high=high)
        return surrogate.clipped.flatten().tolist()

    assert clipped((0.2, 0.28)) == [False, True]
    assert clipped((0.2, 0.2)) == [True, True]


def test_state_round_trip_gives_identical_decisions():
    stats = [ProbeStats(0.3 * i, 0.1 * i, 0.0) for i in range(1, 6)]
    original = AdaptiveController()
    original.temperatures(stats[:3])
    original.clip_eps(stats[:3], [1.3, 1.0, 1.6], 1.3)
    original.observe_step_kl(0.1)
    restored = AdaptiveController()
    restored.load_state_dict(dict(original.state_dict()))
    assert restored.temperatures(stats[3:]) == original.temperatures(stats[3:])
    assert torch.equal(restored.clip_eps(stats[3:], [0.9, 1.1], 1.0), original.clip_eps(stats[3:], [0.9, 1.1], 1.0))
    with pytest.raises(ValueError, match="must have keys"):
        restored.load_state_dict({"step_kl_ema": 0.0})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tau_min": 2.0}, "tau_min must be <= tau_max"),
        ({"eps_min": 0.0}, "eps_min must be a finite number > 0"),
        ({"baseline_rate": 0.0}, r"baseline_rate must be in \(0, 1\]"),
        ({"dispersion": "range"}, "dispersion must be one of"),
        ({"alpha": -1.0}, "alpha must be a finite number >= 0"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveConfig(**kwargs)


def test_group_probe_statistics_splits_prompt_major_groups():
    stats = group_probe_statistics([1, 0, 0, 0, 1, 1, 1, 1], ["3", "2", "2", "2", "1", "1", "1", "1"], 4)
    assert stats == [probe_statistics([1, 0, 0, 0], ["3", "2", "2", "2"]), probe_statistics([1, 1, 1, 1], ["1"] * 4)]
    with pytest.raises(ValueError, match="multiple of group_size 4"):
        group_probe_statistics([1, 0, 0], ["a", "b", "c"], 4)


def test_algorithm_names_and_advantage_rule():
    assert algorithm_names() == ["agpo", "dr_grpo", "grpo", "rloo", "w_reinforce", "adaptive_agpo"]
    assert advantage_rule("agpo", {"lambda_neg": 1.0}) == ("agpo", {"lambda_neg": 1.0})
    assert advantage_rule("adaptive_agpo", {}) == ("grpo", {"eps": 1e-8, "eps_mode": "max"})
