"""Policy loss: clipped surrogate, aggregation modes, KL estimators, entropy, against hand-computed values."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from agpo.losses import (
    AGGREGATION_MODES,
    Normalisers,
    PolicyLossConfig,
    aggregate,
    entropy_from_log_probs,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    truncated_is_weights,
)
from agpo.surrogates import clipped_surrogate


def lengths_mask(lengths, width):
    return torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])


def test_aggregation_check_values():
    mask = lengths_mask([2, 4], 4)
    ones = torch.ones(2, 4)
    expected = {
        "token-mean": 1.0,
        "seq-mean-token-mean": 1.0,
        "seq-mean-token-sum": 3.0,
        "seq-mean-token-sum-norm": 0.75,
    }
    assert {mode: aggregate(ones, mask, mode).item() for mode in AGGREGATION_MODES} == expected


def test_aggregation_of_uneven_values():
    values = torch.tensor([[1.0, 2.0, 99.0, 99.0], [3.0, 4.0, 5.0, 6.0]])  # 99s are padding
    mask = lengths_mask([2, 4], 4)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(21 / 6)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4.5) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 18) / 2)
    assert aggregate(values, mask, "seq-mean-token-sum-norm").item() == pytest.approx(21 / 8)
    assert aggregate(values, mask, "seq-mean-token-sum-norm", max_len=8).item() == pytest.approx(21 / 16)


def test_aggregation_ignores_empty_sequences_and_empty_masks():
    values = torch.tensor([[2.0, 2.0], [7.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    assert aggregate(values, mask, "seq-mean-token-mean").item() == 2.0
    assert aggregate(values, torch.zeros(2, 2), "token-mean").item() == 0.0


def test_aggregation_with_global_normalisers_hand_values():
    """A batch of three rows split into micro-batches [A, B] and [C]; B is truncated and fully masked.
    A = [1, 2], C = [3, 4, 5]: N = 5 tokens, S = 2 sequences (B is none), L = 4 (B's padded width)."""
    values = torch.tensor([[1.0, 2.0, 99.0, 99.0], [7.0, 7.0, 7.0, 7.0], [3.0, 4.0, 5.0, 99.0]])
    mask = lengths_mask([2, 0, 3], 4)
    norm = Normalisers.of(mask)
    assert norm == Normalisers(num_tokens=5.0, num_seqs=2.0, max_len=4)
    full = {
        "token-mean": 15 / 5,
        "seq-mean-token-mean": (1.5 + 4.0) / 2,
        "seq-mean-token-sum": (3 + 12) / 2,
        "seq-mean-token-sum-norm": 15 / (2 * 4),
    }
    shares = {  # [A, B] and [C] (width 3), each over the whole batch's N, S and L
        "token-mean": (3 / 5, 12 / 5),
        "seq-mean-token-mean": (1.5 / 2, 4.0 / 2),
        "seq-mean-token-sum": (3 / 2, 12 / 2),
        "seq-mean-token-sum-norm": (3 / 8, 12 / 8),
    }
    for mode in AGGREGATION_MODES:
        assert aggregate(values, mask, mode).item() == pytest.approx(full[mode]), mode
        first = aggregate(values[:2], mask[:2], mode, normalisers=norm).item()
        second = aggregate(values[2:, :3], mask[2:, :3], mode, normalisers=norm).item()
        assert (first, second) == pytest.approx(shares[mode]), mode
        assert first + second == pytest.approx(full[mode]), mode
    assert aggregate(values, mask, "seq-mean-token-sum-norm", max_len=8).item() == pytest.approx(15 / 16)
    with pytest.raises(ValueError, match="max_len inside normalisers"):
        aggregate(values, mask, "token-mean", 4, normalisers=norm)


def test_policy_loss_metrics_of_micro_batches_add_up_to_the_full_batch():
    log_prob = torch.tensor([[0.1, -0.3, 0.0], [0.5, 0.2, 0.0], [-0.4, 0.3, 0.2]])
    mask = lengths_mask([2, 0, 3], 3)
    advantages = torch.tensor([1.0, -1.0, -0.5])
    config = PolicyLossConfig(loss_agg_mode="seq-mean-token-mean")
    norm = Normalisers.of(mask)
    full_loss, full = policy_loss(log_prob, torch.zeros(3, 3), advantages, mask, config, entropy=log_prob.abs())
    parts = [
        policy_loss(
            log_prob[rows],
            torch.zeros(3, 3)[rows],
            advantages[rows],
            mask[rows],
            config,
            entropy=log_prob.abs()[rows],
            normalisers=norm,
        )
        for rows in (slice(0, 1), slice(1, 3))
    ]
    assert sum(loss.item() for loss, _ in parts) == pytest.approx(full_loss.item())
    for key, value in full.items():
        assert sum(metrics[key] for _, metrics in parts) == pytest.approx(value, abs=1e-7), key


def test_aggregation_errors():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'; known modes: token-mean"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "mean")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        aggregate(torch.ones(2), torch.ones(2), "token-mean")
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm", max_len=0)


@given(
    st.integers(1, 6),
    st.integers(1, 8),
    st.lists(st.floats(-10, 10, allow_nan=False), min_size=48, max_size=48),
)
def test_aggregation_modes_agree_on_equal_lengths(batch, length, flat):
    values = torch.tensor(flat[: batch * length], dtype=torch.float64).reshape(batch, length)
    mask = torch.ones(batch, length, dtype=torch.float64)
    token_mean = aggregate(values, mask, "token-mean")
    assert torch.isclose(aggregate(values, mask, "seq-mean-token-mean"), token_mean)
    assert torch.isclose(aggregate(values, mask, "seq-mean-token-sum"), token_mean * length)
    assert torch.isclose(aggregate(values, mask, "seq-mean-token-sum-norm"), token_mean)


def surrogate(adv, log_ratio, **kw):
    log_prob = torch.tensor([[log_ratio]])
    return clipped_surrogate(log_prob, torch.zeros(1, 1), torch.tensor([adv]), **kw)


@pytest.mark.parametrize(
    ("adv", "ratio", "loss", "clipped", "dual"),
    [
        (1.0, math.exp(0.5), -1.2, True, False),  # upper clip binds
        (1.0, 0.5, -0.5, False, False),  # pessimistic max keeps the unclipped term
        (-1.0, math.exp(0.5), math.exp(0.5), False, False),
        (-1.0, 0.5, 0.8, True, False),  # lower clip binds
        (-1.0, 5.0, 3.0, False, True),  # dual clip caps the loss at -A * c
        (-2.0, 5.0, 6.0, False, True),
    ],
)
def test_clipped_surrogate_hand_values(adv, ratio, loss, clipped, dual):
    out = surrogate(adv, math.log(ratio))
    assert out.losses.item() == pytest.approx(loss, abs=1e-6)
    assert out.clipped.item() is clipped
    assert out.dual_clipped.item() is dual


def test_asymmetric_clip_range_and_no_dual_clip():
    assert surrogate(1.0, math.log(1.25)).losses.item() == pytest.approx(-1.2)
    assert surrogate(1.0, math.log(1.25), eps_high=0.28).losses.item() == pytest.approx(-1.25)
    assert surrogate(1.0, math.log(0.7), eps_low=0.1).losses.item() == pytest.approx(-0.7)
    assert surrogate(-1.0, math.log(5.0), dual_clip_c=None).losses.item() == pytest.approx(5.0)


def test_eps_low_zero_bounds_the_ratio_below_at_one():
    """eps_low = 0 is a defined trust region for the loss itself: clip(rho, 1, 1 + eps_high), nothing divides by it.
    A < 0 at rho 0.9: max(0.9, 1.0) = 1.0, clipped (no gradient); A > 0 at rho 0.9: max(-0.9, -1.0) = -0.9."""
    config = PolicyLossConfig(eps_low=0.0, eps_high=0.2, dual_clip_c=None)
    out = clipped_surrogate(
        torch.full((2, 1), math.log(0.9)), torch.zeros(2, 1), torch.tensor([-1.0, 1.0]), eps_low=config.eps_low
    )
    assert out.losses.flatten().tolist() == pytest.approx([1.0, -0.9])
    assert out.clipped.flatten().tolist() == [True, False]


def test_log_ratio_is_clamped():
    out = clipped_surrogate(torch.tensor([[50.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), dual_clip_c=None)
    assert out.losses.item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_per_sequence_clip_range():
    log_prob = torch.full((2, 1), math.log(1.25))
    out = clipped_surrogate(log_prob, torch.zeros(2, 1), torch.ones(2), eps_low=0.2, eps_high=torch.tensor([0.1, 0.3]))
    assert out.losses.flatten().tolist() == pytest.approx([-1.1, -1.25])


def test_clipped_tokens_carry_no_gradient():
    log_prob = torch.tensor([[0.5, 0.0]], requires_grad=True)
    loss, _ = policy_loss(log_prob, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    loss.backward()
    # token 0: ratio e^0.5 clipped -> 0; token 1: d(-A * rho)/dlogp = -1, token-mean halves it
    assert log_prob.grad.flatten().tolist() == pytest.approx([0.0, -0.5])


def test_kl_estimators_hand_values():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])  # d = ref - logp = -1
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1.0), abs=1e-6)
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0  # clamped
    assert kl_penalty(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="unknown kl estimator 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_entropy_from_logits():
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(torch.tensor([0.0, -1e4])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_of_masked_logits_is_finite_with_finite_gradients():
    """A -inf logit (a masked token) has p = 0 and p log p = 0: the entropy and its gradient are those of the
    distribution over the other tokens (exp(-inf) * -inf was NaN, and xlogy's gradient at p = 0 is 0/0 = NaN)."""
    logits = torch.tensor([0.0, 1.0, -math.inf], requires_grad=True)
    entropy = entropy_from_logits(logits)
    entropy.backward()
    unmasked = torch.tensor([0.0, 1.0], requires_grad=True)
    want = entropy_from_logits(unmasked)
    want.backward()
    p = 1 / (1 + math.e)  # softmax([0, 1]) = [p, 1 - p]
    assert entropy.item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)))
    assert entropy.item() == pytest.approx(want.item())
    assert logits.grad.tolist() == pytest.approx([*unmasked.grad.tolist(), 0.0])
    log_probs = torch.log_softmax(torch.tensor([[0.0, -math.inf, -math.inf, 0.0]]), dim=-1)
    assert entropy_from_log_probs(log_probs).tolist() == pytest.approx([math.log(2)])


def test_policy_loss_total_and_metrics():
    log_prob = torch.tensor([[math.log(1.5), 0.0], [math.log(0.5), 0.0]])
    old = torch.zeros(2, 2)
    advantages = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    ref = torch.tensor([[0.0, 0.0], [0.0, 0.0]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    config = PolicyLossConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    loss, metrics = policy_loss(log_prob, old, advantages, mask, config, ref_log_prob=ref, entropy=entropy)
    # per-token pg: seq0 [-1.2 (clipped), -1.0]; seq1 [0.8 (clipped)] -> token mean (-1.4) / 3
    pg = (-1.2 - 1.0 + 0.8) / 3
    kl = (math.log(1.5) + 0 + math.log(0.5)) / 3
    ent = (1 + 2 + 3) / 3
    assert metrics["pg_loss"] == pytest.approx(pg)
    assert metrics["kl"] == pytest.approx(kl)
    assert metrics["entropy"] == pytest.approx(ent)
    assert loss.item() == pytest.approx(pg + 0.1 * kl - 0.01 * ent)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["pg_clipfrac_lower"] == 0.0
    assert metrics["approx_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5)) / 3)


def test_truncated_is_weights_hand_values():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5]])
    # exp(0.5) = 1.6487 capped at 1.5; exp(-1) = 0.3679 (never raised); equal log-probs give 1
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0]])
    assert torch.allclose(truncated_is_weights(old, rollout, cap=1.5), expected)
    assert torch.allclose(truncated_is_weights(old, rollout, cap=2.0)[0, 0], torch.tensor(math.exp(0.5)))
    with pytest.raises(ValueError, match="cap must be >= 1"):
        truncated_is_weights(old, rollout, cap=0.5)


def test_token_weights_scale_only_the_policy_term():
    log_prob = torch.zeros(1, 2, requires_grad=True)
    mask = torch.ones(1, 2)
    ref = torch.tensor([[0.5, 0.5]])
    config = PolicyLossConfig(kl_coef=0.1, kl_estimator="k1")
    weights = torch.tensor([[2.0, 0.5]])
    loss, metrics = policy_loss(
        log_prob, torch.zeros(1, 2), torch.tensor([1.0]), mask, config, ref_log_prob=ref, token_weights=weights
    )
    # ratio 1: per-token pg = -A * w = [-2, -0.5] -> mean -1.25; k1 KL = mean(0 - 0.5) = -0.5, unweighted
    assert metrics["pg_loss"] == pytest.approx(-1.25)
    assert loss.item() == pytest.approx(-1.25 + 0.1 * -0.5)
    loss.backward()  # d(pg)/d(logp) = -A * w * ratio / 2 tokens; d(KL)/d(logp) = 0.1 / 2
    assert torch.allclose(log_prob.grad, torch.tensor([[-1.0 + 0.05, -0.25 + 0.05]]))
    with pytest.raises(ValueError, match="token_weights"):
        policy_loss(log_prob, torch.zeros(1, 2), torch.tensor([1.0]), mask, token_weights=torch.ones(2))


def test_policy_loss_requires_inputs_its_terms_need():
    args = (torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1))
    with pytest.raises(ValueError, match="kl_coef > 0 needs ref_log_prob"):
        policy_loss(*args, PolicyLossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the per-token entropy"):
        policy_loss(*args, PolicyLossConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="mask"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 1))
    with pytest.raises(ValueError, match=r"advantages must be a float, \[B\] or \[B, T\]"):
        policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(3), torch.ones(2, 2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"eps_low": -0.1}, "eps_low must be a finite number >= 0"),
        ({"eps_low": 1.0}, "eps_low must be < 1"),
        ({"eps_low": 1.5, "policy_loss": "cispo"}, "eps_low must be < 1"),
        ({"policy_loss": "grpo"}, "policy_loss must be one of"),
        ({"policy_loss": "gspo"}, "policy_loss 'gspo' is sequence-level.*loss_agg_mode 'token-mean'"),
        ({"dual_clip_c": 1.0}, "dual_clip_c must be > 1 or null"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode must be one of"),
        ({"kl_estimator": "k9"}, "kl_estimator must be one of"),
        ({"max_response_len": 0}, "max_response_len must be >= 1"),
        ({"rollout_is_cap": 0.9}, "rollout_is_cap must be >= 1 or null"),
        ({"kl_coef": float("nan")}, "kl_coef must be a finite number"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**kwargs)
