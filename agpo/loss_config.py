"""The policy loss's settings (``PolicyLossConfig``) and the names of its surrogates, aggregation modes and
KL estimators.

The loss itself is in agpo.losses and agpo.surrogates (each checks its mode against these names); this module
needs no torch, so configs validate without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice, require_non_negative

SURROGATES = ("ppo", "gspo", "cispo")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "k2", "k3")


@dataclass(frozen=True)
class PolicyLossConfig:
    """Hyper-parameters of the policy loss. Defaults are verl's; the DAPO preset uses eps_high = 0.28."""

    policy_loss: str = field(
        default="ppo",
        metadata={
            "help": f"per-token surrogate, one of {list(SURROGATES)}: ppo (clipped token ratio), gspo (clipped "
            "sequence ratio, Zheng et al. 2025; needs a seq-mean-* loss_agg_mode), cispo (clipped importance weight "
            "on logp, MiniMax-M1); they differ only once the policy moved, i.e. with optimizer.ppo_epochs > 1"
        },
    )
    eps_low: float = field(
        default=0.2,
        metadata={
            "help": "lower clip range: ratio >= 1 - eps_low (cispo: 1 is no lower bound; adaptive_agpo with "
            "eps_high > eps_low needs it > 0, it keeps their ratio)"
        },
    )
    eps_high: float = field(default=0.2, metadata={"help": "upper clip range: ratio <= 1 + eps_high (DAPO 0.28)"})
    dual_clip_c: float | None = field(
        default=3.0, metadata={"help": "dual-clip bound for negative advantages (> 1); null disables it"}
    )
    loss_agg_mode: str = field(
        default="token-mean", metadata={"help": f"loss aggregation, one of {list(AGGREGATION_MODES)}"}
    )
    max_response_len: int | None = field(
        default=None,
        metadata={
            "help": "length normaliser L of seq-mean-token-sum-norm; null: the trainer's rollout.max_new_tokens, a "
            "constant of the run as in Dr.GRPO (policy_loss called on its own: the rows' padded width)"
        },
    )
    kl_coef: float = field(default=0.0, metadata={"help": "weight of KL(pi || pi_ref); 0 loads no reference model"})
    kl_estimator: str = field(default="k3", metadata={"help": f"KL estimator, one of {list(KL_ESTIMATORS)}"})
    entropy_coef: float = field(default=0.0, metadata={"help": "weight of the entropy bonus"})
    rollout_is_cap: float | None = field(
        default=None,
        metadata={
            "help": "rollout correction (truncated importance sampling): weight each token's policy loss by "
            "min(pi_old / pi_rollout, cap), pi_rollout being the engine's probability; null: off"
        },
    )

    def __post_init__(self) -> None:
        require_non_negative(
            eps_low=self.eps_low, eps_high=self.eps_high, kl_coef=self.kl_coef, entropy_coef=self.entropy_coef
        )
        require_choice("policy_loss", self.policy_loss, SURROGATES)
        if self.eps_low > 1 or (self.eps_low == 1 and self.policy_loss != "cispo"):
            raise ValueError(
                f"eps_low must be < 1 (the ratio's lower bound 1 - eps_low must stay > 0; cispo allows 1, no lower "
                f"bound), got {self.eps_low}"
            )
        if self.dual_clip_c is not None and not self.dual_clip_c > 1:
            raise ValueError(f"dual_clip_c must be > 1 or null, got {self.dual_clip_c!r}")
        require_choice("loss_agg_mode", self.loss_agg_mode, AGGREGATION_MODES)
        if self.policy_loss == "gspo" and self.loss_agg_mode == "token-mean":
            raise ValueError(
                "policy_loss 'gspo' is sequence-level (one ratio per sequence) and loss_agg_mode 'token-mean' weighs "
                "each sequence by its length, as verl refuses; set loss_agg_mode to seq-mean-token-mean (GSPO's) or "
                "another seq-mean-* mode"
            )
        require_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        if self.rollout_is_cap is not None and not self.rollout_is_cap >= 1:
            raise ValueError(f"rollout_is_cap must be >= 1 or null, got {self.rollout_is_cap!r}")
        if self.max_response_len is not None and self.max_response_len < 1:
            raise ValueError(f"max_response_len must be >= 1 or null, got {self.max_response_len!r}")
