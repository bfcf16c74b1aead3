"""The config of ``agpo toy`` (``ToyCompareConfig``: the output folder and toy_policy's experiment), which
pipelines.experiments.toy runs. It imports no torch, so ``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.experiments.toy_policy_config import ToyConfig
from pipelines.threads import check_threads, threads_field


@dataclass(frozen=True)
class ToyCompareConfig:
    """Where the comparison writes, and the toy experiment itself."""

    out_dir: str = field(default="work/toy", metadata={"help": "output folder (created; files replaced)"})
    toy: ToyConfig = field(default_factory=ToyConfig, metadata={"help": "the toy experiment"})
    threads: int | None = threads_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
