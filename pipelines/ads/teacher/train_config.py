"""The config of ``agpo train`` (``TrainTeacherConfig``: pairs, base teacher, engine, ranks, audit and the RL
trainer), which pipelines.ads.teacher.train runs. It imports no torch, so ``--print-config`` and config errors never
load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.trainer_config import TrainerConfig
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.rl.engine_fields import deepspeed_field, engine_field, engine_options_field
from pipelines.rl.stage_fields import check_rl_settings, processes_field, resume_field
from pipelines.runs import run_path_field
from pipelines.threads import check_threads, threads_field


@dataclass(frozen=True)
class TrainTeacherConfig:
    """Inputs, outputs and trainer settings of teacher RL."""

    pairs: str = run_path_field("data/pairs.parquet", "pairs Parquet (from `agpo data`)")
    base_model: str = run_path_field(
        "teacher/sft",
        "model to start from: a local HF causal-LM directory or a packaged name (smollm2-135m-instruct, gemma-3-270m)",
    )
    out_dir: str = run_path_field("teacher/rl", "run folder: model/, metrics.jsonl, summary")
    prompt_version: str | None = field(
        default=None, metadata={"help": "prompt template version; null: the base teacher's own (teacher_prompt.json)"}
    )
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    deepspeed: str | None = deepspeed_field()
    processes: int = processes_field()
    resume: bool = resume_field()
    train_examples: int | None = field(default=None, metadata={"help": "use the first N train pairs; null: all"})
    rl_share: float = field(
        default=0.0,
        metadata={
            "help": "train on the RL part of the gold train split, the queries the SFT teacher's rl_share held out "
            "(the pipeline sets it from teacher.rl_share); 0: every train pair"
        },
    )
    audit_examples: int = field(default=300, metadata={"help": "audit pairs graded during training"})
    audit_samples: int = field(
        default=4, metadata={"help": "samples per audit pair: audit accuracy is their mean (pass@1), plus maj@n"}
    )
    audit_constrained: bool = field(
        default=True,
        metadata={
            "help": "grade the audit split with answer-grammar decoding (every answer parses; training samples "
            "stay unconstrained)"
        },
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the RL trainer"})

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        check_rl_settings(self)
