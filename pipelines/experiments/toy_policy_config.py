"""The toy comparison's settings (``ToyConfig``: environment, budget, algorithms); toy_policy runs it. Needs no
torch, so configs validate without it."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.adaptive_config import ADAPTIVE_AGPO, AdaptiveConfig, algorithm_names, require_clip_pair_with_a_ratio
from agpo.checks import require_ints, require_positive
from agpo.estimator_params import validate_estimator_params
from agpo.loss_config import PolicyLossConfig


@dataclass(frozen=True)
class ToyConfig:
    """The toy environment, the training budget and the algorithms to compare."""

    num_problems: int = field(default=200, metadata={"help": "number of problems (prompts)"})
    num_candidates: int = field(default=32, metadata={"help": "candidate answers per problem"})
    feature_dim: int = field(default=16, metadata={"help": "dimension of the shared policy parameters"})
    signal_mean: float = field(
        default=0.5, metadata={"help": "mean strength of the shared direction in correct answers' features"}
    )
    signal_std: float = field(
        default=1.0, metadata={"help": "spread of that strength across problems (some become negative)"}
    )
    difficulty_range: float = field(
        default=4.0, metadata={"help": "base logit offsets of correct answers are uniform in [-range, +range/2]"}
    )
    env_seed: int = field(default=0, metadata={"help": "seed of the problems (shared by all runs)"})
    group_size: int = field(default=8, metadata={"help": "G, responses per prompt"})
    problems_per_step: int = field(default=32, metadata={"help": "prompts per training step"})
    ppo_epochs: int = field(default=2, metadata={"help": "optimizer steps per rollout batch"})
    learning_rate: float = field(default=0.05, metadata={"help": "Adam learning rate"})
    token_budget: int = field(
        default=64_000, metadata={"help": "generated answers per run (probe answers count), equal for all"}
    )
    eval_every: int = field(default=25, metadata={"help": "steps between learning-curve points"})
    max_k: int = field(default=256, metadata={"help": "largest k of the pass@k curve"})
    algorithms: tuple[str, ...] = field(
        default=("grpo", "dr_grpo", "rloo", "w_reinforce", "agpo", ADAPTIVE_AGPO),
        metadata={"help": "algorithms to compare: advantage estimators or adaptive_agpo"},
    )
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": "training seeds per algorithm"})
    advantage_params: dict[str, dict[str, object]] = field(
        default_factory=dict,
        metadata={"help": "per-estimator parameters, e.g. {agpo: {lambda_neg: 0.5}}"},
    )
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig, metadata={"help": "policy loss settings"})
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig, metadata={"help": "adaptive AGPO settings"})

    def __post_init__(self) -> None:
        sizes = ("num_problems", "num_candidates", "feature_dim", "group_size", "problems_per_step", "ppo_epochs")
        require_ints(self, (*sizes, "token_budget", "eval_every", "max_k"), 1)
        if self.num_candidates < 2:
            raise ValueError(f"num_candidates must be >= 2, got {self.num_candidates}")
        require_positive(learning_rate=self.learning_rate)
        known = algorithm_names()
        for name in self.algorithms:
            if name not in known:
                raise ValueError(f"unknown algorithm {name!r} in algorithms; known: {', '.join(known)}")
        if not self.algorithms:
            raise ValueError("algorithms must name at least one algorithm")
        if not self.seeds:
            raise ValueError("seeds must hold at least one seed")
        for name, params in self.advantage_params.items():
            validate_estimator_params(name, params)
        if ADAPTIVE_AGPO in self.algorithms:
            require_clip_pair_with_a_ratio(self.loss.eps_low, self.loss.eps_high)
        largest_step = max(self.samples_per_step(name) for name in self.algorithms)
        if self.token_budget < largest_step:
            raise ValueError(
                f"token_budget {self.token_budget} is smaller than one training step ({largest_step} answers)"
            )

    def samples_per_step(self, algorithm: str) -> int:
        probes = 2 if algorithm == ADAPTIVE_AGPO else 1
        return probes * self.problems_per_step * self.group_size
