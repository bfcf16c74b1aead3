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
    algorithm_names,
    group_probe_statistics,
    probe_statistics,
    reward_dispersion,
    vote_entropy,
)

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
    assert vote_entropy([None, None, "a", "a"]) == pytest.approx(LN2)  # unparseable answers are one category
    assert vote_entropy([]) == 0.0


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


def test_clip_eps_formula_and_entropy_reference():
    controller = AdaptiveController()
    stats = [ProbeStats(0.5, LN2, 2.0), ProbeStats(0.0, 0.0, 0.0)]
    eps = controller.clip_eps(stats, policy_entropy=1.0)  # H_ref seeded by H_pol: ratio 1
    assert eps.tolist() == pytest.approx([0.2 * (1 + 0.1 * LN2) / 1.5, 0.2], abs=1e-6)
    eps = controller.clip_eps(stats, policy_entropy=2.0)  # ratio 2 -> clipped to 1.5
    assert eps.tolist() == pytest.approx([0.3 * (1 + 0.1 * LN2) / 1.5, 0.3], abs=1e-6)
    assert controller.state_dict()["entropy_ref"] == pytest.approx(0.01 * 2.0 + 0.99 * 1.0)
    wide = AdaptiveController(AdaptiveConfig(eps_base=1.0, eps_max=0.4))
    assert wide.clip_eps([ProbeStats(0.0, 0.0, 0.0)], 1.0).tolist() == pytest.approx([0.4])


def test_step_kl_shrinks_the_clip_range():
    controller = AdaptiveController()
    old = torch.tensor([[-1.0, -1.0, -5.0]])
    new = torch.tensor([[-1.2, -0.9, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert controller.observe_step_kl(old, new, mask) == pytest.approx(0.05)  # (0.2 - 0.1) / 2
    assert controller.step_kl_ema == pytest.approx(0.005)
    assert controller.observe_step_kl(new, old, mask) == 0.0  # negative estimate floors at 0
    assert controller.step_kl_ema == pytest.approx(0.0045)
    eps = controller.clip_eps([ProbeStats(0.0, 0.0, 0.0)], 1.0)
    assert eps.item() == pytest.approx(0.2 / (1 + 0.5 * 0.0045))


def test_state_round_trip_gives_identical_decisions():
    stats = [ProbeStats(0.3 * i, 0.1 * i, 0.0) for i in range(1, 6)]
    original = AdaptiveController()
    original.temperatures(stats[:3])
    original.clip_eps(stats[:3], 1.3)
    original.observe_step_kl(torch.zeros(1, 2), torch.full((1, 2), -0.1), torch.ones(1, 2))
    restored = AdaptiveController()
    restored.load_state_dict(dict(original.state_dict()))
    assert restored.temperatures(stats[3:]) == original.temperatures(stats[3:])
    assert torch.equal(restored.clip_eps(stats[3:], 0.9), original.clip_eps(stats[3:], 0.9))
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
