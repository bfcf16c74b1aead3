"""The config of ``agpo math-compare`` (``MathCompareConfig``: algorithms, seeds, the shared training recipe, the
evaluation and the frontier), which pipelines.math.math_compare runs. It imports no torch, so ``--print-config`` and
config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.trainer_config import TrainerConfig
from pipelines.math.math_eval_config import MathEvalConfig
from pipelines.math.math_train_config import MathTrainConfig
from pipelines.steps import check_path_name


@dataclass(frozen=True)
class MathCompareConfig:
    """Algorithms, seeds, the shared training recipe and the evaluation."""

    algorithms: tuple[str, ...] = field(
        default=("grpo", "agpo", "w_reinforce", "adaptive_agpo"), metadata={"help": "configs/train/<name>.yaml each"}
    )
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": "trainer seeds per algorithm"})
    train: MathTrainConfig = field(
        default_factory=lambda: MathTrainConfig(trainer=TrainerConfig(token_budget=40_000)),
        metadata={"help": "the shared recipe (trainer.token_budget: the equal budget)"},
    )
    samples: int = field(default=64, metadata={"help": "samples per held-out problem (largest k)"})
    evaluate: MathEvalConfig = field(default_factory=MathEvalConfig, metadata={"help": "sampling settings"})
    out_dir: str = field(default="work/math-compare", metadata={"help": "output folder"})
    frontier_every: int = field(
        default=0,
        metadata={
            "help": "steps between held-out evaluations with `samples` samples during training, for the "
            "pass@k-against-pass@1 frontier (frontier.md/png); 0: no frontier"
        },
    )
    frontier_targets: tuple[float, ...] = field(
        default=(0.2, 0.4, 0.6, 0.8), metadata={"help": "pass@1 values at which the frontier compares pass@k"}
    )

    def __post_init__(self) -> None:
        if not self.algorithms or not self.seeds:
            raise ValueError("algorithms and seeds must name at least one each")
        for algorithm in self.algorithms:  # each names a preset file and a run folder
            check_path_name("algorithms entry", algorithm)
        if self.train.trainer.token_budget is None:
            raise ValueError("train.trainer.token_budget must be set: the algorithms are compared at equal budget")
        if self.frontier_every < 0 or not all(0 < t <= 1 for t in self.frontier_targets):
            raise ValueError("frontier_every must be >= 0 and every frontier_targets entry in (0, 1]")
        if self.train.deepspeed:
            raise ValueError(
                "math-compare trains every run in this one process; DeepSpeed runs need torchrun: launch "
                "`agpo math-train` per algorithm and seed, then `agpo math-eval` (docs/math.md, GPU scale)"
            )
