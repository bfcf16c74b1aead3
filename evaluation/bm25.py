"""The BM25 baseline: Okapi BM25 of the ad title for the query (``rank_bm25.BM25Okapi``), mapped to grades.

What a search team has before any learned model: a term-matching score. ``fit`` on the gold train pairs:

1. BM25 statistics: ``BM25Okapi`` over the distinct ad titles, terms as the lexical matcher splits them
   (evaluation.lexical.terms), ``k1``, ``b`` and idf(t) = ln((N - n_t + 0.5) / (n_t + 0.5)), floored at 0.25 x
   the mean idf (rank_bm25's ATIRE form);
2. a pair's score s = sum over the query's terms of idf(t) * tf(t, ad) * (k1 + 1) / (tf + k1 * (1 - b + b *
   |ad| / avgdl)): ``BM25Okapi.get_scores`` with the ad as a one-document corpus under the fitted idf and avgdl;
3. grades: a multinomial logistic regression (scikit-learn, lbfgs, L2 of strength 1/``c``) on the standardised
   score z = (s - mean) / sd, so P(grade | s) is a softmax of ``coef * z + intercept`` (a sigmoid for two
   grades); a grade absent from training gets 0, one training grade the constant model.

``save`` writes ``bm25.json`` (idf, avgdl, k1, b, the standardisation, the regression's numbers: plain JSON,
no pickle) and the ``config.json`` every model folder has (``student_kind: bm25``); ``load`` reads it back and
predicts the same probabilities (rank_bm25's scorer under the saved statistics, the softmax in numpy), so the
served pyfunc scores it as evaluate did.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from compute.placement import ON_CPU, Placement
from evaluation.baseline_registry import register_baseline
from student.model_config import load_state, save_state

KIND, STATE_FILE, FORMAT = "bm25", "bm25.json", "agpo-bm25/1"


class Bm25Matcher:
    """BM25 score -> grade probabilities (module docstring)."""

    backend = "rank-bm25"

    def __init__(self, num_grades: int, k1: float = 1.5, b: float = 0.75, c: float = 1.0) -> None:
        if num_grades < 2:
            raise ValueError(f"num_grades must be >= 2, got {num_grades}")
        self.num_grades, self.state = num_grades, {"k1": k1, "b": b, "c": c}

    def scores(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        """The BM25 score of each ad for its query (needs ``fit`` first)."""
        if "idf" not in self.state:
            raise RuntimeError("fit the BM25 baseline before scoring with it")
        from rank_bm25 import BM25Okapi

        from evaluation.lexical import terms

        scorer = BM25Okapi.__new__(BM25Okapi)  # the fitted statistics, one ad at a time as its corpus
        scorer.k1, scorer.b, scorer.idf, scorer.avgdl = (self.state[k] for k in ("k1", "b", "idf", "avgdl"))
        scorer.corpus_size = 1
        out = np.zeros(len(queries))
        for i, (query, ad) in enumerate(zip(queries, ads, strict=True)):
            ad_terms = terms(ad)
            scorer.doc_freqs, scorer.doc_len = [Counter(ad_terms)], [len(ad_terms)]
            out[i] = scorer.get_scores(terms(query))[0]
        return out

    def fit(self, queries: Sequence[str], ads: Sequence[str], grades: Sequence[int]) -> Bm25Matcher:
        if not len(grades) or len(grades) != len(queries) or len(queries) != len(ads):
            raise ValueError(
                f"need as many queries, ads and grades (>= 1), got {len(queries)}, {len(ads)}, {len(grades)}"
            )
        from rank_bm25 import BM25Okapi
        from sklearn.linear_model import LogisticRegression

        from evaluation.lexical import terms

        corpus = BM25Okapi([terms(ad) for ad in dict.fromkeys(ads)], k1=self.state["k1"], b=self.state["b"])
        self.state.update(idf=dict(corpus.idf), avgdl=max(corpus.avgdl, 1e-9))
        s, y = self.scores(queries, ads), np.asarray(grades)
        self.state.update(mean=float(s.mean()), sd=float(s.std()) or 1.0, classes=sorted(set(y.tolist())))
        if len(self.state["classes"]) > 1:
            model = LogisticRegression(C=self.state["c"], max_iter=1000).fit(self._standardised(s), y)
            self.state.update(coef=model.coef_.ravel().tolist(), intercept=model.intercept_.tolist())
        return self

    def _standardised(self, s: np.ndarray) -> np.ndarray:
        return ((s - self.state["mean"]) / self.state["sd"])[:, None]

    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 4096) -> np.ndarray:
        """(pairs, num_grades) grade distributions (``batch_size`` is the predictor API's; BM25 needs none)."""
        classes = self.state.get("classes")
        if classes is None:
            raise RuntimeError("fit the BM25 baseline before predicting")
        probs = np.zeros((len(queries), self.num_grades))
        if len(classes) == 1:
            probs[:, classes[0]] = 1.0
            return probs
        logits = (
            self._standardised(self.scores(queries, ads)) * np.asarray(self.state["coef"]) + self.state["intercept"]
        )
        if len(classes) == 2:  # scikit-learn's binary model: one logit, of the second class
            logits = np.hstack([np.zeros_like(logits), logits])
        exp = np.exp(logits - logits.max(1, keepdims=True))
        probs[:, classes] = exp / exp.sum(1, keepdims=True)
        return probs

    def save(self, directory: str | Path) -> Path:
        """The fitted baseline as ``directory/bm25.json`` and its ``config.json`` (module docstring)."""
        if "classes" not in self.state:
            raise RuntimeError("fit the BM25 baseline before saving it")
        return save_state(directory, KIND, STATE_FILE, {"format": FORMAT, "num_grades": self.num_grades, **self.state})

    @classmethod
    def load(cls, directory: str | Path) -> Bm25Matcher:
        """A baseline saved by ``save``; a folder without ``bm25.json`` or of another format is an error."""
        state = load_state(directory, STATE_FILE, FORMAT, "BM25 baseline")
        del state["format"]
        matcher = cls(state.pop("num_grades"))
        matcher.state = state
        return matcher


@register_baseline
class Bm25Baseline:
    """Okapi BM25 from rank_bm25, grades by a logistic regression on its score (module docstring)."""

    name, title, backend, saved_as_student = KIND, "BM25 (rank-bm25)", Bm25Matcher.backend, False
    library, state_file = "rank_bm25", STATE_FILE
    loads_as = "`Bm25Matcher.load(folder)` of `evaluation/bm25.py` (rank-bm25 and numpy; `bm25.json` is its state)"
    code = ("lexical.py", "lexical_config.py")  # evaluation.lexical.terms splits the terms
    requirements = ("rank-bm25", "scikit-learn", "scipy")

    @staticmethod
    def fit(config: Any, rows: Sequence[dict[str, Any]], num_grades: int, placement: Placement = ON_CPU) -> Any:
        queries, ads, grades = ([r[key] for r in rows] for key in ("query", "ad_title", "gold_grade"))
        return Bm25Matcher(num_grades).fit(queries, ads, grades)

    @staticmethod
    def load(folder: Path) -> Any:
        return Bm25Matcher.load(folder)
