"""benchmarks/gpu_check.sh runs on CPU at a tiny size (``--tiny``) so the GPU check cannot rot between the rare
runs on a GPU machine: the trainer-vs-TRL contenders and every stage of the ads pipeline."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_gpu_check_tiny_on_cpu_reports_every_contender_and_every_pipeline_stage(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--tiny", "--steps", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["gpu"] is None and result["dtype"] == "float32" and result["machine"]["cpus"]
    assert result["shape"]["group_size"] == 2 and result["peak_bf16_flops_datasheet"] is None
    assert set(result["table"]) == {"ours_grpo", "trl_default", "trl_no_checkpointing"}
    for name, row in result["table"].items():
        assert "error" not in row, (name, row)
        assert row["tokens_per_step"] > 0 and row["rollout_tokens_per_s"] > 0 and row["update_flops_per_s"] > 0
        assert row["update_mfu"] is None and row["parameters"] == result["model_parameters"]
    assert set(result["ratios"]) == {"trl_default_over_ours_grpo", "trl_no_checkpointing_over_ours_grpo"}
    pipeline = json.loads((tmp_path / "gpu_pipeline.json").read_text())
    assert pipeline["gpu"] is None and pipeline["device"].startswith("cpu, fp32") and pipeline["pairs"] == 300
    stages = pipeline["stages"]
    assert list(stages) == ["teacher_sft", "teacher_rl", "annotate_score_mode", "distil", "score"]
    assert all(row["per_s"] > 0 and row["peak_gpu_memory_gib"] is None for row in stages.values())
    assert stages["annotate_score_mode"]["count"] == stages["score"]["count"] == 300
