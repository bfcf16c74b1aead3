"""Stage ``agpo train-compare``: train the same SFT teacher with several algorithms and seeds at an equal
generated-token budget and print one comparison table (docs/algorithms.md section 5: compare at equal budget).

Every entry of ``algorithms`` names a preset, ``configs/train/<name>.yaml`` (grpo, agpo, agpo_always,
gspo, cispo, clip_higher, ...), merged over the shared ``train`` run exactly as math-compare does; each
(algorithm, seed) trains from the same base into ``out_dir/<algorithm>/seed-<s>`` and stops at the first
step past ``token_budget`` generated tokens. ``comparison.json`` holds every run and the per-algorithm mean
and sample sd over seeds of audit accuracy (sampled pass@1, maj@n, greedy) at the end; ``comparison.md``
is the table. A finished run is read back, not retrained, and an interrupted one resumes from its newest
checkpoint (pipelines.rl.stage.run_once), so rerunning the command finishes the grid.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.ads.teacher.train import run as train_teacher
from pipelines.ads.teacher.train_config import TrainTeacherConfig
from pipelines.config import apply_presets
from pipelines.experiments.train_compare_config import CompareConfig
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.rl.stage import run_once
from pipelines.steps import preset


def run_config(config: CompareConfig, algorithm: str, seed: int) -> TrainTeacherConfig:
    """The shared run with ``algorithm``'s preset merged over it, its seed, the budget and its folder."""
    merged = apply_presets(
        config.train,
        [preset(f"configs/train/{algorithm}.yaml")],
        [f"trainer.seed={seed}", f"out_dir={Path(config.out_dir) / algorithm / f'seed-{seed}'}"],
    )
    trainer = dataclasses.replace(
        merged.trainer, token_budget=config.token_budget, max_steps=max(merged.trainer.max_steps, 10_000)
    )
    return dataclasses.replace(merged, trainer=trainer)


def run(config: CompareConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    runs = [
        {"seed": seed, **_summary(run_once(run_config(config, algorithm, seed), train_teacher)), "algorithm": algorithm}
        for algorithm in config.algorithms
        for seed in config.seeds
    ]
    samples = config.train.audit_samples
    table = aggregate(runs, samples)
    markdown = markdown_table(table, runs, config, samples)
    paths = {
        "table": write_atomic(out / "comparison.md", markdown),
        "results": write_json_atomic(out / "comparison.json", {"table": table, "runs": runs}),
    }
    print_summary(markdown, paths)
    return paths


def _summary(paths: dict[str, Path]) -> dict[str, Any]:
    return json.loads(paths["summary"].read_text())


def metric_keys(samples: int) -> dict[str, str]:
    """Table column -> summary key (without its _start / _end suffix)."""
    return {
        "audit acc (sampled)": "audit_accuracy",
        f"audit maj@{samples}": f"audit_maj@{samples}",
        "audit acc (greedy)": "audit_greedy_accuracy",
    }


def aggregate(runs: list[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """Per algorithm: mean and sample sd over seeds of each audit metric at the end, steps, tokens, minutes."""
    table = []
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        mine = [r for r in runs if r["algorithm"] == algorithm]
        row: dict[str, Any] = {"algorithm": algorithm, "seeds": [r["seed"] for r in mine]}
        for key in [f"{k}_end" for k in metric_keys(samples).values()] + ["steps", "generated_tokens", "seconds"]:
            values = np.array([float(r[key]) for r in mine])
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        table.append(row)
    return table


def markdown_table(table: list[dict[str, Any]], runs: list[dict[str, Any]], config: CompareConfig, samples: int) -> str:
    keys = metric_keys(samples)
    starts = {k: np.array([r[f"{k}_start"] for r in runs]) for k in keys.values()}  # the start depends on the seed
    seeds = ", ".join(str(s) for s in config.seeds)
    lines = [
        f"Teacher RL at an equal budget of {config.token_budget:,} generated tokens from the same SFT teacher "
        f"({config.train.base_model}); {config.train.audit_examples} audit pairs; mean ± sd over seeds {seeds}.",
        "",
        "| algorithm | " + " | ".join(keys) + " | steps | generated tokens | minutes per run |",
        "|---|" + "---:|" * (len(keys) + 3),
        "| SFT start | "
        + " | ".join(f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}" for v in starts.values())
        + " | 0 | 0 | |",
    ]
    for row in table:
        cells = [f"{row[f'{k}_end']:.3f} ± {row[f'{k}_end_sd']:.3f}" for k in keys.values()]
        lines.append(
            f"| {row['algorithm']} | " + " | ".join(cells) + f" | {row['steps']:.0f} | {row['generated_tokens']:,.0f} "
            f"| {row['seconds'] / 60:.1f} |"
        )
    return "\n".join(lines) + "\n"
