"""The config of ``agpo evaluate`` (``EvaluateConfig``: the student, what it is compared with, the gold pairs, the
baselines and the bootstrap), which pipelines.ads.distillation.evaluate runs. It imports no torch, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice
from evaluation.baselines_config import BaselinesConfig
from evaluation.comparison import BASELINES, STUDENT
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.runs import run_path_field
from pipelines.steps import check_path_name
from pipelines.threads import check_threads, threads_field

BACKENDS = ("torch", "onnx")


@dataclass(frozen=True)
class BootstrapConfig:
    """The paired bootstrap of every difference between two models (evaluation.bootstrap)."""

    samples: int = field(default=1000, metadata={"help": "resamples of the gold queries"})
    confidence: float = field(default=0.95, metadata={"help": "coverage of the percentile interval"})
    seed: int = field(default=0, metadata={"help": "seed of the resampling"})

    def __post_init__(self) -> None:
        if self.samples < 1 or not 0 < self.confidence < 1:
            raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {self.samples}, {self.confidence}")


@dataclass(frozen=True)
class EvaluateConfig:
    """Which student, what it is compared with, which gold pairs, and how to score them."""

    model: str = run_path_field("student/model", "student folder (agpo distil)")
    pairs: str = run_path_field("data/pairs.parquet", "pairs file with the gold split")
    split: str = field(default="test", metadata={"help": "gold split scored"})
    out_dir: str = run_path_field("student/eval", "output folder")
    backend: str = field(default="torch", metadata={"help": f"one of {list(BACKENDS)}"})
    compare_with: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "name -> another student folder scored on the same pairs, e.g. {gold_only: <folder>}"},
    )
    baselines: BaselinesConfig = field(
        default_factory=BaselinesConfig, metadata={"help": "baselines fitted on the gold train pairs"}
    )
    bootstrap: BootstrapConfig = field(default_factory=BootstrapConfig, metadata={"help": "difference intervals"})
    relevant_from: int = field(default=2, metadata={"help": "grades >= this count as relevant (ROC-AUC, PR-AUC)"})
    ndcg_k: int = field(default=10, metadata={"help": "k of NDCG@k"})
    batch_size: int = field(default=256, metadata={"help": "pairs per prediction batch"})
    max_length: int = field(default=96, metadata={"help": "longest query + ad in tokens"})

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        require_choice("backend", self.backend, BACKENDS)
        if self.ndcg_k < 1 or self.batch_size < 1:
            raise ValueError(f"ndcg_k and batch_size must be >= 1, got {self.ndcg_k}, {self.batch_size}")
        for name in self.compare_with:
            check_path_name("compare_with name", name)
            if name in (STUDENT, *BASELINES):
                raise ValueError(f"compare_with may not use the name {name!r}: it names the student or a baseline")
