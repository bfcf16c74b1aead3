"""Benchmarks run at tiny sizes so their code cannot rot (their figures come from full-size runs outside CI)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agpo.models import TinyModelConfig, build_tiny_qwen2, save_model, train_bpe_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def run_benchmark(script: str, args: list[str], results: Path) -> dict:
    env = {**os.environ, "AGPO_BENCH_RESULTS": str(results), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = results.glob("*.json")
    return json.loads(written.read_text())


TOP_LAYER = ["--trainable-layers", "1"]


@pytest.mark.integration
def test_teacher_sft_benchmark_reports_full_lora_and_their_top_layer_variants(tmp_path):
    tokenizer = train_bpe_tokenizer(["<query>red shoes</query> <answer>3</answer>"] * 5, 300)
    tokenizer.chat_template = CHATML
    save_model(build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64)), tokenizer, tmp_path / "m")
    result = run_benchmark(
        "bench_teacher_sft.py",
        ["--base-model", str(tmp_path / "m"), "--examples", "8", "--audit", "4", "--batch-size", "4", *TOP_LAYER],
        tmp_path / "results",
    )
    runs = result["runs"]
    assert set(runs) == {"full", "lora", "full_top", "lora_top"} and result["commit"]
    trained = {name: row["trainable_parameters"] for name, row in runs.items()}
    assert trained["lora_top"] < trained["lora"] < trained["full"] and trained["full_top"] < trained["full"]
    assert runs["full"]["sft_steps"] == 2 and result["step_time_over_full"]["full"] == 1.0


@pytest.mark.integration
def test_score_benchmark_reports_torch_and_onnx_for_the_tiny_student(tmp_path):
    result = run_benchmark(
        "bench_score.py", ["--pairs", "20", "--repeats", "1", "--backbones", "tiny"], tmp_path / "results"
    )
    tiny = result["students"]["tiny"]
    assert result["commit"] and result["machine"]["cpus"] and result["pairs"] == 20
    assert tiny["torch"]["scoring_pairs_per_s"] > 0 and tiny["onnx"]["end_to_end_pairs_per_s"] > 0
    assert tiny["max_abs_probability_difference"] < 1e-4


@pytest.mark.integration
def test_annotate_benchmark_gives_the_raw_engine_the_pipelines_generation_work(tmp_path):
    result = run_benchmark("bench_annotate.py", ["--pairs", "24", "--repeats", "2"], tmp_path / "results")
    assert result["same_generated_tokens"] and result["end_to_end"]["tokens"] > 0
    assert result["targets"]["pipeline_overhead"]["value"] == result["pipeline_overhead"]
    for kind in ("raw_engine", "end_to_end"):  # both orders ran; each run's engine time is inside its total
        assert len(result["seconds_each"][kind]) == len(result["generate_seconds_each"][kind]) == 2
        assert all(
            0 < g <= t for g, t in zip(result["generate_seconds_each"][kind], result["seconds_each"][kind], strict=True)
        )


@pytest.mark.integration
@pytest.mark.minutes(7)  # the file's tests together
def test_trl_benchmark_times_each_contender_in_its_own_process(tmp_path):
    # two of the four contenders, one of each trainer (each is a fresh process: CI time)
    args = ["--steps", "1", "--rounds", "1", "--contenders", "ours_agpo", "trl_default"]
    result = run_benchmark("bench_trl.py", args, tmp_path / "results")
    assert set(result["table"]) == {"ours_agpo", "trl_default"}
    assert all(row["step_s"] > 0 and row["tokens_per_step"] > 0 for row in result["table"].values())
    assert list(result["ratios"]) == ["trl_default_over_ours_agpo"]
    assert result["targets"]["step_over_trl_default"]["ratio"] == result["ratios"]["trl_default_over_ours_agpo"]["step"]


@pytest.mark.integration
def test_contention_benchmark_reports_each_scenarios_slowdown_against_the_fair_share(tmp_path):
    # one workload (the cheapest to set up): the scenarios, not the workloads, are the benchmark's code
    args = ["--workloads", "serving", "--settings", "product", "--scenarios", "busy1", "copy"]
    result = run_benchmark("bench_contention.py", [*args, "--seconds", "0.1"], tmp_path / "results")
    rows = result["results"]["product/serving"]
    assert list(rows) == ["alone", "busy1", "copy"]
    cpus, threads = result["usable_cpus"], rows["alone"]["threads"]
    fair = min(threads, cpus) / min(threads, cpus, cpus * threads / (threads + 1))  # 1.5 for 2 threads on 2
    assert rows["alone"]["slowdown"] == 1.0 and rows["busy1"]["fair_slowdown"] == round(fair, 3)
    assert rows["copy"]["threads"] == max(1, rows["alone"]["threads"] // 2)  # AGPO_TASK_SLOTS=2


@pytest.mark.integration
def test_parallel_shards_benchmark_labels_every_shard_both_ways(tmp_path):
    result = run_benchmark("bench_parallel_shards.py", ["--pairs", "40", "--shards", "2"], tmp_path / "results")
    assert set(result["seconds"]) == {"sequential", "parallel"}
    ratio = result["pairs_per_s"]["parallel"] / result["pairs_per_s"]["sequential"]
    assert result["targets"]["parallel_over_sequential"]["ratio"] == pytest.approx(ratio, rel=0.01)


@pytest.mark.integration
def test_student_training_benchmark_reports_every_contender_and_the_scaling_rows(tmp_path):
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
    from student.model import RelevanceStudent, StudentConfig

    rows = generate_pairs(SyntheticConfig(train=100, audit=0, unlabeled=0, test=0))
    texts = [f"{r['query']} {r['ad_title']}" for r in rows]
    encoder = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="cross"), texts=texts)
    encoder.save(tmp_path / "encoder")  # a local encoder folder both CrossEncoder and our student load
    sizes = ["--train-pairs", "64", "--audit-pairs", "32", "--sizes", "100,200"]
    args = ["--backbone", str(tmp_path / "encoder"), "--synthetic", *sizes]
    result = run_benchmark("bench_student_training.py", args, tmp_path / "results")
    versus = result["vs_cross_encoder"]
    assert set(versus["table"]) == {"ours", "ours_grouped", "ours_bf16", "ours_grouped_bf16", "cross_encoder"}
    assert all(row["pairs_per_s"] > 0 and 0 <= row["audit_roc_auc_relevant"] <= 1 for row in versus["table"].values())
    assert versus["ratios"]["ours"]["speed_over_cross_encoder"] > 0 and versus["train_pairs"] == 64
    assert [row["pairs"] for row in result["scaling"]["rows"]] == [100, 200]
    assert result["scaling"]["rows"][0]["seconds_per_pair_over_smallest"] == 1.0


@pytest.mark.integration
def test_distil_memory_benchmark_reports_the_stage_and_the_rows_baseline_per_size(tmp_path):
    result = run_benchmark("bench_distil_memory.py", ["--sizes", "200,400"], tmp_path / "results")
    assert [row["labels"] for row in result["sizes"]] == [200, 400]
    assert [row["rows"] for row in result["sizes"]] == [500 + 200, 700 + 400]  # pairs (300 gold) and labels
    for row in result["sizes"]:
        assert row["peak_rss_mb"] > row["rss_before_mb"] > 0 and row["rows_rss_mb"] > 0
    ratio = result["sizes"][1]["peak_rss_mb"] / result["sizes"][0]["peak_rss_mb"]
    assert result["targets"]["stage_rss_largest_over_smallest"]["ratio"] == pytest.approx(ratio, abs=1e-3)
