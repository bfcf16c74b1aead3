"""The adaptive AGPO controllers' settings (``AdaptiveConfig``) and the algorithm names a trainer accepts.

The controllers themselves are in agpo.adaptive; this module needs no torch, so configs validate without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice, require_non_negative, require_positive
from agpo.estimator_params import available_estimators

ADAPTIVE_AGPO = "adaptive_agpo"
DISPERSIONS = ("std", "mad", "iqr")


def algorithm_names() -> list[str]:
    """Every advantage estimator, plus ``adaptive_agpo``."""
    return [*available_estimators(), ADAPTIVE_AGPO]


def require_clip_pair_with_a_ratio(eps_low: float, eps_high: float) -> None:
    """Adaptive AGPO keeps the loss config's clip-higher ratio eps_high / eps_low around its adaptive eps
    (agpo.adaptive.clip_bounds): with eps_high > eps_low that ratio needs eps_low > 0. (eps_low = 0 is a defined
    clip for the plain losses, a ratio bounded below by 1; only this ratio is undefined.)"""
    if eps_low == 0 and eps_high > eps_low:
        raise ValueError(
            f"loss.eps_low = {eps_low} with loss.eps_high = {eps_high}: adaptive_agpo keeps the ratio "
            "eps_high / eps_low of the configured clip pair around its adaptive eps, undefined at eps_low 0; set "
            "loss.eps_low > 0 (e.g. 0.2 with eps_high 0.28), or eps_high = eps_low for a symmetric adaptive clip"
        )


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
