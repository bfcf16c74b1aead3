"""The config of ``agpo score`` (``ScoreConfig``: the pairs, the student or registered model, backend, shards), which
pipelines.ads.serving.score runs. It imports no torch or onnxruntime, so ``--print-config`` and config errors never
load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agpo.checks import require_choice, require_int
from pipelines.ads.annotation.annotate_config import check_sharding, publish_field
from pipelines.ads.intake.ingest import InputConfig
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.runs import run_path_field
from pipelines.steps import RunChoices
from pipelines.threads import check_threads, threads_field
from student.graph_runtimes import BACKENDS as GRAPH_BACKENDS

REGISTRY_PREFIX = "models:/"  # a model given as a registry URI (score and serve), not a folder
SCORE_FIELDS = ("pair_id", "grade", "probabilities", "confidence", "model_version")  # every score row's
CARRIED_FIELDS = ("query", "ad_title", "gold_grade", "split")  # pairs fields a score row can carry as validated


def registry_tracking_field() -> Any:
    """The ``tracking_uri`` key of a stage that reads a ``models:/`` model (score, serve)."""
    return field(
        default=None,
        metadata={
            "help": "MLflow tracking URI for a models:/ model; null: MLFLOW_TRACKING_URI, else the project's store "
            "(work/mlflow)"
        },
    )


BACKENDS = ("torch", *GRAPH_BACKENDS, "auto")  # student.graph_runtimes; auto: evaluation.backend_choice's rule


@dataclass(frozen=True)
class ScoreConfig:
    """Which student, which pairs, and how to score them."""

    # what a scoring DAG run's overrides may set (pipelines.steps.RunChoices): how the pairs are read and scored; the
    # pairs file is the DAG's pairs param, the folder, tracking URI and lease the worker's
    run_choices: ClassVar[RunChoices] = RunChoices(
        allowed=(
            *("input.*", "backend", "max_length", "batch_size", "num_shards", "chunk_pairs", "publish"),
            *("threads", "device", "precision", "carry_columns"),
        ),
        refused=("input.path",),
    )

    input: InputConfig = field(
        default_factory=InputConfig, metadata={"help": "pairs to score (same mapping and quarantine as annotate)"}
    )
    model: str = run_path_field(
        "student/model", "student folder (agpo distil), or a registered model: models:/<name>@<alias> or /<version>"
    )
    tracking_uri: str | None = registry_tracking_field()
    backend: str = field(
        default="torch",
        metadata={
            "help": f"one of {list(BACKENDS)}: onnx* on onnxruntime, openvino* on OpenVINO, the folder's fp32 graph or "
            "its int8 one; auto: the fastest that keeps quality, as agpo distil's serving_backends measured it "
            "(backends.json), else fp32 on openvino (docs/serving.md)"
        },
    )
    carry_columns: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "input columns copied into every score row after pair_id, so the scores join without a lookup: "
            f"a pairs field ({', '.join(CARRIED_FIELDS)}: its validated value) or any other column of the file (as "
            "text; null stays null), e.g. [query, ad_title, campaign_id]; a column the file lacks stops the run"
        },
    )
    max_length: int = field(default=96, metadata={"help": "longest query + ad in tokens"})
    batch_size: int = field(default=256, metadata={"help": "pairs per forward pass"})
    out_dir: str = run_path_field("score", "run folder (partition, scores, quarantine, ...)")
    publish: str | None = publish_field()
    num_shards: int = field(default=1, metadata={"help": "shards the input is split into (stable hash of pair_id)"})
    chunk_pairs: int = field(default=4096, metadata={"help": "pairs committed at a time (the resume granularity)"})
    lease_seconds: float = field(
        default=600.0,
        metadata={"help": "a worker's claim on a shard, renewed every eighth of it (as annotate.lease_seconds)"},
    )

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        require_choice("backend", self.backend, BACKENDS)
        check_carry_columns(self.carry_columns)
        require_int("max_length", self.max_length, 8)
        require_int("batch_size", self.batch_size, 1)
        check_sharding(self)


def check_carry_columns(names: tuple[str, ...]) -> None:
    """Each carried column named once, and none a score row already has (``SCORE_FIELDS``)."""
    taken = sorted({name for name in names if name in SCORE_FIELDS or names.count(name) > 1})
    if taken:
        raise ValueError(
            f"carry_columns names {taken} twice or as a score field ({list(SCORE_FIELDS)}); name each input column "
            "once (a score row has pair_id already)"
        )
