"""The config of ``agpo rl-split`` (``RLSplitConfig``: the RL shares compared, the seeds and the pipeline whose
teacher steps run), which pipelines.experiments.rl_split runs. It imports no torch, so ``--print-config`` and
config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.ads.pipeline_config import AdsPipelineConfig


@dataclass(frozen=True)
class RLSplitConfig:
    """The shares compared, the seeds and the pipeline whose teacher steps run."""

    out_dir: str = field(default="work/studies/rl-split", metadata={"help": "output folder"})
    rl_shares: tuple[float, ...] = field(default=(0.0, 0.5), metadata={"help": "teacher.rl_share values compared"})
    seeds: tuple[int, ...] = field(default=(0, 1, 2), metadata={"help": "seeds (SFT shuffling, RL sampling)"})
    experiment: str = field(default="rl_split", metadata={"help": "MLflow experiment of the runs"})
    pipeline: AdsPipelineConfig = field(
        default_factory=AdsPipelineConfig, metadata={"help": "the pipeline whose teacher steps run (data, teacher, RL)"}
    )

    def __post_init__(self) -> None:
        if not self.rl_shares or not self.seeds:
            raise ValueError("need at least one rl_share and one seed")
