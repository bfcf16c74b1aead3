"""The config of ``agpo annotate-robustness`` (``RobustnessConfig``: pairs, teacher, engine, examples), which
pipelines.ads.studies.annotate_robustness runs. It imports no torch, so ``--print-config`` and config errors never
load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.rl.engine_fields import engine_field
from pipelines.runs import run_path_field
from pipelines.threads import check_threads, threads_field


@dataclass(frozen=True)
class RobustnessConfig:
    pairs: str = run_path_field("data/pairs.parquet", "pairs Parquet with an audit split")
    teacher: str = run_path_field("teacher/rl/model", "teacher model directory")
    out_dir: str = run_path_field("robustness", "output folder")
    prompt_version: str | None = field(
        default=None, metadata={"help": "prompt template version; null: the teacher's own (teacher_prompt.json)"}
    )
    engine: str = engine_field()
    examples: int = field(default=300, metadata={"help": "audit pairs used (each in 1 + 5 + 5 versions)"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest answer in tokens"})
    constrained: bool = field(
        default=True,
        metadata={
            "help": "decode within the answer grammar, as annotation does by default (every answer parses); "
            "false: free decoding, where an injected tag can also make the answer unparseable"
        },
    )
    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
