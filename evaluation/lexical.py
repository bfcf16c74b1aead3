"""The lexical matcher every student is compared with: query-ad match features + logistic regression.

What a search team builds first without any neural model. Each (query, ad) pair becomes ``FEATURES``:

- ``bm25``: Okapi BM25 of the query's distinct terms against the ad title, with the document frequencies
  and mean length of the distinct ad titles seen in ``fit``:
  sum_t idf(t) * tf(t, ad) * (k1 + 1) / (tf(t, ad) + k1 * (1 - b + b * |ad| / avgdl)),
  idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5))   (Lucene's form, never negative);
- ``word_cosine`` / ``char_cosine``: cosine of the query's and the ad's TF-IDF vectors (scikit-learn
  ``TfidfVectorizer``, sublinear tf, fitted on the queries and ads of ``fit``) over words and over
  ``char_wb`` n-grams ``char_min_n..char_max_n`` (typos, plurals, units glued to numbers);
- ``query_coverage``: share of the query's distinct terms found in the ad; ``jaccard``: |Q & A| / |Q | A|;
- ``number_overlap``: share of the query's numbers (model numbers, sizes) found among the ad's, with
  ``query_has_number`` (1 when the query holds a number; the overlap is 0 otherwise);
- ``brand_match``: 1 when the ad title's first term (catalog titles start with the brand) is a query term;
- ``query_length`` / ``ad_length``: ln(1 + terms).

Terms are lower-cased runs of letters and digits (``\\w+``); numbers are runs of digits with an optional
decimal part. The features are standardised (``StandardScaler``) and a multinomial logistic regression
(lbfgs, L2 penalty of strength 1/C; ``class_weight: balanced`` optional) learns P(grade | features) from
graded pairs, minimising sum_i w_i * -log p(y_i | x_i) + ||W||^2 / (2C). ``predict_proba`` returns one
column per grade 0..num_grades-1 (a grade absent from training gets 0); training grades of a single value
give the constant model (``single_grade``). The fit is deterministic.

``save`` writes a fitted matcher as one JSON file (``lexical.json``: BM25's statistics, both vocabularies and
their idf, the scaler, the regression's weights) and ``load`` reads it back into a matcher that predicts the
same probabilities: plain numbers, no pickle, so loading a matcher runs no code from its folder. Beside it goes
the ``config.json`` every saved model folder of this project has (``student_kind: lexical``, the grade names),
so it is served, scored and registered like a student (evaluation.predictors).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from evaluation.lexical_config import KIND, STATE_FILE, LexicalConfig
from student.model_config import load_state, save_state

FEATURES = (
    "bm25",
    "word_cosine",
    "char_cosine",
    "query_coverage",
    "jaccard",
    "number_overlap",
    "query_has_number",
    "brand_match",
    "query_length",
    "ad_length",
)
FORMAT = "agpo-lexical-matcher/1"
TERM = re.compile(r"\w+")
NUMBER = re.compile(r"\d+(?:[.,]\d+)?")


def terms(text: str) -> list[str]:
    return TERM.findall(text.lower())


class Bm25:
    """Okapi BM25 (module docstring) with document statistics of the given ad titles."""

    def __init__(self, documents: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        distinct = [terms(d) for d in dict.fromkeys(documents)]
        if not distinct:
            raise ValueError("BM25 needs at least one document")
        self.k1, self.b, self.documents = k1, b, len(distinct)
        self.mean_length = max(sum(len(d) for d in distinct) / len(distinct), 1e-9)
        self.frequency = Counter(t for d in distinct for t in set(d))

    def idf(self, term: str) -> float:
        n = self.frequency.get(term, 0)
        return math.log(1 + (self.documents - n + 0.5) / (n + 0.5))

    def score(self, query: str, ad: str) -> float:
        ad_terms = terms(ad)
        counts = Counter(ad_terms)
        norm = self.k1 * (1 - self.b + self.b * len(ad_terms) / self.mean_length)
        return sum(self.idf(t) * counts[t] * (self.k1 + 1) / (counts[t] + norm) for t in dict.fromkeys(terms(query)))

    def state(self) -> dict[str, Any]:
        return {
            "k1": self.k1,
            "b": self.b,
            "documents": self.documents,
            "mean_length": self.mean_length,
            "frequency": dict(self.frequency),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Bm25:
        bm25 = cls.__new__(cls)
        bm25.k1, bm25.b, bm25.documents = state["k1"], state["b"], state["documents"]
        bm25.mean_length, bm25.frequency = state["mean_length"], Counter(state["frequency"])
        return bm25


def overlap_features(query: str, ad: str) -> dict[str, float]:
    """The features of the module docstring that need no fitted statistics."""
    q, a = set(terms(query)), set(terms(ad))
    q_numbers, a_numbers = set(NUMBER.findall(query)), set(NUMBER.findall(ad))
    first = terms(ad)[:1]
    return {
        "query_coverage": len(q & a) / len(q) if q else 0.0,
        "jaccard": len(q & a) / len(q | a) if q | a else 0.0,
        "number_overlap": len(q_numbers & a_numbers) / len(q_numbers) if q_numbers else 0.0,
        "query_has_number": float(bool(q_numbers)),
        "brand_match": float(bool(first) and first[0] in q),
        "query_length": math.log1p(len(terms(query))),
        "ad_length": math.log1p(len(terms(ad))),
    }


def _row_cosine(vectorizer: TfidfVectorizer, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
    """Cosine of each query's and ad's TF-IDF rows (the vectorizer L2-normalises every row)."""
    product = vectorizer.transform(queries).multiply(vectorizer.transform(ads))
    return np.asarray(product.sum(1)).ravel()


class LexicalMatcher:
    """Match features + logistic regression over the grades (module docstring)."""

    backend = "scikit-learn"  # what scores it (evaluation.predictors.backend_of)

    def __init__(self, num_grades: int, config: LexicalConfig | None = None) -> None:
        if num_grades < 2:
            raise ValueError(f"num_grades must be >= 2, got {num_grades}")
        self.num_grades, self.config = num_grades, config or LexicalConfig()
        self.single_grade: int | None = None
        self._model: LogisticRegression | None = None

    def features(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        """[pairs, len(FEATURES)] match features, columns in ``FEATURES`` order (needs ``fit`` first)."""
        if len(queries) != len(ads):
            raise ValueError(f"mismatched lengths: queries {len(queries)}, ads {len(ads)}")
        if not hasattr(self, "_bm25"):
            raise RuntimeError("fit the lexical matcher before computing its features")
        if not len(queries):
            return np.zeros((0, len(FEATURES)))
        overlaps = [overlap_features(q, a) for q, a in zip(queries, ads, strict=True)]
        columns = {
            "bm25": [self._bm25.score(q, a) for q, a in zip(queries, ads, strict=True)],
            "word_cosine": _row_cosine(self._word, queries, ads),
            "char_cosine": _row_cosine(self._char, queries, ads),
            **{name: [o[name] for o in overlaps] for name in overlaps[0]},
        }
        return np.column_stack([np.asarray(columns[name], dtype=np.float64) for name in FEATURES])

    def fit(
        self,
        queries: Sequence[str],
        ads: Sequence[str],
        grades: Sequence[int],
        sample_weight: Sequence[float] | None = None,
    ) -> LexicalMatcher:
        y = np.asarray(grades)
        if y.size == 0 or y.size != len(queries) or len(queries) != len(ads):
            raise ValueError(
                f"need one grade per pair and at least one pair, got {y.size} grades, {len(queries)} queries, "
                f"{len(ads)} ads"
            )
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= self.num_grades:
            raise ValueError(f"grades must be integers in 0..{self.num_grades - 1}, got {sorted(set(y.tolist()))}")
        weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if weights is not None and (weights.shape != y.shape or (weights < 0).any() or not weights.sum() > 0):
            raise ValueError("sample_weight must hold one non-negative weight per pair, not all zero")
        c = self.config
        texts = [*queries, *ads]
        self._bm25 = Bm25(ads, c.k1, c.b)
        self._word = TfidfVectorizer(analyzer=terms, sublinear_tf=True).fit(texts)
        self._char = TfidfVectorizer(
            lowercase=True, analyzer="char_wb", ngram_range=(c.char_min_n, c.char_max_n), sublinear_tf=True
        ).fit(texts)
        if np.unique(y).size == 1:
            self.single_grade, self._model = int(y[0]), None
            return self
        x = self.features(queries, ads)
        self._scaler = StandardScaler().fit(x)
        self._model = LogisticRegression(
            C=c.c, class_weight=c.class_weight, max_iter=c.max_iter, random_state=c.seed, solver="lbfgs"
        )
        self._model.fit(self._scaler.transform(x), y, sample_weight=weights)
        self.single_grade = None
        return self

    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """(pairs, num_grades) grade distributions, ``batch_size`` pairs at a time (bounds the sparse TF-IDF
        matrices' memory on a large input)."""
        probs = np.zeros((len(queries), self.num_grades))
        if self.single_grade is not None:
            probs[:, self.single_grade] = 1.0
            return probs
        if self._model is None:
            raise RuntimeError("fit the lexical matcher before predicting")
        for start in range(0, len(queries), batch_size):
            rows = slice(start, start + batch_size)
            x = self._scaler.transform(self.features(queries[rows], ads[rows]))
            probs[rows, self._model.classes_] = self._model.predict_proba(x)
        return probs

    def predict(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        return self.predict_proba(queries, ads).argmax(1)

    def save(self, directory: str | Path) -> Path:
        """The fitted matcher as ``directory/lexical.json`` (module docstring); returns the folder."""
        if not hasattr(self, "_bm25"):
            raise RuntimeError("fit the lexical matcher before saving it")
        state: dict[str, Any] = {
            "format": FORMAT,
            "num_grades": self.num_grades,
            "config": asdict(self.config),
            "single_grade": self.single_grade,
            "bm25": self._bm25.state(),
            "word": _vectorizer_state(self._word),
            "char": _vectorizer_state(self._char),
        }
        if self._model is not None:
            state["scaler"] = {"mean": self._scaler.mean_.tolist(), "scale": self._scaler.scale_.tolist()}
            state["regression"] = {
                "classes": self._model.classes_.tolist(),
                "coef": self._model.coef_.tolist(),
                "intercept": self._model.intercept_.tolist(),
            }
        return save_state(directory, KIND, STATE_FILE, state)

    @classmethod
    def load(cls, directory: str | Path) -> LexicalMatcher:
        """A matcher saved by ``save``; a folder without ``lexical.json`` or of another format is an error."""
        state = load_state(directory, STATE_FILE, FORMAT, "lexical matcher")
        matcher = cls(state["num_grades"], LexicalConfig(**state["config"]))
        matcher.single_grade = state["single_grade"]
        matcher._bm25 = Bm25.from_state(state["bm25"])
        matcher._word = _vectorizer(TfidfVectorizer(analyzer=terms, sublinear_tf=True), state["word"])
        c = matcher.config
        char = TfidfVectorizer(
            lowercase=True, analyzer="char_wb", ngram_range=(c.char_min_n, c.char_max_n), sublinear_tf=True
        )
        matcher._char = _vectorizer(char, state["char"])
        if "regression" in state:
            matcher._scaler = StandardScaler()
            matcher._scaler.mean_ = np.asarray(state["scaler"]["mean"])
            matcher._scaler.scale_ = np.asarray(state["scaler"]["scale"])
            matcher._scaler.n_features_in_ = len(FEATURES)
            model = LogisticRegression()
            model.classes_ = np.asarray(state["regression"]["classes"])
            model.coef_ = np.asarray(state["regression"]["coef"])
            model.intercept_ = np.asarray(state["regression"]["intercept"])
            model.n_features_in_ = len(FEATURES)
            matcher._model = model
        return matcher


def _vectorizer_state(vectorizer: TfidfVectorizer) -> dict[str, Any]:
    return {"vocabulary": {t: int(i) for t, i in vectorizer.vocabulary_.items()}, "idf": vectorizer.idf_.tolist()}


def _vectorizer(vectorizer: TfidfVectorizer, state: dict[str, Any]) -> TfidfVectorizer:
    """``vectorizer`` (unfitted, with the saved one's settings) holding the saved vocabulary and idf."""
    vectorizer.set_params(vocabulary=state["vocabulary"])
    vectorizer.idf_ = np.asarray(state["idf"])
    return vectorizer
