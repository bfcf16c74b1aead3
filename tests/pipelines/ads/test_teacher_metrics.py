"""Teacher quality metrics on gold pairs against hand-computed values: per-grade recall, balanced accuracy
and the predicted-grade shares that expose a teacher answering one grade."""

import pytest

from pipelines.ads.teacher.audit_metrics import relevance_accuracy


def test_recall_balanced_accuracy_and_predicted_shares_by_hand():
    gold = [3, 3, 3, 3, 2, 2, 1, 3]
    predicted = [3, 3, 3, None, 3, 2, 3, 3]
    metrics = relevance_accuracy(predicted, gold)
    assert metrics["accuracy"] == 5 / 8 and metrics["unparseable"] == 1 / 8
    assert metrics["recall/g3"] == 4 / 5 and metrics["recall/g2"] == 1 / 2 and metrics["recall/g1"] == 0.0
    assert "recall/g0" not in metrics  # no gold pair of grade 0: omitted, not NaN
    assert metrics["balanced_accuracy"] == pytest.approx((4 / 5 + 1 / 2 + 0) / 3)
    # 3 grades in gold: any answer that ignores the pair scores 1/3; its null se (1/3) sqrt((2/9)(1/5 + 1/2 + 1/1))
    assert metrics["balanced_accuracy_prior"] == pytest.approx(1 / 3)
    assert metrics["balanced_accuracy_null_se"] == pytest.approx(0.204879, abs=1e-6)
    shares = {k: v for k, v in metrics.items() if k.startswith("predicted/")}
    assert shares == {
        "predicted/g0": 0.0,
        "predicted/g1": 0.0,
        "predicted/g2": 1 / 8,
        "predicted/g3": 6 / 8,
        "predicted/none": 1 / 8,
    }
    assert metrics["confusion/g3_pnone"] == 1.0 and metrics["confusion/g1_p3"] == 1.0  # existing keys stay


def test_a_teacher_answering_the_top_grade_looks_accurate_on_skewed_gold_but_not_balanced():
    gold = [3] * 9 + [0]
    metrics = relevance_accuracy([3] * 10, gold)
    assert metrics["accuracy"] == 0.9
    assert metrics["recall/g3"] == 1.0 and metrics["recall/g0"] == 0.0
    assert metrics["balanced_accuracy"] == 0.5
    assert metrics["predicted/g3"] == 1.0 and metrics["predicted/none"] == 0.0


def test_relevance_accuracy_needs_equal_non_empty_lists():
    with pytest.raises(ValueError, match="equal, non-empty"):
        relevance_accuracy([], [])
