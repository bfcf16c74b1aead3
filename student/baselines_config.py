"""Which baselines are fitted and scored beside every student (``BaselinesConfig``), and their names and titles;
student.baselines fits them. It imports no torch or scikit-learn, so configs validate without them."""

from __future__ import annotations

from dataclasses import dataclass, field

from student.lexical_config import LexicalConfig

ZERO_SHOT, LEXICAL = "zero_shot", "lexical"


@dataclass(frozen=True)
class BaselinesConfig:
    """Which baselines are fitted on the gold train pairs and scored beside every student."""

    zero_shot: bool = field(
        default=True, metadata={"help": "the untrained sentence encoder's cosine, grades by an ordinal fit"}
    )
    encoder: str = field(
        default="all-minilm-l6-v2",
        metadata={"help": "sentence encoder of the zero-shot baseline: a packaged name or a local model folder"},
    )
    lexical: bool = field(default=True, metadata={"help": "the lexical matcher (match features + regression)"})
    lexical_model: LexicalConfig = field(default_factory=LexicalConfig, metadata={"help": "its features and C"})
