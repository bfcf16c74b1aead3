"""The relevance reward's strict answer format (pipelines.ads.teacher.relevance_reward)."""

import pytest

from pipelines.ads.teacher.relevance_reward import (
    MAX_REASON_CHARS,
    count_unparseable,
    format_answer,
    parse_grade,
    relevance_reward,
)


@pytest.mark.parametrize(
    ("text", "grade"),
    [
        ("<answer>2</answer>", 2),
        (" same category, colour differs <answer>2</answer>", 2),
        ("reason <answer> 3 </answer>\n", 3),
        ("类目相同，颜色不同 <answer>2</answer>", 2),
        (format_answer(0, "different category"), 0),
    ],
)
def test_parse_grade_accepts_the_format(text, grade):
    assert parse_grade(text) == grade


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3",
        "the grade is 3",
        "<answer>4</answer>",  # outside the label set
        "<answer>-1</answer>",
        "<answer>2</answer> but maybe 3",  # text after the final tag
        "<answer>1</answer> <answer>2</answer>",  # two tags
        "<answer>2",
        "<answer>two</answer>",
        "x" * (MAX_REASON_CHARS + 1) + " <answer>2</answer>",
        None,
    ],
)
def test_parse_grade_rejects_everything_else(text):
    assert parse_grade(text) is None


def test_parse_grade_custom_label_set():
    assert parse_grade("<answer>4</answer>", grades=range(5)) == 4


def test_relevance_reward():
    completions = ["<answer>3</answer>", "x <answer>2</answer>", "no answer", "<answer>1</answer>"]
    assert relevance_reward(["p"] * 4, completions, gold_grade=[3, 3, 2, None]) == [1.0, 0.0, 0.0, None]
    assert count_unparseable(completions) == 1
    with pytest.raises(ValueError, match="equal lengths, got 1, 2, 2"):
        relevance_reward(["p"], ["a", "b"], gold_grade=[1, 2])
