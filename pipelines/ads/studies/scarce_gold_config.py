"""The config of ``agpo scarce-gold`` (``ScarceGoldConfig``: the gold budgets, the unlabeled pool, the seeds and
the pipeline every arm runs), which pipelines.ads.studies.scarce_gold runs. It imports no torch, so ``--print-config``
and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.ads.pipeline_config import AdsPipelineConfig


@dataclass(frozen=True)
class ScarceGoldConfig:
    """The budgets, the pool, the seeds, and the pipeline every arm runs."""

    out_dir: str = field(default="work/studies/scarce-gold", metadata={"help": "output folder"})
    pairs: str | None = field(
        default=None, metadata={"help": "a pairs Parquet (agpo data import); null: the synthetic set of pipeline.data"}
    )
    unlabeled_gold: str | None = field(
        default=None, metadata={"help": "pair_id -> gold_grade of the unlabeled pairs (label accuracy); optional"}
    )
    budgets: tuple[int, ...] = field(default=(250, 500, 1000, 2000), metadata={"help": "gold train pairs per arm"})
    pool: int = field(default=10_000, metadata={"help": "unlabeled pairs the teacher labels in every arm"})
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": "seeds per budget (gold draw, models)"})
    label_past_gate: bool = field(
        default=False,
        metadata={
            "help": "annotate even when the teacher fails a gate (the verdict is recorded); false: as the pipeline"
        },
    )
    experiment: str = field(default="scarce_gold", metadata={"help": "MLflow experiment of the arms' pipeline runs"})
    pipeline: AdsPipelineConfig = field(
        default_factory=AdsPipelineConfig,
        metadata={"help": "the pipeline of every arm (teacher, RL, gates, annotation, student recipe)"},
    )

    def __post_init__(self) -> None:
        if not self.budgets or any(n < 1 for n in self.budgets) or sorted(set(self.budgets)) != list(self.budgets):
            raise ValueError(f"budgets must be increasing positive pair counts, got {list(self.budgets)}")
        if self.pool < 1 or not self.seeds:
            raise ValueError(f"need pool >= 1 and at least one seed, got pool {self.pool}, seeds {list(self.seeds)}")
