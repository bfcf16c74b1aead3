"""math-train on the synthetic arithmetic task: a tiny model warms up, trains a few RL steps from the
saved base, measures held-out pass@1, and a second algorithm can start from the very same base; the same
run under DeepSpeed (torchrun) saves the same weights."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agpo.models import load_model
from pipelines.config import load_config
from pipelines.math.arithmetic import ArithmeticConfig, arithmetic_problems, sft_target
from pipelines.math.math_train import MathTrainConfig, run

ROOT = Path(__file__).resolve().parents[3]


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
    common = [
        "arithmetic.count=300",
        "eval_problems=20",
        "eval_samples=2",
        "sft_examples=200",
        "sft.epochs=2",
        "model.hidden_size=64",
        "model.intermediate_size=128",
        "trainer.max_steps=2",
        "trainer.rollout.group_size=4",
        "trainer.rollout.prompts_per_step=4",
        "trainer.rollout.max_new_tokens=20",
        "trainer.eval_every=0",
    ]
    first = run(load_config(MathTrainConfig, [], [*common, f"out_dir={tmp_path}/agpo", "trainer.algorithm=agpo"]))
    summary = json.loads(first["summary"].read_text())
    assert summary["steps"] == 2 and summary["generated_tokens"] > 0
    assert 0 <= summary["heldout_pass@1_start"] <= 1 and 0 <= summary["heldout_pass@1_end"] <= 1
    second = run(
        load_config(
            MathTrainConfig,
            [],
            [*common, f"out_dir={tmp_path}/grpo", "trainer.algorithm=grpo", f"base_model={first['base']}"],
        )
    )
    second_summary = json.loads(second["summary"].read_text())
    assert second_summary["heldout_pass@1_start"] == summary["heldout_pass@1_start"]
    # the same run under DeepSpeed (ZeRO-1, one torchrun process on CPU) trains and saves the same model
    grpo = [
        *common,
        "trainer.algorithm=grpo",
        f"base_model={first['base']}",
        f"out_dir={tmp_path}/grpo-ds",
        "deepspeed=configs/deepspeed/zero1.json",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "1",
        "--master_port",
        "29671",
        "-m",
        "pipelines.cli",
        "math-train",
        *[arg for s in grpo for arg in ("--set", s)],
    ]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ds_summary = json.loads((tmp_path / "grpo-ds" / "summary.json").read_text())
    assert ds_summary["generated_tokens"] == second_summary["generated_tokens"]
    assert ds_summary["heldout_pass@1_end"] == pytest.approx(second_summary["heldout_pass@1_end"])
    plain_weights, ds_weights = load_model(second["model"])[0], load_model(tmp_path / "grpo-ds" / "model")[0]
    for (name, want), (_, got) in zip(plain_weights.named_parameters(), ds_weights.named_parameters(), strict=True):
        assert torch.allclose(got, want, atol=1e-5), name


@pytest.mark.integration
def test_math_compare_trains_every_algorithm_from_one_base_at_equal_budget(tmp_path):
    from pipelines.math.math_compare import MathCompareConfig
    from pipelines.math.math_compare import run as compare

    sets = [
        "algorithms=[grpo, agpo]",
        "seeds=[0, 1]",
        "samples=4",
        "evaluate.max_new_tokens=20",
        "train.arithmetic.count=300",
        "train.eval_problems=12",
        "train.eval_samples=2",
        "train.sft_examples=200",
        "train.sft.epochs=2",
        "train.model.hidden_size=64",
        "train.model.intermediate_size=128",
        "train.trainer.max_steps=50",
        "train.trainer.token_budget=300",
        "train.trainer.rollout.group_size=4",
        "train.trainer.rollout.prompts_per_step=4",
        "train.trainer.rollout.max_new_tokens=20",
        "train.trainer.eval_every=0",
        f"out_dir={tmp_path}",
    ]
    paths = compare(load_config(MathCompareConfig, [], sets))
    result = json.loads(paths["json"].read_text())
    assert [(r["algorithm"], r["seed"]) for r in result["runs"]] == [("grpo", 0), ("grpo", 1), ("agpo", 0), ("agpo", 1)]
    assert all(300 <= r["generated_tokens"] < 300 + 4 * 4 * 20 for r in result["runs"])  # stopped at the budget
    assert [row["algorithm"] for row in result["table"]] == ["grpo", "agpo"]
    for algorithm in ("grpo", "agpo"):  # each run trained with its own preset, from the one shared base
        summary = json.loads((tmp_path / algorithm / "seed-1" / "summary.json").read_text())
        assert summary["algorithm"] == algorithm and summary["base_model"] == str(tmp_path / "base")
    assert set(result["base"]["pass_at_k"]) == {"1", "2", "4"}
    assert "base (SFT)" in paths["markdown"].read_text() and paths["plot"].stat().st_size > 0
