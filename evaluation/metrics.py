"""Offline relevance metrics for graded query-ad labels: scikit-learn's own metrics behind thin,
keyword-only, validated wrappers; hand-written only where scikit-learn has no equivalent.

- classification: ``accuracy`` (``sklearn.metrics.accuracy_score``), ``macro_f1`` (``f1_score``,
  ``average="macro"`` over every grade of the label set, ``zero_division=0``),
  ``precision_recall_per_grade`` (``precision_recall_fscore_support``), ``confusion_matrix``;
  ``macro_f1_from_confusion`` is the same macro-F1 from accumulated counts (with abstentions as misses);
  ``cohen_kappa`` (``cohen_kappa_score``): agreement of two raters beyond chance (teacher vs human review);
- ranking a binary target: ``roc_auc`` (``roc_auc_score``: Mann-Whitney U with average ranks for ties)
  and ``average_precision`` (``average_precision_score``: PR-AUC as the step-wise sum
  sum_n (R_n - R_{n-1}) P_n over distinct score thresholds); ``relevance_aucs`` applies both to
  "relevant" = grade >= ``relevant_from`` scored by P(grade >= it), and one-vs-rest ROC-AUC per grade
  present in ``y_true`` (sklearn's multi-class ``roc_auc_score`` needs every grade present);
- ``ndcg_at_k``: mean over queries of DCG@k / IDCG@k with graded gains (``ESCI_GAINS`` by default:
  Exact 1.0, Substitute 0.1, Complement 0.01, Irrelevant 0) and log2 discounts, by ``ndcg_score`` per
  query: queries are ragged groups, so queries of one size go to sklearn together; tied scores get the
  average gain of their tie group, and a query whose items all have gain 0 scores 0, as there; a query of
  one item (which sklearn refuses) scores 1 when its gain is positive, else 0;
- ``expected_calibration_error`` (no sklearn equivalent for several grades): top-label ECE over ``bins``
  equal-width confidence bins, sum_b |B_b|/N * |accuracy(B_b) - confidence(B_b)|, with the bins for a
  reliability diagram.

Every function raises ``ValueError`` naming the argument for mismatched lengths, empty input, grades
outside the label set, probabilities that are not distributions, or non-finite scores. All take keyword
arguments only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from sklearn import metrics as skm

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


def _predictions(y_true: Sequence[int], y_pred: Sequence[int], num_grades: int) -> tuple[np.ndarray, np.ndarray]:
    _same_length(y_true=y_true, y_pred=y_pred)
    return _grades("y_true", y_true, num_grades), _grades("y_pred", y_pred, num_grades)


def _binary(y_true: Sequence[int], scores: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    _same_length(y_true=y_true, scores=scores)
    return _grades("y_true", y_true, 2), _scores("scores", scores)


def accuracy(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> float:
    truth, pred = _predictions(y_true, y_pred, num_grades)
    return float(skm.accuracy_score(truth, pred))


def confusion_matrix(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> list[list[int]]:
    """counts[gold][predicted], every grade of the label set a row and a column."""
    truth, pred = _predictions(y_true, y_pred, num_grades)
    return skm.confusion_matrix(truth, pred, labels=np.arange(num_grades)).tolist()


def precision_recall_per_grade(
    *, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4
) -> dict[int, dict[str, float]]:
    """Per grade: precision, recall, F1 and support (0 where undefined: ``zero_division=0``)."""
    truth, pred = _predictions(y_true, y_pred, num_grades)
    precision, recall, f1, support = skm.precision_recall_fscore_support(
        truth, pred, labels=np.arange(num_grades), zero_division=0
    )
    return {
        g: {
            "precision": float(precision[g]),
            "recall": float(recall[g]),
            "f1": float(f1[g]),
            "support": int(support[g]),
        }
        for g in range(num_grades)
    }


def macro_f1(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> float:
    """Unweighted mean of the per-grade F1 over every grade of the label set (0 for a grade never true
    nor predicted)."""
    truth, pred = _predictions(y_true, y_pred, num_grades)
    return float(skm.f1_score(truth, pred, labels=np.arange(num_grades), average="macro", zero_division=0))


def cohen_kappa(*, y_true: Sequence[int], y_pred: Sequence[int], num_grades: int = 4) -> float | None:
    """Cohen's kappa (``cohen_kappa_score``, unweighted): (p_o - p_e) / (1 - p_e), observed agreement p_o
    against the agreement p_e two raters with these marginals reach by chance. None where it is undefined
    (p_e = 1: both raters gave one and the same grade to every pair)."""
    truth, pred = _predictions(y_true, y_pred, num_grades)
    if np.unique(np.concatenate([truth, pred])).size == 1:
        return None
    return float(skm.cohen_kappa_score(truth, pred, labels=np.arange(num_grades)))


def macro_f1_from_confusion(
    *, confusion: Sequence[Sequence[int]], missed_by_gold: Sequence[int] | None = None
) -> float:
    """``macro_f1`` from counts[gold][predicted] (lets a caller accumulate counts shard by shard):
    F1 = 2tp / (2tp + fp + fn) per grade, 0 without a true positive. ``missed_by_gold`` counts pairs of
    each gold grade that got no prediction (abstentions): they are misses (fn) of their grade.

    sklearn has no macro-F1 from counts; the counts go to ``f1_score`` as sample weights of (gold,
    predicted) cells, abstentions as predictions of an extra grade outside ``labels``."""
    counts = np.asarray(confusion)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] == 0:
        raise ValueError(f"confusion must be a non-empty square [gold, predicted] array, got shape {counts.shape}")
    grades = counts.shape[0]
    missed = np.zeros(grades, dtype=np.int64) if missed_by_gold is None else np.asarray(missed_by_gold)
    if missed.shape != (grades,):
        raise ValueError(f"missed_by_gold must hold one count per grade ({grades}), got shape {missed.shape}")
    for name, array in (("confusion", counts), ("missed_by_gold", missed)):
        if not np.issubdtype(array.dtype, np.integer) or (array < 0).any():
            raise ValueError(f"{name} must hold non-negative integer counts")
    cells = np.concatenate([counts, missed[:, None]], axis=1)  # column ``grades``: abstained
    gold, predicted = np.nonzero(cells)
    if gold.size == 0:
        return 0.0  # no pair at all: every grade's F1 is 0
    return float(
        skm.f1_score(
            gold,
            predicted,
            labels=np.arange(grades),
            average="macro",
            sample_weight=cells[gold, predicted],
            zero_division=0,
        )
    )


def roc_auc(*, y_true: Sequence[int], scores: Sequence[float]) -> float:
    """Area under the ROC curve of binary ``y_true`` (0/1) ranked by ``scores``."""
    truth, score = _binary(y_true, scores)
    if truth.min() == truth.max():
        raise ValueError("roc_auc needs both classes in y_true")
    return float(skm.roc_auc_score(truth, score))


def average_precision(*, y_true: Sequence[int], scores: Sequence[float]) -> float:
    """PR-AUC as average precision over the distinct score thresholds, highest first."""
    truth, score = _binary(y_true, scores)
    if not truth.any():
        raise ValueError("average_precision needs at least one positive in y_true")
    return float(skm.average_precision_score(truth, score))


def _relevance(
    y_true: Sequence[int], probs: Sequence[Sequence[float]], relevant_from: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(probabilities [N, grades], gold grades, 0/1 "relevant" = grade >= ``relevant_from``, its score = the summed
    probability of those grades), after checking the inputs' shapes and that ``relevant_from`` splits the grades."""
    prob = _probabilities(probs)
    grades = prob.shape[1]
    _same_length(y_true=y_true, probs=prob)
    truth = _grades("y_true", y_true, grades)
    if not 0 < relevant_from < grades:
        raise ValueError(f"relevant_from must be in 1..{grades - 1}, got {relevant_from}")
    return prob, truth, (truth >= relevant_from).astype(np.int64), prob[:, relevant_from:].sum(1)


def relevance_curves(
    *, y_true: Sequence[int], probs: Sequence[Sequence[float]], relevant_from: int = 2
) -> dict[str, list[list[float]]]:
    """The ROC curve ([false positive rate, true positive rate] per threshold) and the precision-recall curve
    ([recall, precision]) of "relevant", scored as ``relevance_aucs`` scores it (scikit-learn's points)."""
    *_, relevant, score = _relevance(y_true, probs, relevant_from)
    fpr, tpr, _ = skm.roc_curve(relevant, score)
    precision, recall, _ = skm.precision_recall_curve(relevant, score)
    return {"roc": [fpr.tolist(), tpr.tolist()], "pr": [recall.tolist(), precision.tolist()]}


def relevance_aucs(
    *, y_true: Sequence[int], probs: Sequence[Sequence[float]], relevant_from: int = 2
) -> dict[str, float]:
    """ROC-AUC and PR-AUC of "relevant" (grade >= ``relevant_from``, scored by the summed probability of
    those grades), and one-vs-rest ROC-AUC per grade present with its macro mean (NaN when only one
    grade is present)."""
    prob, truth, relevant, score = _relevance(y_true, probs, relevant_from)
    result = {
        "roc_auc_relevant": roc_auc(y_true=relevant, scores=score),
        "pr_auc_relevant": average_precision(y_true=relevant, scores=score),
    }
    per_grade = []
    for g in range(prob.shape[1]):
        target = (truth == g).astype(np.int64)
        if 0 < target.sum() < len(target):
            result[f"roc_auc_grade_{g}"] = roc_auc(y_true=target, scores=prob[:, g])
            per_grade.append(result[f"roc_auc_grade_{g}"])
    result["roc_auc_ovr_macro"] = float(np.mean(per_grade)) if per_grade else float("nan")
    return result


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
    if not all(math.isfinite(v) and v >= 0 for v in gains.values()):
        raise ValueError(f"gains must be finite and >= 0, got {dict(gains)}")
    gain = np.array([gains[g] for g in truth.tolist()], dtype=np.float64)
    groups: dict[object, list[int]] = {}
    for index, query in enumerate(query_ids):
        groups.setdefault(query, []).append(index)
    by_size: dict[int, list[list[int]]] = {}
    for rows in groups.values():
        by_size.setdefault(len(rows), []).append(rows)
    total = 0.0
    for size, queries in by_size.items():
        rows = np.asarray(queries)  # [queries of this size, size]
        if size == 1:  # DCG / IDCG = 1 unless the one gain is 0 (sklearn needs two items per query)
            total += float((gain[rows[:, 0]] > 0).sum())
        else:  # sklearn averages over its rows: back to a sum
            total += skm.ndcg_score(gain[rows], score[rows], k=k) * len(queries)
    return float(total / len(groups))


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
        table.append(
            {
                "lower": b / bins,
                "count": count,
                "confidence": float(confidence[members].mean()) if count else math.nan,
                "accuracy": float(correct[members].mean()) if count else math.nan,
            }
        )
    return float(ece), table


def validation_scores(y_true: Sequence[int], probs: Sequence[Sequence[float]], relevant_from: int = 2) -> dict:
    """What a student's training early-stops on (student.training's ``score``): ``val_macro_f1`` of the argmax grade
    and ``val_roc_auc_relevant`` of P(grade >= relevant_from), None when the pairs hold one side only."""
    probs = np.asarray(probs)
    both_sides = len({grade >= relevant_from for grade in y_true}) == 2
    return {
        "val_macro_f1": macro_f1(y_true=y_true, y_pred=probs.argmax(1).tolist(), num_grades=probs.shape[1]),
        "val_roc_auc_relevant": (
            relevance_aucs(y_true=y_true, probs=probs, relevant_from=relevant_from)["roc_auc_relevant"]
            if both_sides
            else None
        ),
    }
