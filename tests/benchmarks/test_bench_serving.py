"""The student serving benchmark at a tiny size: its JSON has every runner, ratio and target, and agrees."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNERS = {
    "cross_encoder",
    "cross_encoder_onnx",
    "ours_torch",
    "ours_onnxruntime",
    "ours_onnxruntime_int8",
    "ours_onnxruntime_int8_every_matmul",
}
TINY = ["--pairs", "20", "--repeats", "1", "--latency-requests", "3", "--sweep-pairs", "8"]
TINY_TRAINING = ["--train-pairs", "24", "--epochs", "1", "--test-pairs", "16", "--seeds", "2"]


@pytest.mark.integration
def test_serving_benchmark_reports_both_baselines_latency_and_the_int8_change(tmp_path):
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "benchmarks" / "bench_student_serving.py"
    done = subprocess.run([sys.executable, str(script), *TINY, *TINY_TRAINING], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "student_serving.json").read_text())
    assert result["commit"] and result["machine"]["cpus"] and result["pairs"] == 20
    assert set(result["results"]) == RUNNERS
    for row in result["results"].values():
        assert row["pairs_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["ratio_vs_cross_encoder"] > 0 and row["ratio_vs_cross_encoder_onnx"] > 0
    assert max(result["max_abs_probability_difference_vs_cross_encoder"].values()) < 1e-4
    assert result["int8_max_abs_probability_difference_vs_fp32"] < 0.1
    assert set(result["gold_test"]["ours_onnxruntime_int8"]) == {"accuracy", "macro_f1"}
    assert len(result["onnxruntime_settings"]["pairs_per_s"]) == 8
    targets = result["targets"]
    assert targets["torch_baseline"]["target"] == 3.0 and targets["onnx_baseline"]["target"] == 1.5
    assert targets["torch_baseline"]["ratio"] > 0 and targets["onnx_baseline"]["ratio"] > 0
    recipes = result["int8_recipes"]
    assert recipes["seeds"] == 2 and len(recipes["by_seed"]) == 2
    for seed in recipes["by_seed"]:
        assert set(seed) == {"ffn_output_fp32", "every_matmul"}
        for change in seed.values():
            assert 0 <= change["flips"] <= 16 and 0 <= change["mean_abs_probability_difference"] < 0.1
    for figure in ("accuracy_change_points", "macro_f1_change_points"):  # the target is the product's worst seed
        seeds = [seed["ffn_output_fp32"][figure] for seed in recipes["by_seed"]]
        assert recipes["over_seeds"]["ffn_output_fp32"][figure]["worst"] == min(seeds)
        assert targets[f"int8_{figure}"]["value"] == min(seeds)


BACKENDS_TINY = [
    *("--backbone", "tiny", "--synthetic", "--pairs", "8", "--train-pairs", "16", "--audit-pairs", "8"),
    *("--test-pairs", "8", "--epochs", "1", "--repeats", "1", "--latency-requests", "2"),
    *("--st-contenders", "st_torch,st_onnx_int8"),  # CI time: the others run in the full benchmark
]
SIDE_PYTHON = ROOT / ".venv-optimum" / "bin" / "python"


@pytest.mark.integration
def test_serving_backends_benchmark_reports_ours_and_sentence_transformers_side_by_side(tmp_path):
    if not SIDE_PYTHON.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SIDE_PYTHON} is missing: make venv-optimum")
        pytest.skip(f"{SIDE_PYTHON} is missing: make venv-optimum")
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    script = ROOT / "benchmarks" / "bench_serving_backends.py"
    done = subprocess.run([sys.executable, str(script), *BACKENDS_TINY], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "serving_backends.json").read_text())
    assert result["machine"]["cpu_vector_extensions"] is not None and result["versions"]["side_venv"]["optimum-intel"]
    ours = {"ours_torch", "ours_onnx", "ours_onnx-int8", "ours_openvino", "ours_openvino-int8"}
    assert ours | {"st_torch", "st_onnx_int8"} <= set(result["results"])
    for row in result["results"].values():
        assert row["pairs_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"] and 0 <= row["flipped_share"] <= 1
    assert result["results"]["ours_onnx"]["roc_auc_change"] == 0
    assert result["auto"]["choice"] in result["auto"]["measured"]
    targets = result["targets"]
    assert targets["vs_cross_encoder_torch"]["theirs"] == "st_torch" and targets["vs_cross_encoder_torch"]["ratio"] > 0
    best = targets["vs_fastest_sentence_transformers"]["ours"]
    assert targets["roc_auc_change"]["value"] == result["results"][best]["roc_auc_change"] >= -0.005
