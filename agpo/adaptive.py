"""Adaptive AGPO controllers (docs/algorithms.md section 3; "AGPO: Adaptive Group Policy Optimization with Dual
Statistical Feedback", read from its public implementation).

Per prompt, G *probe* responses sampled at tau_base give statistics only (no gradient):
    sigma_probe  dispersion of the probe rewards: Bessel std | MAD * 1.4826 | IQR / 1.349
    H_vote       Shannon entropy (nats) of the extracted final answers; an unparseable answer votes for its
                 own stripped text (:func:`vote_keys`), so different unparseable answers do not pool
    kappa3       adjusted Fisher-Pearson skewness of the probe rewards, clipped to +/-10, 0 when flat
Two controllers share that state:
    temperature  U = w_r*sigma + w_e*H_vote + w_k*|kappa3|; c = (U - m) / (m + 1e-8) against a running
                 baseline m <- rate*U + (1 - rate)*m, re-seeded (m = U, c = 0) while m <= 1e-8;
                 tau = clip(tau_base * (1 + lambda_T * c), tau_min, tau_max)
    clip range   eps = clip(eps_base * clip(H_pol / H_ref, 0.5, 1.5) * (1 + delta*H_vote)
                        / (1 + alpha*sigma + gamma*KL_step_ema + zeta*|kappa3|), eps_min, eps_max)
with H_pol the old policy's mean token entropy on each prompt group's rollouts (at their sampling
temperature) and H_ref the EMA of the batch mean of H_pol over groups, updated once per step and re-seeded
(H_ref = that mean) while H_ref <= 1e-8, as the baseline m is. KL_step is taken once per step over the whole
batch: per prompt group max(0, mean token log-ratio logp_old - logp_new), then the mean over groups;
KL_step_ema takes it in once per step. The adaptive eps replaces the symmetric clip; with clip-higher
configured (eps_high > eps_low) the ratio is kept: (eps, eps * eps_high / eps_low) (:func:`clip_bounds`).
All state is a plain dict (see ``state_dict``), so it travels in checkpoints. The trainer drives the
controllers through the step hooks of agpo.hooks (AdaptiveHooks).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from agpo.adaptive_config import ADAPTIVE_AGPO, DISPERSIONS, AdaptiveConfig
from agpo.advantages import GroupIndex
from agpo.checks import require_choice

# Its training advantage: GRPO normalised by max(std, 1e-8) instead of std + 1e-6 (paper implementation).
ADAPTIVE_ADVANTAGE: tuple[str, dict[str, object]] = ("grpo", {"eps": 1e-8, "eps_mode": "max"})
UNCERTAINTY_FLOOR = 1e-8


def advantage_rule(algorithm: str, params: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The estimator and parameters an algorithm trains with (adaptive AGPO brings its own)."""
    return ADAPTIVE_ADVANTAGE if algorithm == ADAPTIVE_AGPO else (algorithm, params)


SKEW_SIGMA_MIN = 1e-6
SKEW_CLIP = 10.0


@dataclass(frozen=True)
class ProbeStats:
    """Statistics of one prompt's probe group."""

    dispersion: float
    vote_entropy: float
    skewness: float


def reward_dispersion(rewards: torch.Tensor, mode: str = "std") -> float:
    """sigma_probe: Bessel-corrected std, MAD * 1.4826 or IQR / 1.349 of ``rewards`` (0 for < 2 values)."""
    require_choice("dispersion", mode, DISPERSIONS)
    values = rewards.to(torch.float64)
    if values.numel() < 2:
        return 0.0
    if mode == "std":
        return float(values.std(unbiased=True))
    if mode == "mad":
        median = values.quantile(0.5)
        return float(1.4826 * (values - median).abs().quantile(0.5))
    return float((values.quantile(0.75) - values.quantile(0.25)) / 1.349)


UNPARSED = "unparsed"


def vote_keys(answers: Sequence[Hashable | None], texts: Sequence[str]) -> list[Hashable]:
    """What each probe response votes for in H_vote: its extracted answer, or for an unparseable one (None)
    ("unparsed", its stripped text), which no parsed answer equals."""
    if len(answers) != len(texts):
        raise ValueError(f"need one response text per answer, got {len(texts)} texts for {len(answers)} answers")
    return [(UNPARSED, text.strip()) if a is None else a for a, text in zip(answers, texts, strict=True)]


def vote_entropy(answers: Sequence[Hashable]) -> float:
    """Shannon entropy (nats) of the distribution of ``answers`` (the probe group's :func:`vote_keys`)."""
    if not answers:
        return 0.0
    counts = torch.tensor(list(Counter(answers).values()), dtype=torch.float64)
    probs = counts / counts.sum()
    return float(-(probs * probs.log()).sum())


def adjusted_skewness(rewards: torch.Tensor) -> float:
    """Adjusted Fisher-Pearson skewness G1 = sqrt(n(n-1))/(n-2) * m3 / m2^1.5, clipped to +/-10.

    0 when n < 3 or the population std is below 1e-6 (a flat group has no shape).
    """
    values = rewards.to(torch.float64)
    n = values.numel()
    if n < 3:
        return 0.0
    centered = values - values.mean()
    m2 = centered.square().mean()
    if math.sqrt(m2) < SKEW_SIGMA_MIN:
        return 0.0
    g1 = centered.pow(3).mean() / m2.pow(1.5)
    adjusted = math.sqrt(n * (n - 1)) / (n - 2) * float(g1)
    return max(-SKEW_CLIP, min(SKEW_CLIP, adjusted))


def probe_statistics(
    rewards: torch.Tensor | Sequence[float], answers: Sequence[Hashable], dispersion: str = "std"
) -> ProbeStats:
    """sigma_probe, H_vote and kappa3 of one prompt's probe group (``answers``: its vote keys)."""
    rewards_t = torch.as_tensor(rewards, dtype=torch.float64)
    if rewards_t.dim() != 1 or rewards_t.numel() != len(answers):
        raise ValueError(
            f"probe rewards must be 1-D with one reward per answer, got shape {tuple(rewards_t.shape)} "
            f"and {len(answers)} answers"
        )
    return ProbeStats(
        dispersion=reward_dispersion(rewards_t, dispersion),
        vote_entropy=vote_entropy(answers),
        skewness=adjusted_skewness(rewards_t),
    )


def group_probe_statistics(
    rewards: Sequence[float], answers: Sequence[Hashable], group_size: int, dispersion: str = "std"
) -> list[ProbeStats]:
    """``probe_statistics`` of each consecutive group of ``group_size`` probes (prompt-major order)."""
    if len(rewards) != len(answers) or len(rewards) % group_size:
        raise ValueError(
            f"need equal numbers of rewards and answers, a multiple of group_size {group_size}; "
            f"got {len(rewards)} and {len(answers)}"
        )
    return [
        probe_statistics(rewards[i : i + group_size], answers[i : i + group_size], dispersion)
        for i in range(0, len(rewards), group_size)
    ]


def group_token_means(
    values: Sequence[torch.Tensor], masks: Sequence[torch.Tensor], groups: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per prompt group [P]: the mean of ``values`` over its response tokens (0 without any) and its token
    count. ``values`` and ``masks`` are micro-batches [b, T] (widths may differ) whose rows, in order, are the
    rows of ``groups``: the result does not depend on how the batch was cut into micro-batches."""
    row_sums = torch.cat([(v.to(torch.float64) * m).sum(-1) for v, m in zip(values, masks, strict=True)])
    tokens = groups.sum(torch.cat([m.sum(-1) for m in masks]).to(torch.float64))
    return groups.sum(row_sums) / tokens.clamp(min=1), tokens


def mean_over_groups(
    values: torch.Tensor, tokens: torch.Tensor, all_reduce_sum: Callable[[list[float]], list[float]] = list
) -> float:
    """The mean of per-group ``values`` [P] over the groups that have a token, over every rank
    (``all_reduce_sum`` adds [sum, count] over data-parallel ranks); 0 when no group has one."""
    has_tokens = tokens > 0
    total, count = all_reduce_sum([float(values[has_tokens].sum()), float(has_tokens.sum())])
    return total / count if count else 0.0


def clip_bounds(eps: torch.Tensor, eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(eps_low, eps_high) from the adaptive eps and the loss config's pair: eps for both, or with clip-higher
    configured (eps_high > eps_low) eps and eps * eps_high / eps_low, so the configured ratio is kept."""
    return eps, (eps * (eps_high / eps_low) if eps_high > eps_low else eps)


class ExponentialAverage:
    """value <- rate * x + (1 - rate) * value; the first observation (or any while the value is still
    <= ``floor``) sets the value directly."""

    def __init__(self, rate: float, floor: float | None = None) -> None:
        self.rate = rate
        self.floor = floor
        self.value: float | None = None

    def needs_seed(self) -> bool:
        return self.value is None or (self.floor is not None and self.value <= self.floor)

    def update(self, x: float) -> float:
        self.value = x if self.needs_seed() else self.rate * x + (1 - self.rate) * self.value
        return self.value


class AdaptiveController:
    """Temperature and clip-range controllers of adaptive AGPO, driven by probe statistics."""

    def __init__(self, config: AdaptiveConfig = AdaptiveConfig()) -> None:
        self.config = config
        # The reference implementation re-seeds the baseline while it is ~0, so that a first, fully
        # certain prompt (U = 0) does not make every later c explode.
        self.uncertainty_baseline = ExponentialAverage(config.baseline_rate, floor=UNCERTAINTY_FLOOR)
        # Likewise H_ref: a first step without an unmasked token (batch H_pol 0) must not pin H_pol / H_ref at its
        # upper bound for the ~110 steps a 0.01-rate EMA takes to climb from 0.
        self.entropy_ref = ExponentialAverage(config.entropy_ref_rate, floor=UNCERTAINTY_FLOOR)
        self.step_kl_ema = 0.0

    def uncertainty(self, stats: ProbeStats) -> float:
        c = self.config
        return c.w_r * stats.dispersion + c.w_e * stats.vote_entropy + c.w_k * abs(stats.skewness)

    def temperature(self, stats: ProbeStats) -> float:
        """tau for one prompt; updates the running uncertainty baseline (call once per prompt, in order)."""
        c = self.config
        u = self.uncertainty(stats)
        if self.uncertainty_baseline.needs_seed():
            centred = 0.0
        else:
            m = self.uncertainty_baseline.value
            centred = (u - m) / (m + UNCERTAINTY_FLOOR)
        self.uncertainty_baseline.update(u)
        return min(c.tau_max, max(c.tau_min, c.tau_base * (1 + c.lambda_T * centred)))

    def temperatures(self, stats: Sequence[ProbeStats]) -> list[float]:
        return [self.temperature(s) for s in stats]

    def entropy_ratio(self, policy_entropy: float, entropy_ref: float) -> float:
        """clip(H_pol / H_ref, entropy_ratio_min, entropy_ratio_max), both floored at 1e-8."""
        c = self.config
        ratio = max(policy_entropy, UNCERTAINTY_FLOOR) / (max(entropy_ref, UNCERTAINTY_FLOOR) + UNCERTAINTY_FLOOR)
        return min(c.entropy_ratio_max, max(c.entropy_ratio_min, ratio))

    def clip_eps(
        self, stats: Sequence[ProbeStats], policy_entropies: Sequence[float], batch_entropy: float
    ) -> torch.Tensor:
        """Per-group clip range [P] from each group's probe statistics and H_pol (``policy_entropies``).

        The entropy ratios use H_ref from before this step (the first step, and any step while H_ref is still
        <= 1e-8, seeds it with ``batch_entropy``); then H_ref takes in ``batch_entropy``, the step's mean of H_pol
        over groups (call once per step).
        """
        c = self.config
        h_ref = batch_entropy if self.entropy_ref.needs_seed() else self.entropy_ref.value
        self.entropy_ref.update(batch_entropy)
        eps = [
            c.eps_base
            * self.entropy_ratio(h_pol, h_ref)
            * (1 + c.delta * s.vote_entropy)
            / (1 + c.alpha * s.dispersion + c.gamma * self.step_kl_ema + c.zeta * abs(s.skewness))
            for s, h_pol in zip(stats, policy_entropies, strict=True)
        ]
        return torch.tensor(eps, dtype=torch.float32).clamp(c.eps_min, c.eps_max)

    def observe_step_kl(self, step_kl: float) -> float:
        """After a step's update: fold KL_step (the mean over prompt groups of max(0, mean token log-ratio),
        taken once over the whole batch) into KL_step_ema; returns the EMA. Call once per step."""
        self.step_kl_ema = self.config.kl_ema_rate * step_kl + (1 - self.config.kl_ema_rate) * self.step_kl_ema
        return self.step_kl_ema

    def state_dict(self) -> dict[str, float | None]:
        return {
            "uncertainty_baseline": self.uncertainty_baseline.value,
            "entropy_ref": self.entropy_ref.value,
            "step_kl_ema": self.step_kl_ema,
        }

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        expected = {"uncertainty_baseline", "entropy_ref", "step_kl_ema"}
        if set(state) != expected:
            raise ValueError(f"adaptive controller state must have keys {sorted(expected)}, got {sorted(state)}")
        self.uncertainty_baseline.value = state["uncertainty_baseline"]
        self.entropy_ref.value = state["entropy_ref"]
        self.step_kl_ema = float(state["step_kl_ema"])
