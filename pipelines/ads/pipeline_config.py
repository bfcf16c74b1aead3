"""One run of the ads pipeline: its config (every stage's settings) and the folders it writes
(``<out_dir>/<run_id>/``), with the configs of the stages that read another stage's outputs rewritten into them.

It imports only the stages' light config modules (no torch), so ``agpo pipeline --print-config`` and config
errors never load a stage."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from pipelines.ads.annotation.annotate_config import AnnotateConfig
from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.ads.distillation.report_page import PLOTS, RunFiles
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.window import PairsWindow
from pipelines.ads.teacher.gate import TeacherReuseConfig
from pipelines.ads.teacher.train_config import TrainTeacherConfig
from pipelines.ads.teacher.warm_start_config import TeacherConfig
from pipelines.devices import device_field, pass_device_down, precision_field
from pipelines.runs import run_id_field
from pipelines.steps import RunChoices, check_run_id
from pipelines.threads import pass_threads_down, pipeline_threads_field
from pipelines.tracking import TrackingConfig

# the RL summary's metrics the teacher gate can judge on (pipelines.ads.teacher.gate)
GATE_METRICS = ("audit_accuracy_end", "audit_greedy_accuracy_end", "audit_maj@4_end")
# the stage keys the pipeline sets itself from the run's folders (``*_config`` below, pipelines.ads.pipeline):
# key -> what to do instead. A pipeline config that sets one is refused rather than silently overwritten.
PIPELINE_OWNED = {
    "data.out_dir": "set out_dir and run_id (the run writes <out_dir>/<run_id>/data) instead",
    "teacher.pairs": "set pairs instead",
    "teacher.out_dir": "set out_dir and run_id instead",
    "train.pairs": "set pairs instead",
    "train.base_model": "set base_teacher (or teacher.base_model, which SFT starts from) instead",
    "train.out_dir": "set out_dir and run_id instead",
    "train.rl_share": "set teacher.rl_share (SFT and RL split the gold train pairs together) instead",
    "annotate.input.path": "set pairs instead",
    "annotate.teacher": "it is always the run's RL teacher",
    "annotate.out_dir": "set out_dir and run_id instead",
    "annotate.gold": "set unlabeled_gold instead",
    "annotate.shards": "set annotate.num_shards (the DAG maps one task per shard) instead",
    "annotate.cache_dir": "set out_dir instead: the label cache is <out_dir>/label_cache, beside the run folders",
    "distil.labels": "it is always the run's annotation labels",
    "distil.pairs": "set pairs instead",
    "distil.gold": "set unlabeled_gold instead",
    "distil.out_dir": "set out_dir and run_id instead",
    "evaluate.model": "it is always the run's student",
    "evaluate.pairs": "set pairs instead",
    "evaluate.out_dir": "set out_dir and run_id instead",
    "evaluate.compare_with": "set gold_student (the gold-only student is compared when it is on) instead",
}


# what a DAG run's overrides may set (pipelines.steps.RunChoices): the run's data, gates, models, sizes and seeds;
# tracking, folders and the shards' lease length are the worker's
RUN_CHOICES = RunChoices(
    allowed=(
        *("unlabeled_gold", "gate_metric", "min_audit_accuracy", "max_predicted_share", "min_balanced_margin"),
        *("gold_student", "threads", "device", "precision"),
        *("teacher_reuse.source", "teacher_reuse.mode", "teacher_reuse.retrain_gold_change"),
        *("data.*", "teacher.*", "train.*", "annotate.*", "distil.*", "evaluate.*"),
    ),
    refused=("annotate.lease_seconds",),
)


@dataclass(frozen=True)
class AdsPipelineConfig:
    """One pipeline run: where it writes, its data and models, and every stage's settings."""

    owned_keys: ClassVar[dict[str, str]] = PIPELINE_OWNED  # not user keys: refuse_owned_keys
    run_choices: ClassVar[RunChoices] = RUN_CHOICES

    run_id: str = run_id_field()
    out_dir: str = field(default="work/runs", metadata={"help": "folder holding one folder per run"})
    pairs: str | None = field(
        default=None, metadata={"help": "a pairs Parquet file (contract: pairs); null: the embedded synthetic set"}
    )
    pairs_window: PairsWindow | None = field(
        default=None,
        metadata={
            "help": "{start, end}: pairs is a dataset of dt=YYYY-MM-DD partitions, and the run reads the unlabeled "
            "pairs of start <= dt < end and the gold pairs of every dt < end (pipelines/ads/intake/window.py; the "
            "DAG's partitions param sets it); null: pairs is read whole"
        },
    )
    unlabeled_gold: str | None = field(
        default=None, metadata={"help": "pair_id -> gold_grade of unlabeled pairs, for agreement metrics; optional"}
    )
    base_teacher: str | None = field(
        default=None, metadata={"help": "an SFT-ready teacher directory; null: build the tiny teacher and SFT it"}
    )
    gate_metric: str = field(default="audit_accuracy_end", metadata={"help": f"one of {list(GATE_METRICS)}"})
    min_audit_accuracy: float = field(default=0.5, metadata={"help": "the gate: teacher audit accuracy needed"})
    max_predicted_share: float = field(
        default=0.95,
        metadata={
            "help": "the gate: the largest share of the teacher's greedy audit answers any one grade may take "
            "(a teacher that answers one grade fails); 1.0: no check"
        },
    )
    min_balanced_margin: float | None = field(
        default=0.05,
        metadata={
            "help": "the prior gate, after SFT and after RL: the teacher's audit balanced accuracy must beat 1/K "
            "(any answer that ignores the pair) by this much and by twice chance's standard error; null: no check"
        },
    )
    gold_student: bool = field(
        default=True,
        metadata={
            "help": "also train the same student on the gold train pairs alone (no teacher) and score it beside "
            "the run's student: what the teacher's labels add over the grades the team had, and the champion "
            "rule's first bar (evaluation.comparison)"
        },
    )
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "the synthetic set (pairs: null)"})
    teacher: TeacherConfig = field(default_factory=TeacherConfig, metadata={"help": "base teacher + SFT"})
    train: TrainTeacherConfig = field(default_factory=TrainTeacherConfig, metadata={"help": "teacher RL"})
    teacher_reuse: TeacherReuseConfig = field(
        default_factory=TeacherReuseConfig,
        metadata={"help": "start from a registered teacher instead of SFT and RL, and the rule that decides"},
    )
    annotate: AnnotateConfig = field(default_factory=AnnotateConfig, metadata={"help": "annotation"})
    distil: DistilConfig = field(default_factory=DistilConfig, metadata={"help": "student distillation"})
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig, metadata={"help": "student evaluation"})
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata={"help": "MLflow tracking"})

    threads: int | None = pipeline_threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        pass_threads_down(self, ("teacher", "train", "annotate", "distil", "evaluate"))
        pass_device_down(self, ("teacher", "train", "annotate", "distil", "evaluate"))
        check_run_id(self.run_id)
        refuse_owned_keys(self)
        if self.pairs_window is not None and not self.pairs:
            raise ValueError(
                "pairs_window is set but pairs is not: a window needs pairs to name a dataset of dt= parts"
            )
        if self.gate_metric not in GATE_METRICS:
            raise ValueError(f"gate_metric must be one of {list(GATE_METRICS)}, got {self.gate_metric!r}")
        if self.min_balanced_margin is not None and not 0.0 <= self.min_balanced_margin < 1.0:
            raise ValueError(f"min_balanced_margin must be in [0, 1) or null, got {self.min_balanced_margin!r}")
        if not 0.0 < self.max_predicted_share <= 1.0:
            raise ValueError(f"max_predicted_share must be in (0, 1], got {self.max_predicted_share!r}")


def refuse_owned_keys(config: AdsPipelineConfig) -> None:
    """A ValueError naming the first ``PIPELINE_OWNED`` key whose value is not its stage's default."""
    for key, instead in PIPELINE_OWNED.items():
        stage, *path = key.split(".")
        value, default = getattr(config, stage), type(getattr(config, stage))()
        for name in path:
            value, default = getattr(value, name), getattr(default, name)
        if value != default:
            raise ValueError(
                f"{key} is set by the pipeline from the run's folders ({value!r} would be ignored): {instead}"
            )


@dataclass(frozen=True)
class Layout:
    """Every folder of one run."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def sft(self) -> Path:
        return self.root / "teacher" / "sft"

    @property
    def rl(self) -> Path:
        return self.root / "teacher" / "rl"

    @property
    def annotate(self) -> Path:
        return self.root / "annotate"

    @property
    def student(self) -> Path:
        return self.root / "student"

    @property
    def gold_only(self) -> Path:
        return self.root / "student" / "train-gold"

    @property
    def steps(self) -> Path:
        return self.root / "steps"

    @property
    def teacher_skipped(self) -> Path:
        return self.root / "teacher_skipped.json"


def layout(config: AdsPipelineConfig) -> Layout:
    return Layout(Path(config.out_dir) / config.run_id)


def pairs_path(config: AdsPipelineConfig) -> str:
    """The run's pairs: the team's (a local path or a URI, pipelines.storage), else the run's own file: the
    embedded set's, or the rows of ``pairs_window`` that ``validate`` took from the team's dataset."""
    return config.pairs if config.pairs and config.pairs_window is None else str(layout(config).data / "pairs.parquet")


def gold_path(config: AdsPipelineConfig) -> str | None:
    """The labeled pairs' hidden gold: the run's own, the user's ``unlabeled_gold``, or None when a user's pairs
    have none (never a stage's default, which follows AGPO_RUN and would change a step's params on retry)."""
    if config.pairs:
        return config.unlabeled_gold
    return str(layout(config).data / "unlabeled_gold.parquet")


def teacher_dir(config: AdsPipelineConfig) -> Path:
    return Path(config.base_teacher) if config.base_teacher else layout(config).sft


def annotate_config(config: AdsPipelineConfig) -> AnnotateConfig:
    return replace(
        config.annotate,
        input=replace(config.annotate.input, path=str(pairs_path(config))),
        teacher=str(layout(config).rl / "model"),
        out_dir=str(layout(config).annotate),
        gold=gold_path(config),
        shards=None,
        cache_dir=str(Path(config.out_dir) / "label_cache"),
    )


def distil_config(config: AdsPipelineConfig) -> DistilConfig:
    """The distil stage's config inside the run folder."""
    return replace(
        config.distil,
        labels=str(layout(config).annotate / "labels"),
        pairs=str(pairs_path(config)),
        gold=gold_path(config),
        out_dir=str(layout(config).student),
    )


def report_files(config: AdsPipelineConfig, gates: tuple) -> RunFiles:
    """Where the run's report page (pipelines.ads.distillation.report_page) reads its facts, and the files it links;
    ``gates``: the teacher gate's thresholds (pipelines.ads.serving.teacher_registry.gate_settings)."""
    root = layout(config)
    eval_dir = root.student / "eval"
    links = {
        "registration record": root.student / "registration.json",
        "evaluation report": eval_dir / "metrics.json",
        "comparison tables": eval_dir / "comparison.md",
        "evaluation evidence (hashes)": eval_dir / "evidence.json",
        "student model card": root.student / "model" / "README.md",
        "gold-only student model card": root.gold_only / "model" / "README.md",
        "why the teacher was skipped": root.teacher_skipped,
        "the run's pairs": root.data / "pairs.parquet",
        "SFT teacher report": root.sft / "teacher_report.json",
        "RL teacher summary": root.rl / "summary.json",
        "annotation quality report": root.annotate / "quality_report.json",
        "annotation summary": root.annotate / "summary.json",
    }
    return RunFiles(
        root=root.root,
        eval_dir=eval_dir,
        pairs=pairs_path(config),
        annotation=root.annotate,
        teacher_summary=root.rl / "summary.json",
        gates=gates,
        confidence=config.evaluate.bootstrap.confidence,
        links=links | {name: eval_dir / name for name, _ in PLOTS},
    )


def study_run(
    base: AdsPipelineConfig, run_id: str, out_dir: Path, seed: int, experiment: str, **changes
) -> AdsPipelineConfig:
    """One run of a study (the scarce-gold and rl-split studies): ``base`` under ``out_dir/run_id``, tracked in
    ``experiment``, with ``seed`` as the teacher's SFT and RL seed; ``changes`` replace further keys."""
    return replace(
        base,
        run_id=run_id,
        out_dir=str(out_dir),
        teacher=replace(base.teacher, sft=replace(base.teacher.sft, seed=seed)),
        train=replace(base.train, trainer=replace(base.train.trainer, seed=seed)),
        tracking=replace(base.tracking, experiment=experiment),
        **changes,
    )
