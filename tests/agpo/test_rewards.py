"""Relevance and math rewards: the strict answer format, and math-verify with the GSM8K fallback."""

import pytest

from agpo.rewards import format_answer, math_reward, parse_grade, relevance_reward
from agpo.rewards.math import gsm8k_final_answer
from agpo.rewards.relevance import MAX_REASON_CHARS, count_unparseable


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


def test_math_reward_uses_math_verify_and_gsm8k_fallback():
    completions = [
        "so the answer is \\boxed{72}",
        "Natalia sold 48 + 24 = 72 clips.\n#### 72",
        "\\boxed{\\frac{1}{2}}",
        "\\boxed{0.5}",
        "\\boxed{71}",
        "#### 1,234",
        "I do not know",
    ]
    gold = ["72", "72", "0.5", "\\frac{1}{2}", "72", "1234", "3"]
    assert math_reward(["q"] * 7, completions, answer=gold) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert math_reward(["q"], ["\\boxed{1}"], answer=[None]) == [None]
    assert gsm8k_final_answer("a #### 5\n b #### 1,000") == "1000"
