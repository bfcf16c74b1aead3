"""The baselines a team has without the pipeline: the zero-shot encoder is fitted once per process."""

import numpy as np

from evaluation.zero_shot import zero_shot_student

ROWS = [
    {"query": "red running shoes", "ad_title": "Nike running shoes, red", "gold_grade": 3},
    {"query": "red running shoes", "ad_title": "garden hose, 20 m", "gold_grade": 0},
    {"query": "iphone 15 case", "ad_title": "Apple silicone case for iPhone 15", "gold_grade": 3},
    {"query": "iphone 15 case", "ad_title": "Samsung charger", "gold_grade": 1},
]


def test_the_zero_shot_student_is_fitted_once_for_the_same_pairs_and_again_for_others():
    first = zero_shot_student("all-minilm-l6-v2", ROWS, 4)
    assert zero_shot_student("all-minilm-l6-v2", [dict(r) for r in ROWS], 4) is first  # equal rows: no refit
    regraded = [{**r, "gold_grade": 3 - r["gold_grade"]} for r in ROWS]
    other = zero_shot_student("all-minilm-l6-v2", regraded, 4)
    assert other is not first
    queries, ads = [r["query"] for r in ROWS], [r["ad_title"] for r in ROWS]
    # the same cosines, read by cut-points fitted to the opposite grades
    assert np.allclose(other.similarity(queries, ads), first.similarity(queries, ads))
    assert not np.allclose(other.predict_proba(queries, ads), first.predict_proba(queries, ads))
