"""The config of ``agpo train-compare`` (``CompareConfig``: the shared training run, the algorithm presets, the
seeds and the token budget), which pipelines.experiments.train_compare runs. It imports no torch, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipelines.ads.teacher.train_config import TrainTeacherConfig
from pipelines.steps import check_path_name, preset


@dataclass(frozen=True)
class CompareConfig:
    """The shared training run, the algorithm presets and the seeds to compare."""

    out_dir: str = field(default="work/compare", metadata={"help": "<algorithm>/seed-<s>/ per run, plus the table"})
    algorithms: tuple[str, ...] = field(
        default=("grpo", "agpo", "adaptive_agpo"), metadata={"help": "configs/train/<name>.yaml presets, one each"}
    )
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "trainer seeds per algorithm"})
    token_budget: int = field(default=40_000, metadata={"help": "generated tokens per run (probes count)"})
    train: TrainTeacherConfig = field(default_factory=TrainTeacherConfig, metadata={"help": "the shared run"})

    def __post_init__(self) -> None:
        if not self.algorithms or not self.seeds:
            raise ValueError("algorithms and seeds must name at least one each")
        for algorithm in self.algorithms:  # each names a preset file and a run folder
            check_path_name("algorithms entry", algorithm)
            if not Path(preset(f"configs/train/{algorithm}.yaml")).is_file():
                raise ValueError(f"algorithms entry {algorithm!r} has no preset configs/train/{algorithm}.yaml")
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")
