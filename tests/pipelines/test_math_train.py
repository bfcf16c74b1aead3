"""math-train on the synthetic arithmetic task: a tiny model warms up, trains a few RL steps from the
saved base, measures held-out pass@1, and a second algorithm can start from the very same base."""

import json

import pytest

from pipelines.arithmetic import ArithmeticConfig, arithmetic_problems, sft_target
from pipelines.config import load_config
from pipelines.math_train import MathTrainConfig, run


def test_arithmetic_problems_are_seeded_and_verifiable():
    rows = arithmetic_problems(ArithmeticConfig(count=50, seed=3))
    assert rows == arithmetic_problems(ArithmeticConfig(count=50, seed=3))
    for row in rows:
        a, b = row["operands"]
        assert int(row["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[row["subject"]]
        assert sft_target(row).endswith(f"\\boxed{{{row['answer']}}}.")
    with pytest.raises(ValueError, match="operators must be a non-empty subset"):
        ArithmeticConfig(operators=("/",))


@pytest.mark.integration
def test_math_train_runs_from_a_shared_base(tmp_path):
    common = ["arithmetic.count=300", "eval_problems=20", "eval_samples=2", "sft_examples=200", "sft.epochs=2",
              "model.hidden_size=64", "model.intermediate_size=128", "trainer.max_steps=2", "trainer.group_size=4",
              "trainer.prompts_per_step=4", "trainer.max_new_tokens=20", "trainer.eval_every=0"]  # fmt: skip
    first = run(load_config(MathTrainConfig, [], [*common, f"out_dir={tmp_path}/agpo", "trainer.algorithm=agpo"]))
    summary = json.loads(first["summary"].read_text())
    assert summary["steps"] == 2 and summary["generated_tokens"] > 0
    assert 0 <= summary["heldout_pass@1_start"] <= 1 and 0 <= summary["heldout_pass@1_end"] <= 1
    second = run(load_config(MathTrainConfig, [], [*common, f"out_dir={tmp_path}/grpo", "trainer.algorithm=grpo",
                                                   f"base_model={first['base']}"]))  # fmt: skip
    assert json.loads(second["summary"].read_text())["heldout_pass@1_start"] == summary["heldout_pass@1_start"]
