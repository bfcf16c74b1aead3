"""Paired bootstrap intervals of the difference between two models scored on the same gold pairs.

Pairs of one query are not independent (one query's ads share its wording and its raters), so the unit
resampled is the query: each of ``samples`` resamples draws as many queries as there are, with
replacement, and takes all their pairs. Both models are scored on the same resample (paired), and the
difference d* = metric(a) - metric(b) is recorded; the interval is the percentile interval of d* at
``confidence`` (2.5 % and 97.5 % quantiles for 0.95). The point value is the difference on all pairs.

Metrics (``METRICS``), both vectorised for speed and checked against scikit-learn by the tests:

- ``macro_f1``: of the argmax grade, over every grade 0..K-1, F1_k = 2 TP_k / (2 TP_k + FP_k + FN_k) and
  0 where a grade is neither true nor predicted (scikit-learn's ``zero_division=0``);
- ``roc_auc_relevant``: ROC-AUC of "relevant" (grade >= ``relevant_from``) scored by P(grade >=
  relevant_from), the Mann-Whitney U with average ranks for ties; a resample with one class only has no
  AUC and is left out (``samples_used`` counts the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata

Metric = Callable[[np.ndarray, np.ndarray, np.ndarray], float]


def macro_f1(y_true: np.ndarray, probs: np.ndarray, index: np.ndarray, relevant_from: int = 2) -> float:
    """Macro-F1 of ``probs``' argmax on the rows ``index`` (module docstring)."""
    grades = probs.shape[1]
    counts = np.bincount(y_true[index] * grades + probs[index].argmax(1), minlength=grades * grades)
    confusion = counts.reshape(grades, grades)
    tp = np.diag(confusion).astype(np.float64)
    denominator = confusion.sum(0) + confusion.sum(1)  # 2 TP + FP + FN
    return float(np.where(denominator > 0, 2 * tp / np.maximum(denominator, 1), 0.0).mean())


def roc_auc_relevant(y_true: np.ndarray, probs: np.ndarray, index: np.ndarray, relevant_from: int = 2) -> float:
    """ROC-AUC of grade >= ``relevant_from`` by P(grade >= relevant_from) on the rows ``index``; nan with
    one class only."""
    positive = y_true[index] >= relevant_from
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if not n_pos or not n_neg:
        return float("nan")
    ranks = rankdata(probs[index, relevant_from:].sum(1))
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


METRICS: dict[str, Callable[..., float]] = {"macro_f1": macro_f1, "roc_auc_relevant": roc_auc_relevant}


def paired_bootstrap(
    *,
    y_true: Sequence[int],
    probs_a: np.ndarray,
    probs_b: np.ndarray,
    groups: Sequence[str],
    metric: str,
    relevant_from: int = 2,
    samples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """{difference, low, high, samples_used} of metric(a) - metric(b) (module docstring)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    y = np.asarray(y_true, dtype=np.int64)
    a, b = np.asarray(probs_a, dtype=np.float64), np.asarray(probs_b, dtype=np.float64)
    if not (len(y) == len(a) == len(b) == len(groups)) or not len(y) or a.shape != b.shape:
        raise ValueError(
            f"need one gold grade, group and probability row per pair for both models, got {len(y)} grades, "
            f"{len(groups)} groups, probabilities {a.shape} and {b.shape}"
        )
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {samples}, {confidence}")
    score = METRICS[metric]
    _, group_of = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    members = [np.flatnonzero(group_of == g) for g in range(group_of.max() + 1)]
    rng = np.random.default_rng(seed)
    everything = np.arange(len(y))
    differences = []
    for _ in range(samples):
        index = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        differences.append(score(y, a, index, relevant_from) - score(y, b, index, relevant_from))
    kept = np.asarray([d for d in differences if not np.isnan(d)])
    tail = (1 - confidence) / 2
    low, high = (np.quantile(kept, [tail, 1 - tail]).tolist()) if kept.size else (float("nan"), float("nan"))
    return {
        "difference": score(y, a, everything, relevant_from) - score(y, b, everything, relevant_from),
        "low": low,
        "high": high,
        "samples_used": int(kept.size),
    }
