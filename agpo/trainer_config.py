"""The RL trainer's settings (``TrainerConfig``): frozen dataclasses, a help text on every field.

``TrainerConfig`` keeps what describes the run as a whole (``algorithm``, ``seed``, ``max_steps``, ``token_budget``,
``eval_every``) and groups the rest into sections, one per part of a step:

- ``rollout`` (:class:`RolloutConfig`): what is sampled per step: G, prompts, temperature, response length;
- ``advantage`` (:class:`AdvantageConfig`): the estimator's parameters and the correct/wrong threshold;
- ``loss`` (agpo.loss_config.PolicyLossConfig): the policy loss;
- ``adaptive`` (agpo.adaptive_config.AdaptiveConfig): the adaptive AGPO controllers;
- ``dapo`` (:class:`DapoConfig`): DAPO's overlong penalty and filtering and dynamic sampling;
- ``optimizer`` (:class:`OptimizerConfig`): AdamW, the LR schedule, clipping, PPO epochs, micro-batches, the
  trained layers;
- ``checkpoint`` (:class:`CheckpointConfig`): how often checkpoints are written and how many are kept.

Each section's ``__post_init__`` checks its own fields; ``TrainerConfig.__post_init__`` the checks across
sections. ``RENAMED_KEYS`` maps the flat keys of the previous release (``learning_rate``, ``group_size``, ...)
to their sections; the config loader (pipelines.config) reads it through ``TrainerConfig.renamed_keys``, moves
such a key to its new place with a deprecation warning, and refuses a config that sets both. Like the loss and
adaptive configs, this module needs no torch, so a stage's config resolves and validates without loading it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

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
class RolloutConfig:
    """What each step samples."""

    group_size: int = field(default=8, metadata={"help": "G, responses sampled per prompt"})
    prompts_per_step: int = field(default=8, metadata={"help": "prompts per training step"})
    temperature: float = field(
        default=1.0,
        metadata={
            "help": "sampling temperature of the training responses (adaptive_agpo ignores it: it probes at "
            "adaptive.tau_base and sets each prompt's temperature around it)"
        },
    )
    max_new_tokens: int = field(default=32, metadata={"help": "longest response in tokens"})

    def __post_init__(self) -> None:
        require_ints(self, ("group_size", "prompts_per_step", "max_new_tokens"), 1)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")


@dataclass(frozen=True)
class AdvantageConfig:
    """The advantage estimator's settings (the estimator itself is the trainer's ``algorithm``)."""

    params: dict[str, object] = field(
        default_factory=dict,
        metadata={"help": "estimator parameters, e.g. {lambda_neg: 0.5, lambda_pos: 1.0}; adaptive_agpo: none"},
    )
    correct_threshold: float = field(
        default=1.0,
        metadata={
            "help": "verifiable score (before the overlong penalty) at or above which a response is correct: for the "
            "accuracy metrics and the correct/wrong split of agpo and w_reinforce alike"
        },
    )

    def __post_init__(self) -> None:
        if "correct_threshold" in self.params:
            raise ValueError(
                f"advantage.params.correct_threshold ({self.params['correct_threshold']!r}): set "
                "advantage.correct_threshold instead; one threshold decides correct vs wrong for the accuracy "
                "metrics and the estimator alike"
            )


@dataclass(frozen=True)
class DapoConfig:
    """DAPO's switches (Yu et al. 2025): overlong reward shaping and filtering, dynamic sampling."""

    overlong_buffer: int = field(
        default=0,
        metadata={"help": "soft overlong penalty over the last N tokens before rollout.max_new_tokens; 0 off"},
    )
    overlong_penalty: float = field(default=1.0, metadata={"help": "largest overlong penalty (reward units)"})
    mask_truncated: bool = field(
        default=False, metadata={"help": "exclude responses cut at rollout.max_new_tokens from the loss"}
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={"help": "drop groups whose verifiable scores are all equal and refill from new prompts"},
    )
    max_refill_rounds: int = field(default=3, metadata={"help": "dynamic sampling: extra generation rounds"})
    dynamic_sampling_short_batch: str = field(
        default="log",
        metadata={
            "help": "dynamic sampling, refill rounds spent short of rollout.prompts_per_step groups: "
            f"one of {list(SHORT_BATCH)} (log: train on the smaller batch, metric dynamic_sampling_short_batch = 1; "
            "raise: stop with an error)"
        },
    )

    def __post_init__(self) -> None:
        require_ints(self, ("overlong_buffer", "max_refill_rounds"), 0)
        require_choice("dynamic_sampling_short_batch", self.dynamic_sampling_short_batch, SHORT_BATCH)


@dataclass(frozen=True)
class OptimizerConfig:
    """The policy update: AdamW and its schedule, gradient clipping, PPO epochs, micro-batches, trained layers."""

    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lr_schedule: str = field(default="constant", metadata={"help": f"one of {list(SCHEDULES)}"})
    warmup_steps: int = field(default=0, metadata={"help": "linear LR warm-up steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    ppo_epochs: int = field(default=1, metadata={"help": "optimizer steps per rollout batch"})
    micro_batch_size: int = field(default=32, metadata={"help": "sequences per forward/backward pass"})
    trainable_layers: int = field(
        default=0,
        metadata={"help": "train only the top N decoder layers (the rest stays frozen: a cheaper backward); 0: all"},
    )

    def __post_init__(self) -> None:
        require_ints(self, ("ppo_epochs", "micro_batch_size"), 1)
        require_ints(self, ("warmup_steps", "trainable_layers"), 0)
        require_positive(learning_rate=self.learning_rate)
        require_choice("lr_schedule", self.lr_schedule, SCHEDULES)


@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints (durable.checkpoint) the trainer writes, which a later run resumes from."""

    every: int = field(
        default=0, metadata={"help": "steps between checkpoints (also one at the end); 0: no checkpoints"}
    )
    keep: int = field(default=2, metadata={"help": "newest checkpoints kept on disk"})

    def __post_init__(self) -> None:
        require_int("every", self.every, 0)
        require_int("keep", self.keep, 1)


# The flat keys of the previous release -> their keys now (relative to the trainer config). Accepted, with a
# deprecation warning, for one release (pipelines.config moves them); remove this table in the next one.
RENAMED_KEYS: Mapping[str, str] = MappingProxyType(
    {
        "group_size": "rollout.group_size",
        "prompts_per_step": "rollout.prompts_per_step",
        "temperature": "rollout.temperature",
        "max_new_tokens": "rollout.max_new_tokens",
        "advantage_params": "advantage.params",
        "correct_threshold": "advantage.correct_threshold",
        "overlong_buffer": "dapo.overlong_buffer",
        "overlong_penalty": "dapo.overlong_penalty",
        "mask_truncated": "dapo.mask_truncated",
        "dynamic_sampling": "dapo.dynamic_sampling",
        "max_refill_rounds": "dapo.max_refill_rounds",
        "dynamic_sampling_short_batch": "dapo.dynamic_sampling_short_batch",
        "learning_rate": "optimizer.learning_rate",
        "weight_decay": "optimizer.weight_decay",
        "lr_schedule": "optimizer.lr_schedule",
        "warmup_steps": "optimizer.warmup_steps",
        "max_grad_norm": "optimizer.max_grad_norm",
        "ppo_epochs": "optimizer.ppo_epochs",
        "micro_batch_size": "optimizer.micro_batch_size",
        "trainable_layers": "optimizer.trainable_layers",
        "checkpoint_every": "checkpoint.every",
        "keep_checkpoints": "checkpoint.keep",
    }
)


@dataclass(frozen=True)
class TrainerConfig:
    """RL trainer settings, in sections. Presets in configs/ set these per algorithm."""

    renamed_keys: ClassVar[Mapping[str, str]] = RENAMED_KEYS

    algorithm: str = field(default="agpo", metadata={"help": "advantage estimator name, or adaptive_agpo"})
    seed: int = field(default=0, metadata={"help": "seed of prompt order and sampling"})
    max_steps: int = field(default=60, metadata={"help": "training steps (the run also stops at token_budget)"})
    token_budget: int | None = field(
        default=None, metadata={"help": "stop once this many tokens were generated (probes count); null: no cap"}
    )
    eval_every: int = field(default=10, metadata={"help": "steps between evaluations (0: only at start and end)"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "what each step samples"})
    advantage: AdvantageConfig = field(
        default_factory=AdvantageConfig, metadata={"help": "the advantage estimator's settings"}
    )
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig, metadata={"help": "policy loss"})
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig, metadata={"help": "adaptive AGPO controllers"})
    dapo: DapoConfig = field(
        default_factory=DapoConfig, metadata={"help": "DAPO: overlong penalty and filtering, dynamic sampling"}
    )
    optimizer: OptimizerConfig = field(
        default_factory=OptimizerConfig,
        metadata={"help": "the update: AdamW, LR schedule, clipping, PPO epochs, micro-batches, trained layers"},
    )
    checkpoint: CheckpointConfig = field(
        default_factory=CheckpointConfig, metadata={"help": "checkpoints to resume from"}
    )

    def __post_init__(self) -> None:
        if self.algorithm not in algorithm_names():
            raise ValueError(f"unknown algorithm {self.algorithm!r}; known: {', '.join(algorithm_names())}")
        if self.algorithm != ADAPTIVE_AGPO:
            validate_estimator_params(self.algorithm, self.advantage.params)
        elif self.advantage.params:
            raise ValueError("adaptive_agpo uses its own advantage; advantage.params must be empty")
        if self.algorithm == ADAPTIVE_AGPO:
            require_clip_pair_with_a_ratio(self.loss.eps_low, self.loss.eps_high)
        require_int("max_steps", self.max_steps, 1)
        require_int("eval_every", self.eval_every, 0)
        if self.token_budget is not None:
            require_int("token_budget", self.token_budget, 1)
        if self.dapo.overlong_buffer >= self.rollout.max_new_tokens:
            raise ValueError(
                f"dapo.overlong_buffer ({self.dapo.overlong_buffer}) must be smaller than rollout.max_new_tokens "
                f"({self.rollout.max_new_tokens})"
            )

    @property
    def adaptive_mode(self) -> bool:
        return self.algorithm == ADAPTIVE_AGPO
