"""The config of ``agpo math-pipeline`` (``MathPipelineConfig``: the run folder, math RL, the pass@k evaluation and
tracking), which pipelines.math.math_pipeline runs. It imports no torch, so ``--print-config`` and config errors never
load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pipelines.devices import device_field, pass_device_down, precision_field
from pipelines.math.math_eval_config import MathEvalConfig
from pipelines.math.math_train_config import MathTrainConfig
from pipelines.runs import run_id_field
from pipelines.steps import RunChoices, check_run_id
from pipelines.threads import pass_threads_down, pipeline_threads_field
from pipelines.tracking import TrackingConfig


@dataclass(frozen=True)
class MathPipelineConfig:
    """One math run: where it writes, how it trains and how it is evaluated."""

    # what a DAG run's overrides may set (pipelines.steps.RunChoices); the stages' folders are the run's
    run_choices: ClassVar[RunChoices] = RunChoices(
        allowed=("train.*", "evaluate.*", "evaluate_heldout", "threads", "device", "precision"),
        refused=("train.out_dir", "evaluate.out_dir", "evaluate.model"),
    )

    run_id: str = run_id_field()
    out_dir: str = field(default="work/math-runs", metadata={"help": "folder holding one folder per run"})
    train: MathTrainConfig = field(default_factory=MathTrainConfig, metadata={"help": "math RL"})
    evaluate: MathEvalConfig = field(
        default_factory=lambda: MathEvalConfig(samples=16, max_new_tokens=24), metadata={"help": "pass@k evaluation"}
    )
    evaluate_heldout: bool = field(
        default=True, metadata={"help": "evaluate on the training task's held-out problems instead of evaluate.path"}
    )
    tracking: TrackingConfig = field(
        default_factory=lambda: TrackingConfig(experiment="math_rlvr"), metadata={"help": "MLflow tracking"}
    )

    threads: int | None = pipeline_threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        pass_threads_down(self, ("train", "evaluate"))
        pass_device_down(self, ("train", "evaluate"))
        check_run_id(self.run_id)
