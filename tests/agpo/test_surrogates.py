"""GSPO and CISPO surrogates against hand-computed values, and where they part from PPO's clip."""

import math

import pytest
import torch

from agpo.losses import PolicyLossConfig, policy_loss
from agpo.surrogates import cispo_surrogate, clipped_surrogate, gspo_surrogate, surrogate

# One response of two tokens (and a masked third): log-ratios 0.2 and 0.0, so the sequence ratio is
# s = exp((0.2 + 0.0) / 2) = exp(0.1) = 1.105171 while token 0's own ratio is exp(0.2) = 1.221403.
LOG_PROB = [[0.2, 0.0, 5.0]]
MASK = torch.tensor([[1.0, 1.0, 0.0]])
S = math.exp(0.1)


def gspo_loss_and_grad(advantage, **config):
    log_prob = torch.tensor(LOG_PROB, requires_grad=True)
    config = PolicyLossConfig(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean", dual_clip_c=None, **config)
    loss, metrics = policy_loss(log_prob, torch.zeros(1, 3), torch.tensor([advantage]), MASK, config)
    loss.backward()
    return loss.item(), log_prob.grad.flatten().tolist(), metrics


def test_gspo_sequence_ratio_inside_the_range_keeps_every_token():
    loss, grad, metrics = gspo_loss_and_grad(1.0)
    assert loss == pytest.approx(-S)  # -A * s, the mean over the row's two tokens
    assert grad == pytest.approx([-S / 2, -S / 2, 0.0])  # d/dlogp_t of -A * s_t / 2; the masked token adds 0
    assert metrics["pg_clipfrac"] == 0.0
    # PPO clips token 0 of the same response (1.2214 > 1.2): it keeps only token 1's gradient
    ppo = clipped_surrogate(torch.tensor(LOG_PROB), torch.zeros(1, 3), torch.tensor([1.0]))
    assert ppo.clipped.flatten().tolist() == [True, False, True]


def test_gspo_clips_the_whole_sequence():
    loss, grad, metrics = gspo_loss_and_grad(1.0, eps_high=0.05)
    assert loss == pytest.approx(-1.05)  # s = 1.105 > 1 + 0.05: both tokens take the clipped value
    assert grad == pytest.approx([0.0, 0.0, 0.0])
    assert metrics["pg_clipfrac"] == 1.0
    loss, grad, _ = gspo_loss_and_grad(-1.0, eps_high=0.05)  # A < 0: the pessimistic max keeps s
    assert loss == pytest.approx(S)
    assert grad == pytest.approx([S / 2, S / 2, 0.0])


def test_gspo_per_sequence_ranges_and_empty_rows():
    log_prob = torch.tensor([[0.2, 0.0], [0.2, 0.0], [9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    out = gspo_surrogate(
        log_prob, torch.zeros(3, 2), torch.ones(3), mask, eps_low=0.2, eps_high=torch.tensor([0.05, 0.2, 0.2])
    )
    assert out.losses[0].tolist() == pytest.approx([-1.05, -1.05])
    assert out.losses[1].tolist() == pytest.approx([-S, -S])
    assert out.losses[2].tolist() == pytest.approx([-1.0, -1.0])  # no tokens: ratio 1, and masked anyway


def test_cispo_clips_the_weight_and_keeps_the_gradient():
    # rho = [exp(0.3), 1]; eps_low 1 (no lower bound), eps_high 0.28: weights [1.28, 1]; A = 2
    log_prob = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    old = torch.tensor([[-0.8, -1.0]])
    out = cispo_surrogate(log_prob, old, torch.tensor([2.0]), eps_low=1.0, eps_high=0.28)
    assert out.losses.flatten().tolist() == pytest.approx([-1.28 * 2 * -0.5, -1.0 * 2 * -1.0])  # [1.28, 2.0]
    assert out.clipped.flatten().tolist() == [True, False]
    out.losses.sum().backward()
    assert log_prob.grad.flatten().tolist() == pytest.approx([-1.28 * 2, -2.0])  # -sg(w) * A
    # PPO drops the gradient of the clipped token; CISPO only bounds its weight
    ppo = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    clipped_surrogate(ppo, old, torch.tensor([2.0])).losses.sum().backward()
    assert ppo.grad.flatten().tolist() == pytest.approx([0.0, -2.0])


def test_cispo_lower_bound():
    log_prob = torch.tensor([[math.log(0.5)]])
    out = cispo_surrogate(log_prob, torch.zeros(1, 1), torch.tensor([-1.0]), eps_low=0.2, eps_high=0.28)
    assert out.losses.item() == pytest.approx(-0.8 * -1.0 * math.log(0.5))  # weight raised to 1 - 0.2
    assert out.clipped.item() is True


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_on_policy_gradient_equals_ppo(mode):
    """At rho = 1 (the first pass over fresh rollouts) every surrogate's gradient is -A * grad(logp_t) (under one
    aggregation; GSPO's is sequence-level)."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(4, 5, generator=generator)
    advantages = torch.randn(4, generator=generator)
    mask = (torch.rand(4, 5, generator=generator) > 0.3).float()
    grads = {}
    for name in ("ppo", mode):
        log_prob = start.clone().requires_grad_(True)
        config = PolicyLossConfig(policy_loss=name, eps_low=0.2, loss_agg_mode="seq-mean-token-mean")
        loss, _ = policy_loss(log_prob, start, advantages, mask, config)
        loss.backward()
        grads[name] = log_prob.grad
    torch.testing.assert_close(grads[mode], grads["ppo"])


def test_unknown_mode_and_shape_mismatch():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2))
    with pytest.raises(ValueError, match="unknown policy_loss 'trpo'"):
        surrogate("trpo", *args, eps_low=0.2, eps_high=0.2, dual_clip_c=None)
    with pytest.raises(ValueError, match=r"log_prob .* and old_log_prob .* differ"):
        surrogate(
            "gspo",
            torch.zeros(1, 2),
            torch.zeros(1, 3),
            torch.ones(1),
            torch.ones(1, 2),
            eps_low=0.2,
            eps_high=0.2,
            dual_clip_c=None,
        )


def test_policy_losses_dispatch_through_one_registry_that_configs_name():
    from agpo.loss_config import SURROGATES
    from agpo.surrogates import POLICY_LOSSES, ClippedSurrogate, register_policy_loss

    assert tuple(POLICY_LOSSES) == SURROGATES  # the torch-free config names exactly the registered losses
    calls = []

    @register_policy_loss("unit-test-loss")
    def recorded(log_prob, old_log_prob, advantages, mask, *, eps_low, eps_high, dual_clip_c):
        calls.append((eps_low, eps_high, dual_clip_c))
        zeros = torch.zeros_like(log_prob, dtype=torch.bool)
        return ClippedSurrogate(losses=-log_prob, clipped=zeros, dual_clipped=zeros, log_ratio=log_prob - old_log_prob)

    try:
        out = surrogate(
            "unit-test-loss",
            torch.ones(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            eps_low=0.1,
            eps_high=0.3,
            dual_clip_c=None,
        )
    finally:
        del POLICY_LOSSES["unit-test-loss"]
    assert calls == [(0.1, 0.3, None)] and out.losses.tolist() == [[-1.0, -1.0]]
