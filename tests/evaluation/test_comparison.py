"""The comparison vocabulary: one set of names, titles and interval figures that evaluate, the registry and the
pipeline all write with (the champion rule's own tests are in tests/pipelines/test_tracking.py)."""

import pytest

from evaluation.baselines_config import LEXICAL, ZERO_SHOT
from evaluation.comparison import (
    GOLD_ONLY,
    SIMPLEST_FIRST,
    STUDENT,
    baseline_figures,
    champion_candidate,
    difference,
    evaluation_figures,
    interval,
    interval_figures,
    the,
    title,
)
from pipelines.ads.distillation.evaluate_config import EvaluateConfig

DIFF = {"difference": 0.0125, "low": -0.01, "high": 0.034}


def test_names_titles_and_intervals_read_as_the_reports_and_reasons_write_them():
    assert SIMPLEST_FIRST == (LEXICAL, ZERO_SHOT, "bm25", GOLD_ONLY, STUDENT)  # baselines as registered
    assert [title(n) for n in SIMPLEST_FIRST] == [
        "lexical matcher",
        "zero-shot encoder",
        "BM25 (rank-bm25)",
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


def test_the_champion_rule_reads_every_baseline_scored_however_many():
    wins, loses = {"difference": 0.1, "low": 0.05, "high": 0.15}, {"difference": 0.01, "low": -0.02, "high": 0.04}
    models = {
        STUDENT: {"macro_f1": 0.5},
        ZERO_SHOT: {"macro_f1": 0.3},
        LEXICAL: {"macro_f1": 0.4},
        "bm25": {"macro_f1": 0.45},
    }
    differences = {difference(STUDENT, b): {"macro_f1": wins} for b in (LEXICAL, ZERO_SHOT)}
    report = {"models": models, "differences": differences | {difference(STUDENT, "bm25"): {"macro_f1": loses}}}
    choice = champion_candidate(report, "macro_f1")
    assert choice["candidate"] == choice["strongest_baseline"] == "bm25"  # the student does not beat BM25's floor
    assert "lexical 0.4000, zero_shot 0.3000, bm25 0.4500" in choice["reason"]
    assert list(baseline_figures(report)) == [ZERO_SHOT, LEXICAL, "bm25"]  # the report's order
