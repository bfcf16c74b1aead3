"""Policy-gradient loss: clipped surrogate, loss aggregation, KL to a reference policy, entropy.

Spec: docs/algorithms.md section 2. Shapes: per-token tensors are [B, T] with a response mask
of the same shape; sequence-level advantages [B] are broadcast over the tokens.

Per token, with rho = exp(clamp(logp - logp_old, -20, 20)), the default surrogate (``policy_loss: ppo``):
    l = max(-A * rho, -A * clip(rho, 1 - eps_low, 1 + eps_high))
    if A < 0 and dual_clip_c is set: l = min(l, -A * dual_clip_c)          (dual clip, Ye et al. 2020)
``policy_loss: gspo`` (sequence-level ratio) and ``cispo`` (clipped importance weight) are in agpo.surrogates.
The per-token losses are reduced by one of the registered aggregation modes (:func:`aggregate`), and
total = pg + kl_coef * KL(pi || pi_ref) - entropy_coef * H(pi).

Aggregation takes global normalisers (:class:`Normalisers`, as verl's ``agg_loss`` does): with N the
unmasked tokens and S the sequences of the *whole* batch, and L the length normaliser,
    token-mean               sum(l * m) / N
    seq-mean-token-mean      sum_i [sum_t(l * m) / sum_t(m)] / S
    seq-mean-token-sum       sum(l * m) / S
    seq-mean-token-sum-norm  sum(l * m) / (S * L)
Every term is a sum over rows divided by a constant of the whole batch, so the losses of the micro-batches
of a batch (on every rank) add up to the loss of the batch taken at once: accumulating their gradients
gives the full-batch gradient, for every mode. A micro-batch never decides what "mean" means.

A *sequence* is a row with at least one unmasked token. A fully masked row (a truncated response under
``dapo.mask_truncated``) adds nothing to any numerator and does not count in S either: it is not part of the
batch the loss averages over. L is the configured ``max_response_len``; the trainer's default is its
``rollout.max_new_tokens`` (Dr.GRPO's constant, the generation limit, the same every step), and a call without
normalisers takes the padded width of its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from agpo.checks import require_non_negative
from agpo.loss_config import AGGREGATION_MODES, KL_ESTIMATORS, PolicyLossConfig
from agpo.surrogates import LOG_RATIO_CLAMP, surrogate

K3_CLAMP = 10.0


@dataclass(frozen=True)
class Normalisers:
    """The whole batch's denominators: summed over micro-batches and data-parallel ranks by the caller.

    ``num_tokens`` unmasked tokens (N), ``num_seqs`` rows with at least one unmasked token (S), ``max_len``
    the length normaliser of ``seq-mean-token-sum-norm`` (L). Counts of 0 divide as 1 (an empty batch has
    loss 0).
    """

    num_tokens: float
    num_seqs: float
    max_len: int

    def __post_init__(self) -> None:
        require_non_negative(num_tokens=self.num_tokens, num_seqs=self.num_seqs)
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")

    @classmethod
    def of(cls, mask: torch.Tensor, max_len: int | None = None) -> Normalisers:
        """The normalisers of ``mask[B, T]`` taken as the whole batch (``max_len`` default: its width T)."""
        return cls(
            num_tokens=float(mask.sum()),
            num_seqs=float((mask.sum(dim=-1) > 0).sum()),
            max_len=mask.shape[-1] if max_len is None else max_len,
        )


AggregationFn = Callable[[torch.Tensor, torch.Tensor, Normalisers], torch.Tensor]
_AGGREGATIONS: dict[str, AggregationFn] = {}


def _register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    def decorator(fn: AggregationFn) -> AggregationFn:
        _AGGREGATIONS[name] = fn
        return fn

    return decorator


@_register_aggregation("token-mean")
def _token_mean(values: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """sum(l * m) / N."""
    return (values * mask).sum() / max(norm.num_tokens, 1.0)


@_register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """Each sequence's token mean, summed, over S (fully masked rows add 0)."""
    per_seq = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_seq.sum() / max(norm.num_seqs, 1.0)


@_register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(values: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """Each sequence's token sum, summed, over S."""
    return (values * mask).sum() / max(norm.num_seqs, 1.0)


@_register_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, norm: Normalisers) -> torch.Tensor:
    """sum(l * m) / (S * L): the length-unbiased Dr.GRPO form."""
    return (values * mask).sum() / (max(norm.num_seqs, 1.0) * norm.max_len)


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_len: int | None = None,
    *,
    normalisers: Normalisers | None = None,
) -> torch.Tensor:
    """Reduce per-token ``values[B, T]`` under ``mask[B, T]`` to a scalar with aggregation ``mode``.

    ``normalisers`` are the whole batch's counts when these rows are a micro-batch of it (the result is then
    this micro-batch's share of the full-batch value); by default the rows are the whole batch
    (:meth:`Normalisers.of`, with ``max_len`` as the length normaliser, default T).
    """
    if mode not in _AGGREGATIONS:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; known modes: {', '.join(AGGREGATION_MODES)}")
    if values.shape != mask.shape or values.dim() != 2:
        raise ValueError(f"values and mask must both be [B, T], got {tuple(values.shape)} and {tuple(mask.shape)}")
    if normalisers is not None and max_len is not None:
        raise ValueError("give max_len inside normalisers, not both")
    mask = mask.to(values.dtype)
    return _AGGREGATIONS[mode](values, mask, normalisers or Normalisers.of(mask, max_len))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """sum(values * mask) over ``num_tokens`` (default: the mask's own count; 0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / max(float(mask.sum()) if num_tokens is None else num_tokens, 1.0)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1 / k2 / k3).

    With d = clamp(logp_ref - logp, -20, 20): k1 = -d, k2 = d^2 / 2, k3 = exp(d) - d - 1 clamped to [-10, 10].
    """
    d = (ref_log_prob - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if estimator == "k1":
        return -d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return (torch.exp(d) - d - 1).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown kl estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy (nats) of the categorical distribution softmax(logits[..., V])."""
    return entropy_from_log_probs(torch.log_softmax(logits.float(), dim=-1))


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """Per-position entropy -sum(p log p) (nats) from the distribution's log-probs ``log_probs[..., V]``.

    p log p is 0 where p = 0 (a -inf log-prob: a masked token), in the value and in the gradient. (The plain
    product is exp(-inf) * -inf = NaN there; ``torch.special.xlogy(p, p)`` has the right value but a NaN
    gradient, 0/0 in its second argument's derivative.)
    """
    probs = log_probs.exp()
    return -(probs * log_probs.masked_fill(probs == 0, 0.0)).sum(dim=-1)


def truncated_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, cap: float) -> torch.Tensor:
    """Rollout correction: ``min(exp(old_log_prob - rollout_log_prob), cap)`` per token, without gradient.

    The engine that sampled (vLLM, bf16 kernels, ...) and the trainer's forward pass give slightly
    different probabilities for the same tokens; the ratio re-weights the sampled tokens to the trainer's
    policy, and the cap bounds the variance (verl's rollout_is_threshold, TRL's importance-sampling cap).
    """
    if cap < 1:
        raise ValueError(f"the importance-sampling cap must be >= 1, got {cap}")
    return torch.exp(old_log_prob.detach() - rollout_log_prob).clamp(max=cap)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig = PolicyLossConfig(),
    *,
    ref_log_prob: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    eps_low: float | torch.Tensor | None = None,
    eps_high: float | torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    normalisers: Normalisers | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss = pg + kl_coef * KL - entropy_coef * H, and a metrics dict.

    ``normalisers``: the whole batch's counts when these rows are one micro-batch of it (see :func:`aggregate`);
    the loss and every metric are then this micro-batch's share of the full-batch value, so their sums over
    micro-batches and ranks are the full-batch loss, gradient and metrics. Default: the rows are the whole
    batch, with the config's ``max_response_len``. ``eps_low`` / ``eps_high`` override the config's clip
    range (floats or per-row tensors). ``ref_log_prob`` is required when ``kl_coef > 0``; ``entropy`` (per
    token, :func:`entropy_from_logits`) when ``entropy_coef > 0``. ``token_weights`` [B, T] multiply each
    token's policy-gradient term (rollout correction, :func:`truncated_is_weights`), not the KL or entropy.

    Metrics: pg_loss, pg_clipfrac (share of tokens where the clip was active), pg_clipfrac_lower (share
    where the dual clip bound was active), approx_kl (token mean of logp_old - logp), and kl / entropy
    when given (aggregated like the loss).
    """
    _check_loss_inputs(log_prob, mask, config, ref_log_prob, entropy, token_weights)
    terms = surrogate(
        config.policy_loss,
        log_prob,
        old_log_prob,
        advantages,
        mask,
        eps_low=config.eps_low if eps_low is None else eps_low,
        eps_high=config.eps_high if eps_high is None else eps_high,
        dual_clip_c=config.dual_clip_c,
    )
    norm = Normalisers.of(mask, config.max_response_len) if normalisers is None else normalisers

    def reduce(values: torch.Tensor) -> torch.Tensor:
        return aggregate(values, mask, config.loss_agg_mode, normalisers=norm)

    pg_loss = reduce(terms.losses if token_weights is None else terms.losses * token_weights)
    loss = pg_loss
    scalars = {"pg_loss": pg_loss}
    if ref_log_prob is not None:
        scalars["kl"] = kl = reduce(kl_penalty(log_prob, ref_log_prob, config.kl_estimator))
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * kl
    if entropy is not None:
        scalars["entropy"] = mean_entropy = reduce(entropy)
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * mean_entropy
    with torch.no_grad():
        for key, values in (
            ("pg_clipfrac", terms.clipped.float()),
            ("pg_clipfrac_lower", terms.dual_clipped.float()),
            ("approx_kl", -terms.log_ratio),
        ):
            scalars[key] = masked_mean(values, mask, norm.num_tokens)
        # one device-to-host copy for all of them (each .item() would wait for the device on its own)
        values = torch.stack([scalar.detach().float() for scalar in scalars.values()]).tolist()
    return loss, dict(zip(scalars, values, strict=True))


def _check_loss_inputs(
    log_prob: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig,
    ref_log_prob: torch.Tensor | None,
    entropy: torch.Tensor | None,
    token_weights: torch.Tensor | None,
) -> None:
    if mask.shape != log_prob.shape:
        raise ValueError(f"mask {tuple(mask.shape)} must match log_prob {tuple(log_prob.shape)}")
    if config.kl_coef > 0 and ref_log_prob is None:
        raise ValueError("kl_coef > 0 needs ref_log_prob (log-probs of the reference policy)")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    if token_weights is not None and token_weights.shape != log_prob.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must match log_prob {tuple(log_prob.shape)}")
