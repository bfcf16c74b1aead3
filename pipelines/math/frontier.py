"""The equal-pass@1 frontier: pass@k against pass@1 along training, and pass@k at matched pass@1.

A run that trains longer gains pass@1 and may lose reach (pass@k at large k); comparing two algorithms at
one budget mixes the two. The fair form of the papers' claim compares pass@k where both have the *same*
pass@1. math-compare with ``frontier_every: N`` evaluates every run's held-out problems with ``samples``
samples at the start, every N steps and at the end (the ``eval/heldout_pass@1`` and
``eval/heldout_pass@<samples>`` lines of its metrics.jsonl). Here:

- :func:`training_path` reads one run's points (step, generated tokens, pass@1, pass@k) in training order;
- :func:`pass_at_k_at` interpolates pass@k where the path first reaches a target pass@1: linearly between
  the two evaluations that bracket it (the first crossing, since training can fall back), None when the
  run never gets there;
- :func:`frontier` gives, per algorithm and target, the mean and sample sd over the seeds that reached it
  and how many did; :func:`frontier_table` writes it as markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from durable.fileio import read_jsonl

Point = tuple[int, float, float, float]  # step, generated tokens, pass@1, pass@k


def training_path(metrics: Path, k: int) -> list[Point]:
    """The evaluations of one run in training order: (step, generated tokens so far, pass@1, pass@k)."""
    rows, _ = read_jsonl(metrics)
    points, tokens = [], 0.0
    for row in rows:
        tokens = row.get("generated_tokens", tokens)
        if "eval/heldout_pass@1" in row:
            if f"eval/heldout_pass@{k}" not in row:
                raise ValueError(
                    f"{metrics} step {row['step']} has no eval/heldout_pass@{k}: train with eval_samples = {k} "
                    "(math-compare sets it when frontier_every > 0)"
                )
            points.append((int(row["step"]), float(tokens), row["eval/heldout_pass@1"], row[f"eval/heldout_pass@{k}"]))
    return points


def pass_at_k_at(path: Sequence[Point], target: float) -> float | None:
    """pass@k where ``path`` first reaches pass@1 = ``target`` (linear between bracketing evaluations)."""
    for (_, _, p1_a, pk_a), (_, _, p1_b, pk_b) in pairwise(path):
        if p1_a == target:
            return pk_a
        if p1_a < target <= p1_b:
            return pk_a + (pk_b - pk_a) * (target - p1_a) / (p1_b - p1_a)
    if path and path[-1][2] == target:
        return path[-1][3]
    return None


def frontier(paths: Mapping[str, Sequence[Sequence[Point]]], targets: Sequence[float]) -> list[dict[str, Any]]:
    """Per algorithm (its seeds' paths) and target pass@1: pass@k mean and sd over the seeds that reached it."""
    rows = []
    for algorithm, seeds in paths.items():
        for target in targets:
            reached = [v for v in (pass_at_k_at(path, target) for path in seeds) if v is not None]
            rows.append(
                {
                    "algorithm": algorithm,
                    "pass@1": target,
                    "reached": len(reached),
                    "seeds": len(seeds),
                    "pass@k": float(np.mean(reached)) if reached else None,
                    "pass@k_sd": float(np.std(reached, ddof=1)) if len(reached) > 1 else None,
                }
            )
    return rows


def frontier_table(rows: Sequence[dict[str, Any]], k: int) -> str:
    """Markdown: one row per target pass@1, one column per algorithm (pass@k mean ± sd, seeds that reached)."""
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    targets = list(dict.fromkeys(r["pass@1"] for r in rows))
    cell = {(r["algorithm"], r["pass@1"]): r for r in rows}
    lines = [
        "| matched pass@1 | " + " | ".join(f"{a}: pass@{k}" for a in algorithms) + " |",
        "|---:|" + "---:|" * len(algorithms),
    ]
    for target in targets:
        cells = []
        for algorithm in algorithms:
            r = cell[(algorithm, target)]
            if r["pass@k"] is None:
                cells.append(f"not reached (0/{r['seeds']})")
            else:
                sd = f" ± {r['pass@k_sd']:.3f}" if r["pass@k_sd"] is not None else ""
                cells.append(f"{r['pass@k']:.3f}{sd} ({r['reached']}/{r['seeds']})")
        lines.append(f"| {target:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
