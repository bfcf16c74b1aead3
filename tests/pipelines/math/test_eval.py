"""math-eval: the scoring maths against hand-computed values, and the stage end to end on a tiny model."""

import json
from pathlib import Path

import pytest

from agpo.models import TinyModelConfig, build_tiny_qwen2, save_model, train_bpe_tokenizer
from pipelines.config import load_config
from pipelines.math.math_eval import MathEvalConfig, run, score_samples

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"


def test_scores_match_hand_computed_values():
    problems = [{"answer": "4", "subject": "A", "level": 1}, {"answer": "\\frac{1}{2}", "subject": "B", "level": 2}]
    completions = [
        ["\\boxed{4}", "\\boxed{5}", "no answer", "\\boxed{4}"],  # 2 of 4 correct
        ["\\boxed{0.5}", "\\boxed{1/3}", "\\boxed{1/3}", "\\boxed{1/3}"],  # 1 of 4 correct (0.5 = 1/2)
    ]
    scores = score_samples(problems, completions)
    # pass@2: 1 - C(2,2)/C(4,2) = 5/6 and 1 - C(3,2)/C(4,2) = 1/2
    assert scores["pass_at_k"] == pytest.approx({1: 0.375, 2: (5 / 6 + 0.5) / 2, 4: 1.0})
    # maj@4: problem 2's majority is 1/3 (wrong); ties at k=2 go to the first answer seen
    assert scores["maj_at_k"] == {1: 1.0, 2: 1.0, 4: 0.5}
    assert scores["mean_at_n"] == 0.375 and scores["unparseable"] == 0.125
    assert scores["per_subject"] == {"A": 0.5, "B": 0.25} and scores["per_level"] == {"1": 0.5, "2": 0.25}
    with pytest.raises(ValueError, match="same, non-zero number"):
        score_samples(problems, [["\\boxed{4}"], []])


@pytest.mark.integration
@pytest.mark.skipif(not DATA.is_dir(), reason="needs ../shared/data")
def test_math_eval_stage_on_a_tiny_model(tmp_path):
    tokenizer = train_bpe_tokenizer(["What is 2 + 3? \\boxed{5}", "Janet sells eggs"] * 50, vocab_size=300)
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1))
    save_model(model, tokenizer, tmp_path / "model")
    sets = [
        f"model={tmp_path / 'model'}",
        f"path={DATA / 'gsm8k' / 'test.jsonl'}",
        "limit=3",
        "samples=4",
        "max_new_tokens=8",
        f"out_dir={tmp_path / 'eval'}",
    ]
    paths = run(load_config(MathEvalConfig, [], sets))
    results = json.loads(paths["results"].read_text())
    assert results["problems"] == 3 and results["samples"] == 4
    assert list(results["pass_at_k"]) == ["1", "2", "4"]
    values = list(results["pass_at_k"].values())
    assert values == sorted(values) and all(0 <= v <= 1 for v in values)  # pass@k never falls with k
    assert paths["plot"].stat().st_size > 0
