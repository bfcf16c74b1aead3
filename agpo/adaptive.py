"""Adaptive AGPO controllers (ALGORITHMS.md section 3; "AGPO: Adaptive Group Policy Optimization with Dual
Statistical Feedback", read from its public implementation).

Per prompt, G *probe* responses sampled at tau_base give statistics only (no gradient):
    sigma_probe  dispersion of the probe rewards: Bessel std | MAD * 1.4826 | IQR / 1.349
    H_vote       Shannon entropy (nats) of the extracted final answers
    kappa3       adjusted Fisher-Pearson skewness of the probe rewards, clipped to +/-10, 0 when flat
Two controllers share that state:
    temperature  U = w_r*sigma + w_e*H_vote + w_k*|kappa3|; c = (U - m) / (m + 1e-8) against a running
                 baseline m <- rate*U + (1 - rate)*m; tau = clip(tau_base * (1 + lambda_T * c), tau_min, tau_max)
    clip range   eps = clip(eps_base * clip(H_pol / H_ref, 0.5, 1.5) * (1 + delta*H_vote)
                        / (1 + alpha*sigma + gamma*KL_step_ema + zeta*|kappa3|), eps_min, eps_max)
with H_pol the policy's mean token entropy on the rollouts, H_ref its EMA, and KL_step_ema the EMA of
max(0, mean(logp_old - logp_new)) after each update. All state is a plain dict (see ``state_dict``), so it
travels in checkpoints. The trainer drives the controllers through the step hooks of agpo.hooks (AdaptiveHooks).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from agpo.advantages import available_estimators
from agpo.checks import require_choice, require_non_negative, require_positive

ADAPTIVE_AGPO = "adaptive_agpo"
# Its training advantage: GRPO normalised by max(std, 1e-8) instead of std + 1e-6 (paper implementation).
ADAPTIVE_ADVANTAGE: tuple[str, dict[str, object]] = ("grpo", {"eps": 1e-8, "eps_mode": "max"})
UNCERTAINTY_FLOOR = 1e-8


def algorithm_names() -> list[str]:
    """Every registered advantage estimator, plus ``adaptive_agpo``."""
    return [*available_estimators(), ADAPTIVE_AGPO]


def advantage_rule(algorithm: str, params: dict[str, object]) -> tuple[str, dict[str, object]]:
    """The estimator and parameters an algorithm trains with (adaptive AGPO brings its own)."""
    return ADAPTIVE_ADVANTAGE if algorithm == ADAPTIVE_AGPO else (algorithm, params)


SKEW_SIGMA_MIN = 1e-6
SKEW_CLIP = 10.0
DISPERSIONS = ("std", "mad", "iqr")


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


def vote_entropy(answers: Sequence[Hashable | None]) -> float:
    """Shannon entropy (nats) of the answer distribution; unparseable answers (None) form one category."""
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
    rewards: torch.Tensor | Sequence[float], answers: Sequence[Hashable | None], dispersion: str = "std"
) -> ProbeStats:
    """sigma_probe, H_vote and kappa3 of one prompt's probe group."""
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
    rewards: Sequence[float], answers: Sequence[Hashable | None], group_size: int, dispersion: str = "std"
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


@dataclass(frozen=True)
class AdaptiveConfig:
    """Adaptive AGPO controller settings; defaults are the paper implementation's."""

    tau_base: float = field(default=1.0, metadata={"help": "probe temperature and centre of the adaptive range"})
    lambda_T: float = field(default=0.15, metadata={"help": "temperature gain on centred uncertainty"})
    tau_min: float = field(default=0.5, metadata={"help": "lowest sampling temperature"})
    tau_max: float = field(default=1.5, metadata={"help": "highest sampling temperature"})
    w_r: float = field(default=1.0, metadata={"help": "uncertainty weight of reward dispersion"})
    w_e: float = field(default=1.0, metadata={"help": "uncertainty weight of probe vote entropy"})
    w_k: float = field(default=0.0, metadata={"help": "uncertainty weight of |skewness|"})
    baseline_rate: float = field(default=0.1, metadata={"help": "EMA rate of the running uncertainty baseline"})
    dispersion: str = field(default="std", metadata={"help": f"reward dispersion, one of {list(DISPERSIONS)}"})
    eps_base: float = field(default=0.2, metadata={"help": "clip range before adaptation"})
    eps_min: float = field(default=0.05, metadata={"help": "smallest adaptive clip range"})
    eps_max: float = field(default=0.4, metadata={"help": "largest adaptive clip range"})
    alpha: float = field(default=1.0, metadata={"help": "clip shrink per unit of reward dispersion"})
    gamma: float = field(default=0.5, metadata={"help": "clip shrink per unit of step-KL EMA"})
    delta: float = field(default=0.1, metadata={"help": "clip growth per nat of probe vote entropy"})
    zeta: float = field(default=0.0, metadata={"help": "clip shrink per unit of |skewness|"})
    entropy_ratio_min: float = field(default=0.5, metadata={"help": "lower bound of H_pol / H_ref"})
    entropy_ratio_max: float = field(default=1.5, metadata={"help": "upper bound of H_pol / H_ref"})
    entropy_ref_rate: float = field(default=0.01, metadata={"help": "EMA rate of the reference entropy H_ref"})
    kl_ema_rate: float = field(default=0.1, metadata={"help": "EMA rate of the step KL"})

    def __post_init__(self) -> None:
        require_positive(tau_base=self.tau_base, tau_min=self.tau_min, eps_base=self.eps_base, eps_min=self.eps_min)
        require_non_negative(
            lambda_T=self.lambda_T,
            w_r=self.w_r,
            w_e=self.w_e,
            w_k=self.w_k,
            alpha=self.alpha,
            gamma=self.gamma,
            delta=self.delta,
            zeta=self.zeta,
            entropy_ratio_min=self.entropy_ratio_min,
        )
        for key, low, high in (
            ("tau", self.tau_min, self.tau_max),
            ("eps", self.eps_min, self.eps_max),
            ("entropy_ratio", self.entropy_ratio_min, self.entropy_ratio_max),
        ):
            if not low <= high:
                raise ValueError(f"{key}_min must be <= {key}_max, got {low} > {high}")
        for key in ("baseline_rate", "entropy_ref_rate", "kl_ema_rate"):
            rate = getattr(self, key)
            if not 0 < rate <= 1:
                raise ValueError(f"{key} must be in (0, 1], got {rate!r}")
        require_choice("dispersion", self.dispersion, DISPERSIONS)


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
        self.entropy_ref = ExponentialAverage(config.entropy_ref_rate)
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

    def clip_eps(self, stats: Sequence[ProbeStats], policy_entropy: float) -> torch.Tensor:
        """Per-prompt clip range [P] given the policy's mean token entropy on this step's rollouts.

        The entropy ratio uses H_ref from before this step; then H_ref takes in ``policy_entropy``.
        """
        c = self.config
        h_ref = self.entropy_ref.value if self.entropy_ref.value is not None else policy_entropy
        ratio = max(policy_entropy, UNCERTAINTY_FLOOR) / (max(h_ref, UNCERTAINTY_FLOOR) + UNCERTAINTY_FLOOR)
        ratio = min(c.entropy_ratio_max, max(c.entropy_ratio_min, ratio))
        self.entropy_ref.update(policy_entropy)
        eps = [
            c.eps_base
            * ratio
            * (1 + c.delta * s.vote_entropy)
            / (1 + c.alpha * s.dispersion + c.gamma * self.step_kl_ema + c.zeta * abs(s.skewness))
            for s in stats
        ]
        return torch.tensor(eps, dtype=torch.float32).clamp(c.eps_min, c.eps_max)

    def observe_step_kl(self, old_log_prob: torch.Tensor, new_log_prob: torch.Tensor, mask: torch.Tensor) -> float:
        """After an update: KL_step = max(0, token mean of logp_old - logp_new); fold it into the EMA."""
        mask = mask.to(old_log_prob.dtype)
        kl = float(((old_log_prob - new_log_prob) * mask).sum() / mask.sum().clamp(min=1))
        kl = max(0.0, kl)
        self.step_kl_ema = self.config.kl_ema_rate * kl + (1 - self.config.kl_ema_rate) * self.step_kl_ema
        return kl

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
