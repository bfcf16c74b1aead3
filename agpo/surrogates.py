"""Per-token policy-gradient surrogates: PPO's clipped ratio, GSPO's sequence ratio, CISPO's clipped weight.

Each maps log_prob, old_log_prob and mask [B, T] and advantages [B] (broadcast over tokens) or [B, T] to
per-token losses l, which agpo.losses reduces with the configured aggregation. ``eps_low`` / ``eps_high``
are floats or per-sequence tensors [B] (adaptive AGPO clips each prompt's responses with its own range).
With rho_t = exp(clamp(logp_t - logp_old_t, -20, 20)) and sg() a stop-gradient:

    ppo    l_t = max(-A * rho_t, -A * clip(rho_t, 1 - eps_low, 1 + eps_high))        (docs/algorithms.md section 2)
           if A < 0 and dual_clip_c is set: l_t = min(l_t, -A * dual_clip_c)       (dual clip, Ye et al. 2020)
    gspo   s = exp(clamp(mean_t(logp_t - logp_old_t), -20, 20)) over the row's response tokens, and
           s_t = sg(s) * exp(logp_t - sg(logp_t)): the value s, the gradient s * grad(logp_t);
           l_t = max(-A * s_t, -A * clip(s_t, 1 - eps_low, 1 + eps_high))          (GSPO-token, Zheng et al. 2025)
    cispo  l_t = -sg(clip(rho_t, 1 - eps_low, 1 + eps_high)) * A * logp_t        (CISPO, MiniMax-M1 2025)

GSPO clips whole sequences: every token of a row shares its ratio, so a row is in or out of the trust
region as one (the paper's ranges are 3e-4 / 4e-4, with the seq-mean-token-mean aggregation; the config
refuses token-mean for it, which would weigh a sequence by its length). CISPO never
drops a token's gradient: the clip bounds the importance weight that scales it (eps_low = 1 is no lower
bound, as MiniMax-M1 runs it). Neither takes the dual clip. CISPO's loss *value* contains logp itself, so
its ``pg_loss`` is not comparable with the other two; the gradients are. At rho = 1 (the first pass over
fresh rollouts) all three have the same gradient, -A * grad(logp_t) per token: the surrogates differ only
once the policy has moved from the one that sampled, i.e. from the second PPO epoch on (``optimizer.ppo_epochs``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True)
class ClippedSurrogate:
    """Per-token surrogate losses and the masks of where each clip was active."""

    losses: torch.Tensor
    clipped: torch.Tensor
    dual_clipped: torch.Tensor
    log_ratio: torch.Tensor


def clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float | torch.Tensor = 0.2,
    eps_high: float | torch.Tensor = 0.2,
    dual_clip_c: float | None = 3.0,
) -> ClippedSurrogate:
    """PPO clipped surrogate per token, with asymmetric clip range and optional dual clip.

    ``advantages`` is [B] (broadcast over tokens) or [B, T]; ``eps_low`` / ``eps_high`` are floats or
    per-sequence tensors [B] (adaptive AGPO clips each prompt's responses with its own range).
    """
    if log_prob.shape != old_log_prob.shape:
        raise ValueError(f"log_prob {tuple(log_prob.shape)} and old_log_prob {tuple(old_log_prob.shape)} differ")
    advantages = _per_token(advantages, log_prob, "advantages")
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    losses, clip_active = _pessimistic_clip(torch.exp(log_ratio), advantages, log_prob, eps_low, eps_high)
    dual_active = torch.zeros_like(clip_active)
    if dual_clip_c is not None:
        dual_bound = -advantages * dual_clip_c
        dual_active = (losses > dual_bound) & (advantages < 0)
        losses = torch.where(advantages < 0, torch.minimum(losses, dual_bound), losses)
    return ClippedSurrogate(losses=losses, clipped=clip_active, dual_clipped=dual_active, log_ratio=log_ratio)


def _pessimistic_clip(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    like: torch.Tensor,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high)) and where the clipped term won."""
    low, high = _ratio_bounds(eps_low, eps_high, like)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, low, high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def _ratio_bounds(
    eps_low: float | torch.Tensor, eps_high: float | torch.Tensor, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ratio's clip range, 1 - eps_low and 1 + eps_high, broadcastable to ``like``."""
    return 1.0 - _per_token(eps_low, like, "eps_low"), 1.0 + _per_token(eps_high, like, "eps_high")


def _per_token(value: float | torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        return torch.tensor(float(value), dtype=like.dtype, device=like.device)
    if value.shape == like.shape:
        return value.to(like.dtype)
    if value.dim() == 1 and value.shape[0] == like.shape[0]:
        return value.to(like.dtype).unsqueeze(-1)
    raise ValueError(f"{name} must be a float, [B] or [B, T] = {tuple(like.shape)}, got {tuple(value.shape)}")


def gspo_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
) -> ClippedSurrogate:
    """GSPO-token: PPO's clip on the sequence ratio s, whose gradient reaches every token (module docstring)."""
    advantages = _per_token(advantages, log_prob, "advantages")
    mask = mask.to(log_prob.dtype)
    token_log_ratio = log_prob - old_log_prob
    seq_log_ratio = (token_log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = seq_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(-1)
    ratio = torch.exp(seq_log_ratio.detach() + log_prob - log_prob.detach())
    losses, clip_active = _pessimistic_clip(ratio, advantages, log_prob, eps_low, eps_high)
    return ClippedSurrogate(
        losses=losses,
        clipped=clip_active,
        dual_clipped=torch.zeros_like(mask, dtype=torch.bool),
        log_ratio=token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP),
    )


def cispo_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
) -> ClippedSurrogate:
    """CISPO: REINFORCE on logp, each token weighted by its clipped, stop-gradient ratio (module docstring)."""
    advantages = _per_token(advantages, log_prob, "advantages")
    low, high = _ratio_bounds(eps_low, eps_high, log_prob)
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio).detach()
    weight = torch.minimum(torch.maximum(ratio, low), high)
    return ClippedSurrogate(
        losses=-weight * advantages * log_prob,
        clipped=(ratio < low) | (ratio > high),
        dual_clipped=torch.zeros_like(ratio, dtype=torch.bool),
        log_ratio=log_ratio,
    )


SurrogateFn = Callable[..., ClippedSurrogate]
POLICY_LOSSES: dict[str, SurrogateFn] = {}  # policy_loss name -> its surrogate (register_policy_loss)


def register_policy_loss(name: str) -> Callable[[SurrogateFn], SurrogateFn]:
    """Register a surrogate under ``name`` (verl's ``register_policy_loss``). It is called as
    ``fn(log_prob, old_log_prob, advantages, mask, *, eps_low, eps_high, dual_clip_c)`` and returns a
    ``ClippedSurrogate``; agpo.loss_config.SURROGATES names the same set for configs that load no torch."""

    def decorator(fn: SurrogateFn) -> SurrogateFn:
        POLICY_LOSSES[name] = fn
        return fn

    return decorator


@register_policy_loss("ppo")
def _ppo(log_prob, old_log_prob, advantages, mask, *, eps_low, eps_high, dual_clip_c) -> ClippedSurrogate:
    return clipped_surrogate(
        log_prob, old_log_prob, advantages, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c
    )


@register_policy_loss("gspo")
def _gspo(log_prob, old_log_prob, advantages, mask, *, eps_low, eps_high, dual_clip_c) -> ClippedSurrogate:
    return gspo_surrogate(log_prob, old_log_prob, advantages, mask, eps_low=eps_low, eps_high=eps_high)


@register_policy_loss("cispo")
def _cispo(log_prob, old_log_prob, advantages, mask, *, eps_low, eps_high, dual_clip_c) -> ClippedSurrogate:
    return cispo_surrogate(log_prob, old_log_prob, advantages, eps_low=eps_low, eps_high=eps_high)


def surrogate(
    mode: str,
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float | torch.Tensor,
    eps_high: float | torch.Tensor,
    dual_clip_c: float | None,
) -> ClippedSurrogate:
    """The per-token losses of the registered surrogate ``mode`` (``POLICY_LOSSES``); ``dual_clip_c`` is ppo's."""
    if log_prob.shape != old_log_prob.shape:
        raise ValueError(f"log_prob {tuple(log_prob.shape)} and old_log_prob {tuple(old_log_prob.shape)} differ")
    if mode not in POLICY_LOSSES:
        raise ValueError(f"unknown policy_loss {mode!r}; known: {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[mode](
        log_prob, old_log_prob, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c
    )
