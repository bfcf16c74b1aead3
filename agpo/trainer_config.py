"""The RL trainer's settings (``TrainerConfig``): one frozen dataclass, a help text on every field.

Presets in configs/ set these per algorithm; ``__post_init__`` rejects a bad value with its key. The policy
loss (``loss``) and the adaptive AGPO controllers (``adaptive``) have configs of their own, nested here.
Like them, this module needs no torch, so a stage's config resolves and validates without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.adaptive_config import ADAPTIVE_AGPO, AdaptiveConfig, algorithm_names, require_clip_pair_with_a_ratio
from agpo.checks import require_choice, require_int, require_ints, require_positive
from agpo.estimator_params import validate_estimator_params
from agpo.loss_config import PolicyLossConfig
from agpo.lr_schedule import SCHEDULES

SHORT_BATCH = ("log", "raise")  # dynamic sampling with refill rounds spent: train on fewer groups, or stop


# RLTrainer.step's metrics measured by the wall clock: the only ones a resumed or repeated run may change.
TIMING_METRICS = (
    "time_rollout",
    "time_reward",
    "time_update",
    "time_logprobs",
    "time_forward_backward",
    "time_optimizer",
    "time_step",
    "tokens_per_s",
)


@dataclass(frozen=True)
class TrainerConfig:
    """RL trainer settings. Presets in configs/ set these per algorithm."""

    algorithm: str = field(default="agpo", metadata={"help": "advantage estimator name, or adaptive_agpo"})
    advantage_params: dict[str, object] = field(
        default_factory=dict, metadata={"help": "estimator parameters, e.g. {lambda_neg: 0.5, lambda_pos: 1.0}"}
    )
    group_size: int = field(default=8, metadata={"help": "G, responses sampled per prompt"})
    prompts_per_step: int = field(default=8, metadata={"help": "prompts per training step"})
    max_steps: int = field(default=60, metadata={"help": "training steps (the run also stops at token_budget)"})
    token_budget: int | None = field(
        default=None, metadata={"help": "stop once this many tokens were generated (probes count); null: no cap"}
    )
    ppo_epochs: int = field(default=1, metadata={"help": "optimizer steps per rollout batch"})
    micro_batch_size: int = field(default=32, metadata={"help": "sequences per forward/backward pass"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})
    trainable_layers: int = field(
        default=0,
        metadata={"help": "train only the top N decoder layers (the rest stays frozen: a cheaper backward); 0: all"},
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lr_schedule: str = field(default="constant", metadata={"help": f"one of {list(SCHEDULES)}"})
    warmup_steps: int = field(default=0, metadata={"help": "linear LR warm-up steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "sampling temperature of the training responses (adaptive_agpo ignores it: it probes at "
            "adaptive.tau_base and sets each prompt's temperature around it)"
        },
    )
    max_new_tokens: int = field(default=32, metadata={"help": "longest response in tokens"})
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "DAPO: drop groups whose verifiable scores are all equal and refill from new prompts"},
    )
    max_refill_rounds: int = field(default=3, metadata={"help": "dynamic sampling: extra generation rounds"})
    dynamic_sampling_short_batch: str = field(
        default="log",
        metadata={
            "help": "dynamic sampling, refill rounds spent short of prompts_per_step groups: "
            f"one of {list(SHORT_BATCH)} (log: train on the smaller batch, metric dynamic_sampling_short_batch = 1; "
            "raise: stop with an error)"
        },
    )
    overlong_buffer: int = field(
        default=0, metadata={"help": "DAPO soft overlong penalty over the last N tokens before max_new_tokens; 0 off"}
    )
    overlong_penalty: float = field(default=1.0, metadata={"help": "largest overlong penalty (reward units)"})
    mask_truncated: bool = field(
        default=False, metadata={"help": "exclude responses cut at max_new_tokens from the loss"}
    )
    correct_threshold: float = field(
        default=1.0,
        metadata={
            "help": "verifiable score (before the overlong penalty) at or above which a response is correct: for the "
            "accuracy metrics and the correct/wrong split of agpo and w_reinforce alike"
        },
    )
    eval_every: int = field(default=10, metadata={"help": "steps between evaluations (0: only at start and end)"})
    seed: int = field(default=0, metadata={"help": "seed of prompt order and sampling"})
    checkpoint_every: int = field(
        default=0, metadata={"help": "steps between checkpoints (also one at the end); 0: no checkpoints"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "newest checkpoints kept on disk"})
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig, metadata={"help": "policy loss"})
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig, metadata={"help": "adaptive AGPO controllers"})

    def __post_init__(self) -> None:
        if self.algorithm not in algorithm_names():
            raise ValueError(f"unknown algorithm {self.algorithm!r}; known: {', '.join(algorithm_names())}")
        if self.algorithm != ADAPTIVE_AGPO:
            validate_estimator_params(self.algorithm, self.advantage_params)
            if "correct_threshold" in self.advantage_params:
                raise ValueError(
                    f"advantage_params.correct_threshold ({self.advantage_params['correct_threshold']!r}): set trainer "
                    "correct_threshold instead; one threshold decides correct vs wrong for the accuracy metrics and "
                    "the estimator alike"
                )
        elif self.advantage_params:
            raise ValueError("adaptive_agpo uses its own advantage; advantage_params must be empty")
        if self.algorithm == ADAPTIVE_AGPO:
            require_clip_pair_with_a_ratio(self.loss.eps_low, self.loss.eps_high)
        positive = ("group_size", "prompts_per_step", "max_steps", "ppo_epochs", "micro_batch_size", "max_new_tokens")
        require_ints(self, positive, 1)
        at_least_zero = ("warmup_steps", "max_refill_rounds", "overlong_buffer", "eval_every", "checkpoint_every")
        require_ints(self, (*at_least_zero, "trainable_layers"), 0)
        require_int("keep_checkpoints", self.keep_checkpoints, 1)
        if self.token_budget is not None:
            require_int("token_budget", self.token_budget, 1)
        require_positive(learning_rate=self.learning_rate)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        require_choice("lr_schedule", self.lr_schedule, SCHEDULES)
        require_choice("dynamic_sampling_short_batch", self.dynamic_sampling_short_batch, SHORT_BATCH)
        if self.overlong_buffer >= self.max_new_tokens:
            raise ValueError(
                f"overlong_buffer ({self.overlong_buffer}) must be smaller than max_new_tokens ({self.max_new_tokens})"
            )

    @property
    def adaptive_mode(self) -> bool:
        return self.algorithm == ADAPTIVE_AGPO
