"""The lexical baseline every student is compared with: TF-IDF n-grams + logistic regression.

Each pair becomes one text, ``query + " | " + ad_title``, lower-cased, and two TF-IDF blocks
(scikit-learn ``TfidfVectorizer``, sublinear tf, each row L2-normalised) side by side:

    x = [ tfidf(word 1..word_max_n-grams) ; tfidf(char_wb char_min_n..char_max_n-grams) ]

A multinomial logistic regression (``LogisticRegression``, lbfgs, L2 penalty of strength 1/C) learns
P(grade | x), minimising sum_i w_i * c_{y_i} * -log p(y_i | x_i) + ||W||^2 / (2C), where w_i is the pair's
sample weight (the teacher's confidence, as the distiller weights it) and c_y is 1, or n / (K * n_y) with
``class_weight: balanced``. ``predict_proba`` returns one column per grade 0..num_grades-1; a grade absent
from the training labels gets probability 0. Training labels of a single grade give a defined constant
model (that grade with probability 1: the majority baseline), flagged by ``single_grade``. The fit is
deterministic: the vocabulary is sorted and lbfgs has no randomness (``seed`` is passed on regardless).

It is a bag of n-grams: it sees which words occur, not whether the ad matches the query, so a student that
cannot beat it has not learned the query-ad relation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import hstack
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression

CLASS_WEIGHTS = (None, "balanced")


@dataclass(frozen=True)
class LexicalConfig:
    """Features and regularisation of the TF-IDF + logistic-regression baseline."""

    word_max_n: int = field(default=2, metadata={"help": "word n-grams 1..this"})
    char_min_n: int = field(default=2, metadata={"help": "shortest character n-gram (char_wb, within words)"})
    char_max_n: int = field(default=5, metadata={"help": "longest character n-gram"})
    c: float = field(default=1.0, metadata={"help": "inverse L2 regularisation strength C of the regression"})
    class_weight: str | None = field(
        default=None, metadata={"help": "null: every pair by its sample weight only; balanced: also n / (K n_grade)"}
    )
    max_iter: int = field(default=2000, metadata={"help": "most lbfgs iterations"})
    seed: int = field(default=0, metadata={"help": "random_state of the regression"})

    def __post_init__(self) -> None:
        if self.word_max_n < 1 or not 1 <= self.char_min_n <= self.char_max_n:
            raise ValueError(
                f"need word_max_n >= 1 and 1 <= char_min_n <= char_max_n, got {self.word_max_n}, "
                f"{self.char_min_n}, {self.char_max_n}"
            )
        if not self.c > 0 or self.max_iter < 1:
            raise ValueError(f"c must be > 0 and max_iter >= 1, got {self.c}, {self.max_iter}")
        if self.class_weight not in CLASS_WEIGHTS:
            raise ValueError(f"class_weight must be one of {list(CLASS_WEIGHTS)}, got {self.class_weight!r}")


def pair_texts(queries: Sequence[str], ads: Sequence[str]) -> list[str]:
    if len(queries) != len(ads):
        raise ValueError(f"mismatched lengths: queries {len(queries)}, ads {len(ads)}")
    return [f"{q} | {a}" for q, a in zip(queries, ads, strict=True)]


class LexicalBaseline:
    """TF-IDF (word + character n-grams) + logistic regression over the grades (module docstring)."""

    def __init__(self, num_grades: int, config: LexicalConfig | None = None) -> None:
        if num_grades < 2:
            raise ValueError(f"num_grades must be >= 2, got {num_grades}")
        self.num_grades, self.config = num_grades, config or LexicalConfig()
        self.single_grade: int | None = None
        self._model: LogisticRegression | None = None

    def fit(
        self,
        queries: Sequence[str],
        ads: Sequence[str],
        grades: Sequence[int],
        sample_weight: Sequence[float] | None = None,
    ) -> LexicalBaseline:
        texts = pair_texts(queries, ads)
        y = np.asarray(grades)
        if y.size == 0 or y.size != len(texts):
            raise ValueError(f"need one grade per pair and at least one pair, got {y.size} grades, {len(texts)} pairs")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= self.num_grades:
            raise ValueError(f"grades must be integers in 0..{self.num_grades - 1}, got {sorted(set(y.tolist()))}")
        weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if weights is not None and (weights.shape != y.shape or (weights < 0).any() or not weights.sum() > 0):
            raise ValueError("sample_weight must hold one non-negative weight per pair, not all zero")
        if np.unique(y).size == 1:
            self.single_grade, self._model = int(y[0]), None
            return self
        c = self.config
        self._word = TfidfVectorizer(lowercase=True, ngram_range=(1, c.word_max_n), sublinear_tf=True)
        self._char = TfidfVectorizer(
            lowercase=True, analyzer="char_wb", ngram_range=(c.char_min_n, c.char_max_n), sublinear_tf=True
        )
        x = hstack([self._word.fit_transform(texts), self._char.fit_transform(texts)]).tocsr()
        self._model = LogisticRegression(
            C=c.c, class_weight=c.class_weight, max_iter=c.max_iter, random_state=c.seed, solver="lbfgs"
        )
        self._model.fit(x, y, sample_weight=weights)
        self.single_grade = None
        return self

    def predict_proba(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        """(pairs, num_grades) grade distributions."""
        texts = pair_texts(queries, ads)
        probs = np.zeros((len(texts), self.num_grades))
        if self.single_grade is not None:
            probs[:, self.single_grade] = 1.0
            return probs
        if self._model is None:
            raise RuntimeError("fit the lexical baseline before predicting")
        x = hstack([self._word.transform(texts), self._char.transform(texts)]).tocsr()
        probs[:, self._model.classes_] = self._model.predict_proba(x)
        return probs

    def predict(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        return self.predict_proba(queries, ads).argmax(1)
