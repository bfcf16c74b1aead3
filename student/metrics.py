"""Offline relevance metrics for graded query-ad labels, scikit-learn style: keyword-only arguments,
validated inputs, plain floats and dicts out.

- classification: ``accuracy``, ``macro_f1``, ``precision_recall_per_grade``;
- ranking a binary target: ``roc_auc`` (Mann-Whitney U with average ranks for ties, as
  ``sklearn.metrics.roc_auc_score``) and ``average_precision`` (PR-AUC as the step-wise sum
  sum_n (R_n - R_{n-1}) P_n over distinct score thresholds, as ``average_precision_score``);
  ``relevance_aucs`` applies both to "relevant" = grade >= ``relevant_from`` scored by P(grade >= it),
  and one-vs-rest per grade;
- ``ndcg_at_k``: mean over queries of DCG@k / IDCG@k with graded gains (``ESCI_GAINS`` by default:
  Exact 1.0, Substitute 0.1, Complement 0.01, Irrelevant 0) and log2 discounts; tied scores get the
  average gain of their tie group, as ``sklearn.metrics.ndcg_score``; a query whose items all have
  gain 0 scores 0, as there;
- ``expected_calibration_error``: top-label ECE over ``bins`` equal-width confidence bins,
  sum_b |B_b|/N * |accuracy(B_b) - confidence(B_b)|, with the bins for a reliability diagram.

Every function raises ``ValueError`` naming the argument for mismatched lengths, empty input, grades
outside the label set, probabilities that are not distributions, or non-finite scores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

ESCI_GAINS: dict[int, float] = {3: 1.0, 2: 0.1, 1: 0.01, 0: 0.0}


def _grades(name: str, values: Sequence[int], num_grades: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of grades, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must hold integer grades, got dtype {array.dtype}")
    bad = array[(array < 0) | (array >= num_grades)]
    if bad.size:
        raise ValueError(f"{name} has grade {int(bad[0])} outside 0..{num_grades - 1}")
    return array


def _same_length(**arrays: Sequence) -> None:
    lengths = {name: len(values) for name, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"mismatched lengths: {lengths}")


def _scores(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} has a non-finite value")
    return array


def _probabilities(probs: Sequence[Sequence[float]], num_grades: int | None = None) -> np.ndarray:
    array = np.asarray(probs, dtype=np.float64)
    if array.ndim != 2 or array.shape[0] == 0:
        raise ValueError(f"probs must be a non-empty [N, grades] array, got shape {array.shape}")
    if num_grades is not None and array.shape[1] != num_grades:
        raise ValueError(f"probs has {array.shape[1]} columns for {num_grades} grades")
    if not np.isfinite(array).all() or (array < 0).any() or not np.allclose(array.sum(1), 1.0, atol=1e-4):
        raise ValueError("probs rows must be finite, non-negative and sum to 1")
    return array


def accuracy(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> float:
    _same_length(y_true=y_true, y_pred=y_pred)
    return float((_grades("y_true", y_true, num_grades) == _grades("y_pred", y_pred, num_grades)).mean())


def confusion_matrix(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> list[list[int]]:
    """counts[gold][predicted]."""
    _same_length(y_true=y_true, y_pred=y_pred)
    truth, pred = _grades("y_true", y_true, num_grades), _grades("y_pred", y_pred, num_grades)
    counts = np.zeros((num_grades, num_grades), dtype=np.int64)
    np.add.at(counts, (truth, pred), 1)
    return counts.tolist()


def precision_recall_per_grade(
    *, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4
) -> dict[int, dict[str, float]]:
    """Per grade: precision, recall, F1 and support (0 where undefined, as sklearn's zero_division=0)."""
    counts = np.asarray(confusion_matrix(y_true=y_true, y_pred=y_pred, num_grades=num_grades))
    result = {}
    for g in range(num_grades):
        tp, predicted, support = counts[g, g], counts[:, g].sum(), counts[g, :].sum()
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        result[g] = {"precision": float(precision), "recall": float(recall), "f1": float(f1), "support": int(support)}
    return result


def macro_f1(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> float:
    """Unweighted mean of the per-grade F1 over every grade of the label set."""
    return macro_f1_from_confusion(confusion_matrix(y_true=y_true, y_pred=y_pred, num_grades=num_grades))


def macro_f1_from_confusion(confusion: Sequence[Sequence[int]], missed_by_gold: Sequence[int] | None = None) -> float:
    """Macro-F1 from counts[gold][predicted], F1 = 2tp / (2tp + fp + fn) per grade (0 without a true
    positive). ``missed_by_gold`` counts pairs of each gold grade that got no prediction (abstentions):
    they are misses (fn) of their grade. Lets a caller accumulate counts shard by shard."""
    counts = np.asarray(confusion, dtype=np.int64)
    missed = np.zeros(len(counts), dtype=np.int64) if missed_by_gold is None else np.asarray(missed_by_gold)
    tp = np.diag(counts)
    fp = counts.sum(0) - tp
    fn = counts.sum(1) - tp + missed
    f1 = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros(len(tp)), where=tp > 0)
    return float(f1.mean())


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2  # 1-based average rank of the tie group
            start = end
    return ranks


def roc_auc(*, y_true: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve of binary ``y_true`` (0/1) ranked by ``scores``."""
    _same_length(y_true=y_true, scores=scores)
    truth, score = _grades("y_true", y_true, 2), _scores("scores", scores)
    positives = int(truth.sum())
    negatives = len(truth) - positives
    if positives == 0 or negatives == 0:
        raise ValueError("roc_auc needs both classes in y_true")
    ranks = _average_ranks(score)
    return float((ranks[truth == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def average_precision(*, y_true: Sequence[int], scores: Sequence[float]) -> float:
    """PR-AUC as average precision over the distinct score thresholds, highest first."""
    _same_length(y_true=y_true, scores=scores)
    truth, score = _grades("y_true", y_true, 2), _scores("scores", scores)
    positives = int(truth.sum())
    if positives == 0:
        raise ValueError("average_precision needs at least one positive in y_true")
    order = np.argsort(-score, kind="mergesort")
    truth, score = truth[order], score[order]
    last_of_threshold = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]
    true_pos = np.cumsum(truth)[last_of_threshold]
    predicted = last_of_threshold + 1
    precision, recall = true_pos / predicted, true_pos / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def relevance_aucs(
    *, y_true: Sequence[int], probs: Sequence[Sequence[float]], relevant_from: int = 2
) -> dict[str, float]:
    """ROC-AUC and PR-AUC of "relevant" (grade >= ``relevant_from``, scored by the summed probability of
    those grades), and one-vs-rest ROC-AUC per grade present with its macro mean."""
    prob = _probabilities(probs)
    grades = prob.shape[1]
    _same_length(y_true=y_true, probs=prob)
    truth = _grades("y_true", y_true, grades)
    if not 0 < relevant_from < grades:
        raise ValueError(f"relevant_from must be in 1..{grades - 1}, got {relevant_from}")
    relevant = (truth >= relevant_from).astype(np.int64)
    score = prob[:, relevant_from:].sum(1)
    result = {"roc_auc_relevant": roc_auc(y_true=relevant, scores=score),
              "pr_auc_relevant": average_precision(y_true=relevant, scores=score)}  # fmt: skip
    per_grade = []
    for g in range(grades):
        target = (truth == g).astype(np.int64)
        if 0 < target.sum() < len(target):
            result[f"roc_auc_grade_{g}"] = roc_auc(y_true=target, scores=prob[:, g])
            per_grade.append(result[f"roc_auc_grade_{g}"])
    result["roc_auc_ovr_macro"] = float(np.mean(per_grade)) if per_grade else float("nan")
    return result


def _tie_averaged_dcg(gains: np.ndarray, scores: np.ndarray, discounts: np.ndarray) -> float:
    """DCG where items with equal scores share the mean gain of their group (order-free among ties)."""
    order = np.argsort(-scores, kind="mergesort")
    gains, scores = gains[order], scores[order]
    total, start = 0.0, 0
    for end in range(1, len(scores) + 1):
        if end == len(scores) or scores[end] != scores[start]:
            total += gains[start:end].mean() * discounts[start:end].sum()
            start = end
    return total


def ndcg_at_k(
    *,
    query_ids: Sequence[object],
    y_true: Sequence[int],
    scores: Sequence[float],
    k: int = 10,
    gains: Mapping[int, float] = ESCI_GAINS,
) -> float:
    """Mean NDCG@k over queries (items grouped by ``query_ids``), graded gains, log2 discounts."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    _same_length(query_ids=query_ids, y_true=y_true, scores=scores)
    if len(query_ids) == 0:
        raise ValueError("ndcg_at_k needs at least one query group with items (got no items)")
    truth, score = _grades("y_true", y_true, max(gains) + 1), _scores("scores", scores)
    missing = sorted(set(truth.tolist()) - set(gains))
    if missing:
        raise ValueError(f"gains has no value for grade(s) {missing}")
    gain = np.array([gains[g] for g in truth.tolist()], dtype=np.float64)
    groups: dict[object, list[int]] = {}
    for index, query in enumerate(query_ids):
        groups.setdefault(query, []).append(index)
    values = []
    for rows in groups.values():
        rows_array = np.asarray(rows)
        size = len(rows)
        discounts = np.zeros(size)
        top = min(k, size)
        discounts[:top] = 1 / np.log2(np.arange(2, top + 2))
        ideal = float(np.sum(np.sort(gain[rows_array])[::-1] * discounts))
        if ideal == 0:
            values.append(0.0)
            continue
        values.append(_tie_averaged_dcg(gain[rows_array], score[rows_array], discounts) / ideal)
    return float(np.mean(values))


def expected_calibration_error(
    *, y_true: Sequence[int], probs: Sequence[Sequence[float]], bins: int = 10
) -> tuple[float, list[dict[str, float]]]:
    """Top-label ECE and its bins (lower edge, count, mean confidence, accuracy) for a reliability diagram."""
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    prob = _probabilities(probs)
    _same_length(y_true=y_true, probs=prob)
    truth = _grades("y_true", y_true, prob.shape[1])
    confidence, predicted = prob.max(1), prob.argmax(1)
    correct = (predicted == truth).astype(np.float64)
    index = np.minimum((confidence * bins).astype(int), bins - 1)
    ece, table = 0.0, []
    for b in range(bins):
        members = index == b
        count = int(members.sum())
        if count:
            gap = abs(correct[members].mean() - confidence[members].mean())
            ece += count / len(truth) * gap
        table.append({
            "lower": b / bins,
            "count": count,
            "confidence": float(confidence[members].mean()) if count else math.nan,
            "accuracy": float(correct[members].mean()) if count else math.nan,
        })  # fmt: skip
    return float(ece), table
