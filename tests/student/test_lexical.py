"""The lexical baseline: learns a token -> grade rule, is deterministic, weighs pairs, and has defined
behaviour for one-grade labels and grades absent from training."""

import numpy as np
import pytest

from student.lexical import LexicalBaseline, LexicalConfig

# the grade is set by one ad word: "exact" -> 3, "swap" -> 2, "addon" -> 1, "other" -> 0
WORDS = {"exact": 3, "swap": 2, "addon": 1, "other": 0}
QUERIES = ["red shoes", "phone case", "blue lamp", "usb cable", "green mug"]
ADS = [f"{brand} {word} item" for word in WORDS for brand in ("acme", "zeta", "nova")]


def tiny_set():
    queries = [q for q in QUERIES for _ in ADS]
    ads = [a for _ in QUERIES for a in ADS]
    grades = [WORDS[a.split()[1]] for a in ads]
    return queries, ads, grades


def test_it_learns_a_token_to_grade_rule_exactly():
    queries, ads, grades = tiny_set()
    model = LexicalBaseline(4).fit(queries, ads, grades)
    unseen_q, unseen_a = ["black hat", "black hat"], ["omega exact thing", "omega other thing"]
    assert model.predict(queries, ads).tolist() == grades
    assert model.predict(unseen_q, unseen_a).tolist() == [3, 0]
    probs = model.predict_proba(queries, ads)
    assert probs.shape == (len(grades), 4) and np.allclose(probs.sum(1), 1)


def test_the_fit_is_deterministic_and_class_weight_is_an_option():
    queries, ads, grades = tiny_set()
    for config in (LexicalConfig(), LexicalConfig(class_weight="balanced", seed=3)):
        first = LexicalBaseline(4, config).fit(queries, ads, grades).predict_proba(queries, ads)
        second = LexicalBaseline(4, config).fit(queries, ads, grades).predict_proba(queries, ads)
        assert np.array_equal(first, second)
    with pytest.raises(ValueError, match="class_weight must be one of"):
        LexicalConfig(class_weight="uniform")


def test_sample_weights_decide_between_contradicting_labels():
    # the same text labeled 3 (weight 0.9) and 0 (weight 0.1): the weighted majority wins
    queries, ads = ["red shoes"] * 2 + ["blue lamp"] * 2, ["acme shoes"] * 2 + ["nova lamp"] * 2
    grades = [3, 0, 3, 0]
    heavy_three = LexicalBaseline(4).fit(queries, ads, grades, [0.9, 0.1, 0.9, 0.1])
    heavy_zero = LexicalBaseline(4).fit(queries, ads, grades, [0.1, 0.9, 0.1, 0.9])
    assert heavy_three.predict(["red shoes"], ["acme shoes"]).tolist() == [3]
    assert heavy_zero.predict(["red shoes"], ["acme shoes"]).tolist() == [0]


def test_grades_missing_from_training_get_probability_zero_and_one_grade_gives_a_constant_model():
    queries, ads, grades = tiny_set()
    kept = [i for i, g in enumerate(grades) if g != 2]
    model = LexicalBaseline(4).fit([queries[i] for i in kept], [ads[i] for i in kept], [grades[i] for i in kept])
    assert np.all(model.predict_proba(queries, ads)[:, 2] == 0)
    constant = LexicalBaseline(4).fit(["a", "b"], ["x", "y"], [1, 1])
    assert constant.single_grade == 1
    assert constant.predict_proba(["c"], ["z"]).tolist() == [[0.0, 1.0, 0.0, 0.0]]


def test_bad_inputs_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="at least one pair"):
        LexicalBaseline(4).fit([], [], [])
    with pytest.raises(ValueError, match=r"grades must be integers in 0..3, got \[0, 4\]"):
        LexicalBaseline(4).fit(["a", "b"], ["x", "y"], [0, 4])
    with pytest.raises(ValueError, match="mismatched lengths"):
        LexicalBaseline(4).fit(["a"], ["x", "y"], [0, 1])
    with pytest.raises(ValueError, match="sample_weight"):
        LexicalBaseline(4).fit(["a", "b"], ["x", "y"], [0, 1], [0.0, 0.0])
    with pytest.raises(RuntimeError, match="fit the lexical baseline"):
        LexicalBaseline(4).predict_proba(["a"], ["x"])
