"""Math loaders on the real sets in ../shared/data, and the math reward on a sample of their gold answers."""

import json
import sys
from pathlib import Path

import pytest

from agpo.rewards.math import math_equivalent, math_reward
from pipelines.math.math_data import MathDataError, load_math_set, render_prompt

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
SETS = {
    "gsm8k": DATA / "gsm8k" / "test.jsonl",
    "math500": DATA / "math" / "math500_test.jsonl",
    "cmath": DATA / "cmath" / "cmath_dev.jsonl",
}
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from check_math_reward import gold_completion, wrong_completion  # noqa: E402


def test_loaders_read_every_row_with_its_gold_answer():
    gsm8k, math500, cmath = (load_math_set(name, path) for name, path in SETS.items())
    assert (len(gsm8k), len(math500), len(cmath)) == (1319, 500, 600)
    assert gsm8k[0]["answer"] == "18" and gsm8k[0]["problem"].startswith("Janet")
    assert math500[0]["answer"] == "\\left( 3, \\frac{\\pi}{2} \\right)" and math500[0]["level"] == 2
    assert math500[0]["subject"] == "Precalculus"
    assert cmath[0]["answer"] == "9" and cmath[0]["level"] == 1
    assert len({r["id"] for r in math500}) == 500
    assert load_math_set("gsm8k", SETS["gsm8k"], limit=3)[2]["id"] == "gsm8k-3"
    assert "\\boxed{}" in render_prompt("1+1?") and render_prompt(" 1+1? ").endswith("Problem: 1+1?\nSolution:")


@pytest.mark.parametrize("name", sorted(SETS))
def test_the_reward_gives_1_to_gold_and_0_to_a_wrong_answer_on_a_sample(name):
    rows = load_math_set(name, SETS[name], limit=60)
    answers = [r["answer"] for r in rows]
    assert math_reward([""] * 60, [gold_completion(r) for r in rows], answer=answers) == [1.0] * 60
    wrong = math_reward([""] * 60, [wrong_completion(r) for r in rows], answer=answers)
    assert wrong == [0.0] * 60


def test_bare_latex_gold_answers_are_read():
    """Regression: a gold answer without $ delimiters but with LaTeX was never parsed, so it scored 0."""
    assert math_equivalent("so the length is \\boxed{\\sqrt{51}}", "\\sqrt{51}")
    assert not math_equivalent("\\boxed{\\sqrt{52}}", "\\sqrt{51}")
    assert math_equivalent("\\boxed{18.90}", "\\$18.90")  # an escaped dollar is currency, not a delimiter


def test_bad_files_and_rows_name_the_file_line_and_field(tmp_path):
    with pytest.raises(MathDataError, match="does not exist"):
        load_math_set("gsm8k", tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no final line"}) + "\n")
    with pytest.raises(MathDataError, match=r"bad.jsonl:1: field 'answer' has no '#### <number>' line"):
        load_math_set("gsm8k", bad)
    bad.write_text(json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(MathDataError, match=r"bad.jsonl:1: field 'answer' is missing"):
        load_math_set("math500", bad)
    bad.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n{not json\n")
    with pytest.raises(MathDataError, match=r"bad.jsonl:2: not JSON"):
        load_math_set("math500", bad)
    with pytest.raises(MathDataError, match="unknown math set 'aime'"):
        load_math_set("aime", bad)
