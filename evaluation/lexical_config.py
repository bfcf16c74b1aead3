"""The lexical matcher's settings (``LexicalConfig``: BM25, character n-grams, the regression); evaluation.lexical
fits it. Needs no scikit-learn, so configs validate without it."""

from __future__ import annotations

from dataclasses import dataclass, field

CLASS_WEIGHTS = (None, "balanced")
KIND = "lexical"  # the student_kind in a saved matcher's config.json (evaluation.predictors reads it)
STATE_FILE = "lexical.json"  # a saved matcher's whole fitted state (evaluation.lexical)


@dataclass(frozen=True)
class LexicalConfig:
    """Match features and the regression of the lexical matcher."""

    k1: float = field(default=1.2, metadata={"help": "BM25 term-frequency saturation k1"})
    b: float = field(default=0.75, metadata={"help": "BM25 length normalisation b (0: none, 1: full)"})
    char_min_n: int = field(default=3, metadata={"help": "shortest character n-gram (char_wb, within words)"})
    char_max_n: int = field(default=5, metadata={"help": "longest character n-gram"})
    c: float = field(default=1.0, metadata={"help": "inverse L2 regularisation strength C of the regression"})
    class_weight: str | None = field(
        default=None, metadata={"help": "null: every pair by its sample weight only; balanced: also n / (K n_grade)"}
    )
    max_iter: int = field(default=2000, metadata={"help": "most lbfgs iterations"})
    seed: int = field(default=0, metadata={"help": "random_state of the regression"})

    def __post_init__(self) -> None:
        if not self.k1 >= 0 or not 0 <= self.b <= 1:
            raise ValueError(f"need k1 >= 0 and 0 <= b <= 1, got {self.k1}, {self.b}")
        if not 1 <= self.char_min_n <= self.char_max_n:
            raise ValueError(f"need 1 <= char_min_n <= char_max_n, got {self.char_min_n}, {self.char_max_n}")
        if not self.c > 0 or self.max_iter < 1:
            raise ValueError(f"c must be > 0 and max_iter >= 1, got {self.c}, {self.max_iter}")
        if self.class_weight not in CLASS_WEIGHTS:
            raise ValueError(f"class_weight must be one of {list(CLASS_WEIGHTS)}, got {self.class_weight!r}")
