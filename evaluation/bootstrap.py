"""Paired bootstrap intervals of the difference between two models scored on the same gold pairs.

Pairs of one query are not independent (one query's ads share its wording and its raters), so the unit
resampled is the query: each of ``samples`` resamples draws as many queries as there are, with
replacement, and takes all their pairs. Both models are scored on the same resample (paired), and the
difference d* = metric(a) - metric(b) is recorded; the interval is the percentile interval of d* at
``confidence`` (2.5 % and 97.5 % quantiles for 0.95). The point value is the difference on all pairs.
With several models (``bootstrap_differences``) all share the resamples: each model is scored once per
resample and every pair's d* read from those scores: the figures each pair's own bootstrap gives.

Metrics (``METRICS``), both vectorised for speed and checked against scikit-learn by the tests:

- ``macro_f1``: of the argmax grade, over every grade 0..K-1, F1_k = 2 TP_k / (2 TP_k + FP_k + FN_k) and
  0 where a grade is neither true nor predicted (scikit-learn's ``zero_division=0``);
- ``roc_auc_relevant``: ROC-AUC of "relevant" (grade >= ``relevant_from``) scored by P(grade >=
  relevant_from), the Mann-Whitney U with average ranks for ties; a resample with one class only has no
  AUC and is left out (``samples_used`` counts the rest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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


def bootstrap_differences(
    *,
    y_true: Sequence[int],
    probs: Mapping[str, np.ndarray],
    groups: Sequence[str],
    metric: str,
    relevant_from: int = 2,
    samples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """``"<a> - <b>"`` -> {difference, low, high, samples_used}, for each model a of ``probs`` against every model
    after it, all on the same ``samples`` query resamples: each model is scored once per resample, so k models
    cost k scorings per resample, not k (k - 1)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {list(METRICS)}, got {metric!r}")
    y = np.asarray(y_true, dtype=np.int64)
    arrays = {name: np.asarray(p, dtype=np.float64) for name, p in probs.items()}
    shapes = {name: a.shape for name, a in arrays.items()}
    if any(len(a) != len(y) for a in arrays.values()) or len(groups) != len(y) or not len(y):
        raise ValueError(
            f"need one gold grade, group and probability row per pair for every model, got {len(y)} grades, "
            f"{len(groups)} groups, probabilities {shapes}"
        )
    if len(set(shapes.values())) > 1:
        raise ValueError(f"every model needs probabilities of one shape, got {shapes}")
    if samples < 1 or not 0 < confidence < 1:
        raise ValueError(f"need samples >= 1 and 0 < confidence < 1, got {samples}, {confidence}")
    score = METRICS[metric]
    _, group_of = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    members = [np.flatnonzero(group_of == g) for g in range(group_of.max() + 1)]
    rng = np.random.default_rng(seed)
    scored = {name: np.empty(samples) for name in arrays}
    for sample in range(samples):  # one resample at a time: samples x pairs indices never sit in memory together
        index = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        for name, a in arrays.items():
            scored[name][sample] = score(y, a, index, relevant_from)
    everything = np.arange(len(y))
    point = {name: score(y, a, everything, relevant_from) for name, a in arrays.items()}
    tail = (1 - confidence) / 2
    names = list(arrays)
    result = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            differences = scored[a] - scored[b]
            kept = differences[~np.isnan(differences)]
            low, high = np.quantile(kept, [tail, 1 - tail]).tolist() if kept.size else (float("nan"), float("nan"))
            result[f"{a} - {b}"] = {
                "difference": point[a] - point[b],
                "low": low,
                "high": high,
                "samples_used": int(kept.size),
            }
    return result
