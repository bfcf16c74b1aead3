"""Which baselines are fitted and scored beside every student (``BaselinesConfig``): names of
evaluation.baseline_registry, with the settings of those that have any; evaluation.zero_shot fits them. It imports no
torch or scikit-learn, so configs validate without them."""

from __future__ import annotations

from dataclasses import dataclass, field

from evaluation.baseline_registry import BASELINES, LexicalBaseline, ZeroShotBaseline
from evaluation.lexical_config import LexicalConfig

ZERO_SHOT, LEXICAL = ZeroShotBaseline.name, LexicalBaseline.name


@dataclass(frozen=True)
class BaselinesConfig:
    """Which baselines are fitted on the gold train pairs and scored beside every student."""

    names: tuple[str, ...] = field(
        default=(ZERO_SHOT, LEXICAL),
        metadata={"help": f"the baselines scored, in this order, from {list(BASELINES)}; empty: none"},
    )
    encoder: str = field(
        default="all-minilm-l6-v2",
        metadata={"help": "sentence encoder of the zero-shot baseline: a packaged name or a local model folder"},
    )
    lexical_model: LexicalConfig = field(
        default_factory=LexicalConfig, metadata={"help": "the lexical matcher's features and C"}
    )

    def __post_init__(self) -> None:
        unknown = [name for name in self.names if name not in BASELINES]
        if unknown or len(set(self.names)) != len(self.names):
            raise ValueError(f"baselines.names must be distinct names among {list(BASELINES)}, got {list(self.names)}")
