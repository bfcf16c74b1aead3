"""Relevance metrics against scikit-learn's own functions and hand-computed values."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from evaluation.metrics import (
    ESCI_GAINS,
    accuracy,
    average_precision,
    confusion_matrix,
    expected_calibration_error,
    macro_f1,
    macro_f1_from_confusion,
    ndcg_at_k,
    precision_recall_per_grade,
    relevance_aucs,
    relevance_curves,
    roc_auc,
)

grades = st.lists(st.integers(0, 3), min_size=2, max_size=60)


@given(st.data())
def test_classification_metrics_equal_sklearn(data):
    y_true = data.draw(grades)
    y_pred = data.draw(st.lists(st.integers(0, 3), min_size=len(y_true), max_size=len(y_true)))
    assert accuracy(y_true=y_true, y_pred=y_pred) == pytest.approx(skm.accuracy_score(y_true, y_pred))
    labels = [0, 1, 2, 3]
    expected_f1 = skm.f1_score(y_true, y_pred, labels=labels, average="macro", zero_division=0)
    assert macro_f1(y_true=y_true, y_pred=y_pred) == pytest.approx(expected_f1)
    per = precision_recall_per_grade(y_true=y_true, y_pred=y_pred)
    p, r, _, s = skm.precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    assert [per[g]["precision"] for g in labels] == pytest.approx(p.tolist())
    assert [per[g]["recall"] for g in labels] == pytest.approx(r.tolist())
    assert [per[g]["support"] for g in labels] == s.tolist()
    assert (
        confusion_matrix(y_true=y_true, y_pred=y_pred) == skm.confusion_matrix(y_true, y_pred, labels=labels).tolist()
    )


@given(st.data())
def test_roc_auc_and_average_precision_equal_sklearn_with_ties(data):
    truth = data.draw(st.lists(st.integers(0, 1), min_size=2, max_size=50).filter(lambda t: 0 < sum(t) < len(t)))
    scores = data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=len(truth), max_size=len(truth)))
    assert roc_auc(y_true=truth, scores=scores) == pytest.approx(skm.roc_auc_score(truth, scores))
    assert average_precision(y_true=truth, scores=scores) == pytest.approx(skm.average_precision_score(truth, scores))


@settings(max_examples=60)
@given(st.data())
def test_ndcg_equals_sklearn_per_query(data):
    sizes = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=5))
    query_ids, y_true, scores = [], [], []
    for q, size in enumerate(sizes):
        query_ids += [f"q{q}"] * size
        y_true += data.draw(st.lists(st.integers(0, 3), min_size=size, max_size=size))
        scores += data.draw(st.lists(st.sampled_from([0.1, 0.2, 0.7, 0.9]), min_size=size, max_size=size))
    k = data.draw(st.integers(1, 10))
    expected = []
    for q in dict.fromkeys(query_ids):
        rows = [i for i, x in enumerate(query_ids) if x == q]
        gains = [[ESCI_GAINS[y_true[i]] for i in rows]]
        if len(rows) == 1:  # sklearn needs 2+ items; one item is DCG/IDCG = 1 unless its gain is 0
            expected.append(1.0 if gains[0][0] > 0 else 0.0)
        else:
            expected.append(skm.ndcg_score(gains, [[scores[i] for i in rows]], k=k))
    got = ndcg_at_k(query_ids=query_ids, y_true=y_true, scores=scores, k=k)
    assert got == pytest.approx(float(np.mean(expected)))


def test_ndcg_with_esci_gains_hand_value():
    # one query ranked E, I, S (scores 0.9, 0.8, 0.1): DCG@3 = 1 + 0 + 0.1/log2(4) = 1.05;
    # ideal E, S, I: 1 + 0.1/log2(3) = 1.0630930
    got = ndcg_at_k(query_ids=["q"] * 3, y_true=[3, 0, 2], scores=[0.9, 0.8, 0.1], k=3)
    assert got == pytest.approx(1.05 / (1 + 0.1 / math.log2(3)))
    assert got == pytest.approx(0.987684, abs=1e-6)
    # k = 1: only the top item counts -> 1 / 1
    assert ndcg_at_k(query_ids=["q"] * 3, y_true=[3, 0, 2], scores=[0.9, 0.8, 0.1], k=1) == 1.0


def test_relevance_aucs_use_the_summed_relevant_probability():
    probs = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4], [0.2, 0.5, 0.2, 0.1], [0.0, 0.0, 0.1, 0.9]]
    y_true = [0, 2, 1, 3]
    result = relevance_aucs(y_true=y_true, probs=probs)
    relevant_score = [0.2, 0.8, 0.3, 1.0]
    assert result["roc_auc_relevant"] == pytest.approx(skm.roc_auc_score([0, 1, 0, 1], relevant_score)) == 1.0
    assert result["roc_auc_ovr_macro"] == pytest.approx(
        skm.roc_auc_score(y_true, probs, multi_class="ovr", average="macro")
    )


def test_expected_calibration_error_hand_value():
    # confidences 0.9, 0.9 (one right) -> bin 9: |0.5 - 0.9| = 0.4; 0.6 (right) -> bin 6: |1 - 0.6| = 0.4
    probs = [[0.9, 0.1], [0.9, 0.1], [0.4, 0.6]]
    ece, bins = expected_calibration_error(y_true=[0, 1, 1], probs=probs, bins=10)
    assert ece == pytest.approx(2 / 3 * 0.4 + 1 / 3 * 0.4)
    assert bins[9]["count"] == 2 and bins[9]["accuracy"] == 0.5 and bins[6]["count"] == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: accuracy(y_true=[0, 1], y_pred=[0]), "mismatched lengths"),
        (lambda: accuracy(y_true=[0, 5], y_pred=[0, 1]), "grade 5 outside 0..3"),
        (lambda: accuracy(y_true=[], y_pred=[]), "non-empty"),
        (lambda: roc_auc(y_true=[1, 1], scores=[0.1, 0.2]), "both classes"),
        (lambda: roc_auc(y_true=[0, 1], scores=[0.1, float("nan")]), "non-finite"),
        (lambda: ndcg_at_k(query_ids=[], y_true=[], scores=[]), "at least one query group"),
        (lambda: ndcg_at_k(query_ids=["q"], y_true=[1], scores=[0.1], k=0), "k must be an int >= 1"),
        (lambda: relevance_aucs(y_true=[0, 1], probs=[[0.5, 0.6], [1.0, 0.0]]), "sum to 1"),
        (lambda: expected_calibration_error(y_true=[0], probs=[[1.0, 0.0]], bins=0), "bins"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_macro_f1_from_confusion_hand_values():
    # gold rows, label columns; grade 2 never predicted nor present; one abstention of gold 1
    confusion = [[3, 1, 0], [1, 2, 0], [0, 0, 0]]
    # grade 0: tp 3, fp 1, fn 1 -> 6/8; grade 1: tp 2, fp 1, fn 1 + 1 -> 4/7; grade 2: 0
    assert macro_f1_from_confusion(confusion=confusion, missed_by_gold=[0, 1, 0]) == pytest.approx(
        (6 / 8 + 4 / 7 + 0) / 3
    )


@settings(max_examples=60)
@given(st.data())
def test_macro_f1_from_confusion_equals_sklearn_with_abstentions_as_misses(data):
    y_true = data.draw(grades)
    # 4: abstained (no prediction): a miss of its gold grade, never a prediction of a grade
    y_pred = data.draw(st.lists(st.integers(0, 4), min_size=len(y_true), max_size=len(y_true)))
    confusion, missed = [[0] * 4 for _ in range(4)], [0] * 4
    for gold, label in zip(y_true, y_pred, strict=True):
        if label == 4:
            missed[gold] += 1
        else:
            confusion[gold][label] += 1
    expected = skm.f1_score(y_true, y_pred, labels=[0, 1, 2, 3], average="macro", zero_division=0)
    assert macro_f1_from_confusion(confusion=confusion, missed_by_gold=missed) == pytest.approx(expected)
    if 4 not in y_pred:
        assert macro_f1_from_confusion(confusion=confusion) == pytest.approx(macro_f1(y_true=y_true, y_pred=y_pred))


def test_macro_f1_edge_cases():
    assert macro_f1_from_confusion(confusion=[[0, 0], [0, 0]]) == 0.0  # no pair: every grade's F1 is 0
    assert macro_f1_from_confusion(confusion=[[0, 0], [0, 0]], missed_by_gold=[3, 0]) == 0.0  # only abstentions
    # one class, always right: grade 0 has F1 1, the three grades never seen 0
    assert macro_f1(y_true=[0, 0], y_pred=[0, 0]) == 0.25
    assert macro_f1(y_true=[0, 0], y_pred=[0, 0], num_grades=1) == 1.0
    assert confusion_matrix(y_true=[1, 1], y_pred=[1, 2]) == [[0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    per = precision_recall_per_grade(y_true=[1, 1], y_pred=[1, 2])
    assert per[0] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert per[2] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert per[1] == {"precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}


def test_ndcg_single_items_all_zero_queries_and_ties():
    # q1: one relevant item -> 1; q2: one irrelevant item -> 0; q3: all gains 0 -> 0;
    # q4: E and I tied at the top, k = 1 -> the tie group's mean gain 0.5 over an ideal 1
    got = ndcg_at_k(
        query_ids=["q1", "q2", "q3", "q3", "q4", "q4"],
        y_true=[2, 0, 0, 0, 3, 0],
        scores=[0.5, 0.5, 0.9, 0.1, 0.7, 0.7],
        k=1,
    )
    assert got == pytest.approx((1 + 0 + 0 + 0.5) / 4)
    assert ndcg_at_k(query_ids=[7, 7, 8], y_true=[3, 0, 1], scores=[0.1, 0.9, 0.3], k=2) == pytest.approx(
        (1 / math.log2(3) + 1) / 2  # any hashable query id; q7 ranks E second, q8 is one item
    )


def test_relevance_aucs_average_the_grades_present():
    # grade 2 never occurs in y_true: no roc_auc_grade_2, the macro mean is over grades 0, 1 and 3
    probs = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.6, 0.2, 0.1], [0.3, 0.4, 0.2, 0.1], [0.0, 0.1, 0.1, 0.8]]
    y_true = [0, 1, 1, 3]
    result = relevance_aucs(y_true=y_true, probs=probs)
    assert "roc_auc_grade_2" not in result
    column = np.asarray(probs)
    present = [skm.roc_auc_score([int(t == g) for t in y_true], column[:, g]) for g in (0, 1, 3)]
    assert result["roc_auc_ovr_macro"] == pytest.approx(np.mean(present))
    assert result["pr_auc_relevant"] == pytest.approx(skm.average_precision_score([0, 0, 0, 1], column[:, 2:].sum(1)))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: average_precision(y_true=[0, 0], scores=[0.1, 0.2]), "at least one positive"),
        (lambda: ndcg_at_k(query_ids=["q"], y_true=[1], scores=[0.1], gains={0: 0.0, 1: -1.0}), "finite and >= 0"),
        (lambda: ndcg_at_k(query_ids=["q"], y_true=[2], scores=[0.1], gains={0: 0.0, 1: 1.0}), "outside 0..1"),
        (lambda: macro_f1_from_confusion(confusion=[[1, 0, 0], [0, 1, 0]]), "square"),
        (lambda: macro_f1_from_confusion(confusion=[[1, 0], [0, 1]], missed_by_gold=[1]), "one count per grade"),
        (lambda: macro_f1_from_confusion(confusion=[[1, -1], [0, 1]]), "non-negative integer counts"),
        (lambda: macro_f1_from_confusion(confusion=[[1.5, 0], [0, 1]]), "non-negative integer counts"),
    ],
)
def test_more_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: accuracy([0], [0]),
        lambda: macro_f1([0], [0]),
        lambda: confusion_matrix([0], [0]),
        lambda: precision_recall_per_grade([0], [0]),
        lambda: roc_auc([0, 1], [0.1, 0.2]),
        lambda: average_precision([0, 1], [0.1, 0.2]),
        lambda: relevance_aucs([0, 1], [[1.0, 0.0], [0.0, 1.0]]),
        lambda: ndcg_at_k(["q"], [1], [0.1]),
        lambda: expected_calibration_error([0], [[1.0, 0.0]]),
        lambda: macro_f1_from_confusion([[1, 0], [0, 1]]),
    ],
)
def test_the_wrappers_take_keywords_only(call):
    with pytest.raises(TypeError, match="positional argument"):
        call()


def test_relevance_curves_are_the_hand_computed_roc_and_precision_recall_points():
    # gold grades 0, 1, 2, 3: relevant (>= 2) are the last two; scored by p(2) + p(3) = 0.1, 0.4, 0.35, 0.8
    scores = [0.1, 0.4, 0.35, 0.8]
    probs = [[1 - s, 0.0, s, 0.0] for s in scores]
    curves = relevance_curves(y_true=[0, 1, 2, 3], probs=probs, relevant_from=2)
    fpr, tpr = curves["roc"]  # thresholds inf, 0.8, 0.4, 0.35, 0.1
    assert fpr == pytest.approx([0, 0, 0.5, 0.5, 1]) and tpr == pytest.approx([0, 0.5, 0.5, 1, 1])
    recall, precision = curves["pr"]  # thresholds 0.1, 0.35, 0.4, 0.8, then the (recall 0, precision 1) end
    assert recall == pytest.approx([1, 1, 0.5, 0.5, 0]) and precision == pytest.approx([0.5, 2 / 3, 0.5, 1, 1])
