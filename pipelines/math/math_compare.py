"""Stage ``agpo math-compare``: the papers' comparison at CPU scale.

One SFT-warmed base (pipelines.math.math_train builds it once, or ``train.base_model``), then for every
algorithm and seed an RL run from that same base, stopped at the same generated-token budget
(``train.trainer.token_budget``), and a pass@k evaluation of every trained model and of the base on the
same held-out problems with ``samples`` samples each (k = 1, 2, 4, ..., samples). Writes into
``out_dir``: one folder per run (``<algorithm>/seed-<s>/``: math-train and math-eval outputs),
``comparison.json`` (every run and the table), ``comparison.md`` (pass@1 and pass@k per algorithm, mean ±
sd over seeds, against the base) and ``pass_at_k.png`` (curves with ± sd bands, the base dashed).
With ``frontier_every: N`` every run is also evaluated with ``samples`` samples at the start, every N
steps and at the end, and ``frontier.{md,json,png}`` give pass@``samples`` against pass@1 along training
and at matched pass@1 (pipelines.math.frontier). Every run resumes or is a no-op when rerun.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.config import apply_presets
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.math import math_eval as math_eval
from pipelines.math import math_train as math_train
from pipelines.math.frontier import frontier, frontier_table, training_path
from pipelines.math.math_compare_config import MathCompareConfig
from pipelines.math.math_eval_config import MathEvalConfig
from pipelines.math.math_train_config import MathTrainConfig
from pipelines.plots import plot_frontier, plot_pass_at_k
from pipelines.rl.stage import run_once
from pipelines.steps import preset


def algorithm_config(config: MathCompareConfig, algorithm: str, seed: int, base: Path) -> MathTrainConfig:
    """The shared recipe with ``algorithm``'s preset merged over it, its seed, the shared base, its folder."""
    out_dir = Path(config.out_dir) / algorithm / f"seed-{seed}"
    overrides = [f"trainer.seed={seed}", f"base_model={base}", f"out_dir={out_dir}"]
    if config.frontier_every:
        overrides += [f"trainer.eval_every={config.frontier_every}", f"eval_samples={config.samples}"]
    return apply_presets(config.train, [preset(f"configs/train/{algorithm}.yaml")], overrides)


def run(config: MathCompareConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    train_problems, held_out = math_train.problems_of(config.train)
    base = (
        Path(config.train.base_model)
        if config.train.base_model
        else math_train.build_base(replace(config.train, out_dir=str(out)), train_problems)
    )
    evaluation = replace(config.evaluate, samples=config.samples)
    base_scores = _evaluate(evaluation, base, out / "base-eval", held_out, "base")
    runs = []
    for algorithm in config.algorithms:
        for seed in config.seeds:
            train_config = algorithm_config(config, algorithm, seed, base)
            trained = run_once(train_config, math_train.run)
            summary = json.loads(Path(trained["summary"]).read_text())
            scores = _evaluate(evaluation, trained["model"], Path(train_config.out_dir) / "eval", held_out, algorithm)
            runs.append(
                {
                    "algorithm": algorithm,
                    "seed": seed,
                    "generated_tokens": summary["generated_tokens"],
                    "steps": summary["steps"],
                    "pass_at_k": scores["pass_at_k"],
                    "maj_at_k": scores["maj_at_k"],
                }
            )
    table = aggregate(runs, base_scores)
    ks = [int(k) for k in base_scores["pass_at_k"]]
    curves = {
        row["algorithm"]: (ks, [row["pass_at_k"][k] for k in ks], [row["pass_at_k_sd"][k] for k in ks]) for row in table
    }
    markdown = markdown_table(table, base_scores, ks)
    paths = {
        "json": write_json_atomic(out / "comparison.json", {"base": base_scores, "table": table, "runs": runs}),
        "markdown": write_atomic(out / "comparison.md", markdown),
        "plot": plot_pass_at_k(
            curves,
            out / "pass_at_k.png",
            f"held-out pass@k, {len(config.seeds)} seeds, equal token budget",
            baseline=("base (SFT)", ks, [base_scores["pass_at_k"][k] for k in ks]),
        ),
    }
    if config.frontier_every:
        paths |= write_frontier(config, out)
    print(markdown, end="")
    print_summary(f"{len(config.algorithms)} algorithms x {len(config.seeds)} seeds compared", paths)
    return paths


def write_frontier(config: MathCompareConfig, out: Path) -> dict[str, Path]:
    """frontier.{json,md,png} from every run's evaluations along training (pipelines.math.frontier)."""
    k = config.samples
    paths = {
        algorithm: [training_path(out / algorithm / f"seed-{seed}" / "metrics.jsonl", k) for seed in config.seeds]
        for algorithm in config.algorithms
    }
    rows = frontier(paths, config.frontier_targets)
    lines = [f"held-out pass@{k} at matched pass@1 (first crossing, interpolated); (seeds that reached it)", ""]
    return {
        "frontier_json": write_json_atomic(out / "frontier.json", {"frontier": rows, "paths": paths}),
        "frontier_markdown": write_atomic(out / "frontier.md", "\n".join(lines) + frontier_table(rows, k)),
        "frontier_plot": plot_frontier(
            {a: [([p[2] for p in s], [p[3] for p in s]) for s in seeds] for a, seeds in paths.items()},
            out / "frontier.png",
            f"pass@{k} against pass@1 along training, {len(config.seeds)} seeds",
            k,
        ),
    }


def _evaluate(config: MathEvalConfig, model: str | Path, out: Path, problems, name: str) -> dict[str, Any]:
    paths = math_eval.run(replace(config, model=str(model), out_dir=str(out)), problems=problems, name=name)
    results = json.loads(Path(paths["results"]).read_text())
    results["pass_at_k"] = {int(k): v for k, v in results["pass_at_k"].items()}
    results["maj_at_k"] = {int(k): v for k, v in results["maj_at_k"].items()}
    return results


def aggregate(runs: list[dict[str, Any]], base: dict[str, Any]) -> list[dict[str, Any]]:
    """Per algorithm: mean and sample sd over seeds of pass@k and maj@k, and the mean token count."""
    table = []
    for algorithm in dict.fromkeys(r["algorithm"] for r in runs):
        mine = [r for r in runs if r["algorithm"] == algorithm]
        row: dict[str, Any] = {
            "algorithm": algorithm,
            "seeds": len(mine),
            "generated_tokens": float(np.mean([r["generated_tokens"] for r in mine])),
        }
        for metric in ("pass_at_k", "maj_at_k"):
            ks = list(mine[0][metric])
            values = {k: np.array([r[metric][k] for r in mine]) for k in ks}
            row[metric] = {k: float(v.mean()) for k, v in values.items()}
            row[f"{metric}_sd"] = {k: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for k, v in values.items()}
        table.append(row)
    return table


def markdown_table(table: list[dict[str, Any]], base: dict[str, Any], ks: list[int]) -> str:
    shown = [k for k in ks if k in (1, 4, 16, 64) or k == ks[-1]]
    header = ["algorithm", "tokens", *[f"pass@{k}" for k in shown], f"maj@{ks[-1]}"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines.append(
        "| base (SFT) | 0 | "
        + " | ".join(f"{base['pass_at_k'][k]:.3f}" for k in shown)
        + f" | {base['maj_at_k'][ks[-1]]:.3f} |"
    )
    for row in table:
        cells = [f"{row['pass_at_k'][k]:.3f} ± {row['pass_at_k_sd'][k]:.3f}" for k in shown]
        maj = f"{row['maj_at_k'][ks[-1]]:.3f} ± {row['maj_at_k_sd'][ks[-1]]:.3f}"
        lines.append(f"| {row['algorithm']} | {row['generated_tokens']:,.0f} | " + " | ".join(cells) + f" | {maj} |")
    return "\n".join(lines) + "\n"
