"""The comparison vocabulary: one set of names, titles and interval figures that evaluate, the registry and the
pipeline all write with (the champion rule's own tests are in tests/pipelines/test_tracking.py)."""

import pytest

from pipelines.ads.student.comparison import (
    GOLD_ONLY,
    LEXICAL,
    SIMPLEST_FIRST,
    STUDENT,
    ZERO_SHOT,
    baseline_figures,
    difference,
    evaluation_figures,
    interval,
    interval_figures,
    the,
    title,
)
from pipelines.ads.student.evaluate_config import EvaluateConfig

DIFF = {"difference": 0.0125, "low": -0.01, "high": 0.034}


def test_names_titles_and_intervals_read_as_the_reports_and_reasons_write_them():
    assert SIMPLEST_FIRST == (LEXICAL, ZERO_SHOT, GOLD_ONLY, STUDENT)
    assert [title(n) for n in SIMPLEST_FIRST] == [
        "lexical matcher",
        "zero-shot encoder",
        "gold-only student",
        "student",
    ]
    assert title("champion-v3") == "champion-v3"  # a compare_with model keeps its name
    assert the(ZERO_SHOT) == "the zero-shot encoder" and the(STUDENT) == "the pipeline's student"
    assert difference(STUDENT, GOLD_ONLY) == "student - gold_only"
    assert interval(DIFF) == "+0.013 [-0.010, +0.034]"
    assert interval_figures("teacher_added_ece", DIFF) == {
        "teacher_added_ece": 0.0125,
        "teacher_added_ece_low": -0.01,
        "teacher_added_ece_high": 0.034,
    }


def test_evaluation_figures_name_every_other_model_and_every_interval():
    report = {
        "models": {STUDENT: {"macro_f1": 0.5}, LEXICAL: {"macro_f1": 0.4}, GOLD_ONLY: {"macro_f1": 0.45}},
        "differences": {difference(STUDENT, LEXICAL): {"macro_f1": DIFF}},
    }
    assert evaluation_figures(report) == {
        "lexical_macro_f1": 0.4,
        "gold_only_macro_f1": 0.45,
        "diff_student_vs_lexical_macro_f1": 0.0125,
        "diff_student_vs_lexical_macro_f1_low": -0.01,
        "diff_student_vs_lexical_macro_f1_high": 0.034,
    }
    assert baseline_figures(report) == {LEXICAL: {"macro_f1": 0.4}}


def test_compare_with_may_name_the_gold_only_student_but_not_a_baseline_or_the_student():
    assert EvaluateConfig(compare_with={GOLD_ONLY: "x"}).compare_with == {GOLD_ONLY: "x"}
    for taken in (STUDENT, ZERO_SHOT, LEXICAL):
        with pytest.raises(ValueError, match=f"compare_with may not use the name '{taken}'"):
            EvaluateConfig(compare_with={taken: "x"})
