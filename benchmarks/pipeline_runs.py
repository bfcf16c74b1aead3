"""One table from finished ads pipeline runs: teacher, labels, students, baselines, the champion and minutes.

Reads each run folder (``work/runs/<run>``, written by ``make demo`` / ``make demo-small-lm`` or ``agpo
pipeline``) and nothing else, so docs/small-lm.md's preset comparison is regenerated from what the runs wrote:

- teacher: greedy audit accuracy before SFT, after SFT (``teacher/sft/teacher_report.json``) and after RL,
  greedy and sampled (``teacher/rl/summary.json``);
- labels: accuracy and macro-F1 of the teacher's labels against the hidden gold of the unlabeled split
  (``annotate/quality_report.json``);
- every model ``agpo evaluate`` scored on the gold test split (the run's student, the gold-only student, the
  zero-shot encoder and the lexical matcher): macro-F1, accuracy, ROC-AUC (relevant vs not) and NDCG@10,
  and the bootstrap interval of the run's student against each (``student/eval/metrics.json``);
- what the register step did with them (``student/registration.json``: the candidate, promoted or not);
- minutes per stage: wall time between the steps' ``_SUCCESS`` markers (the teacher's clock starts at
  the validate step's marker; annotation covers partition, shards and merge; evaluate includes the gold-only
  student).

Run: ``.venv/bin/python benchmarks/pipeline_runs.py work/runs/demo work/runs/small-lm-demo``; writes
``benchmarks/results/pipeline_runs.json`` (with the commit and machine) and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import machine, write_results

# stage -> the step whose marker ends it; each stage starts where the previous one ended
STAGES = (
    ("teacher SFT", "teacher"),
    ("teacher RL", "train"),
    ("annotation", "merge"),
    ("student", "distil"),
    ("evaluation", "evaluate"),
)
STUDENT_METRICS = ("macro_f1", "accuracy", "roc_auc_relevant", "ndcg@10")
MODELS = (
    ("student", "student"),
    ("gold_only", "gold-only student"),
    ("zero_shot", "zero-shot encoder"),
    ("lexical", "lexical matcher"),
)


def _candidate(champion: dict[str, Any]) -> str:
    """``gold_only, promoted``, ``student, kept as challenger`` or ``none``: what the register step did."""
    if not champion.get("candidate"):
        return "none"
    return f"{champion['candidate']}, {'promoted' if champion.get('promoted') else 'kept as challenger'}"


def _interval(run: dict[str, Any], other: str, metric: str) -> str:
    diff = run["student_minus"].get(other, {}).get(metric)
    return "-" if diff is None else f"{diff['difference']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SystemExit(f"{path} is missing: is {path.parents[1]} a finished pipeline run folder?")
    return json.loads(path.read_text(encoding="utf-8"))


def stage_minutes(run: Path) -> dict[str, float]:
    """Minutes per stage from the step markers' modification times."""
    steps = run / "steps"
    previous = (steps / "validate_SUCCESS.json").stat().st_mtime
    minutes = {}
    for stage, step in STAGES:
        ended = (steps / f"{step}_SUCCESS.json").stat().st_mtime
        minutes[stage] = round((ended - previous) / 60, 1)
        previous = ended
    minutes["total (validate to evaluate)"] = round(sum(minutes.values()), 1)
    return minutes


def run_figures(run: Path) -> dict[str, Any]:
    teacher = _read(run / "teacher/sft/teacher_report.json")
    rl = _read(run / "teacher/rl/summary.json")
    agreement = _read(run / "annotate/quality_report.json").get("gold_agreement") or {}
    report = _read(run / "student/eval/metrics.json")
    registration = _read(run / "student/registration.json")
    return {
        "run": run.name,
        "teacher": teacher["base_model"],
        "teacher_parameters": teacher["parameters"],
        "teacher_trained_parameters": teacher["trainable_parameters"],
        "teacher_audit_greedy": {
            "base": teacher["audit_accuracy_base"],
            "sft": teacher["audit_accuracy_sft"],
            "rl": rl["audit_greedy_accuracy_end"],
        },
        "teacher_audit_sampled": {"rl_start": rl["audit_accuracy_start"], "rl_end": rl["audit_accuracy_end"]},
        "rl_algorithm": rl["algorithm"],
        "rl_steps": rl["steps"],
        "labels": {k: agreement.get(k) for k in ("accuracy", "macro_f1")},
        "student_kind": _read(run / "student/distil.json").get("kind"),
        "shipped": _read(run / "student/distil.json").get("shipped"),
        "models": {name: {k: m[k] for k in STUDENT_METRICS} for name, m in report["models"].items()},
        "student_minus": {
            pair.split(" - ")[1]: values
            for pair, values in report["differences"].items()
            if pair.startswith("student -")
        },
        "champion": {k: registration.get(k) for k in ("candidate", "version", "promoted", "reason")},
        "minutes": stage_minutes(run),
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    rows = [
        ("teacher", lambda r: f"{r['teacher']} ({r['teacher_parameters'] / 1e6:.1f}M)"),
        ("teacher audit accuracy, greedy: base", lambda r: r["teacher_audit_greedy"]["base"]),
        ("... after SFT", lambda r: r["teacher_audit_greedy"]["sft"]),
        ("... after RL", lambda r: r["teacher_audit_greedy"]["rl"]),
        ("teacher audit accuracy, sampled: RL start -> end", None),
        ("label accuracy (unlabeled split's hidden gold)", lambda r: r["labels"]["accuracy"]),
        ("student kind (shipped)", lambda r: f"{r['student_kind']} ({r['shipped']})"),
    ]
    for name, title in MODELS:
        rows += [(f"{title} {k}", lambda r, n=name, k=k: r["models"].get(n, {}).get(k)) for k in STUDENT_METRICS[:3]]
    for name, title in MODELS[1:]:
        for metric in ("macro_f1", "roc_auc_relevant"):
            rows.append((f"student - {title}, {metric} [95 %]", lambda r, n=name, m=metric: _interval(r, n, m)))
    rows.append(("champion candidate", lambda r: _candidate(r["champion"])))
    stages = [stage for stage, _ in STAGES] + ["total (validate to evaluate)"]
    rows += [(f"minutes: {stage}", lambda r, s=stage: f"{r['minutes'][s]:.1f}") for stage in stages]
    lines = ["| | " + " | ".join(r["run"] for r in runs) + " |", "|---|" + "---:|" * len(runs)]
    for label, get in rows:
        if get is None:
            values = [
                f"{r['teacher_audit_sampled']['rl_start']:.3f} -> {r['teacher_audit_sampled']['rl_end']:.3f}"
                for r in runs
            ]
        else:
            values = [cell(get(r)) for r in runs]
        lines.append(f"| {label} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished pipeline run folders (work/runs/<run>)")
    args = parser.parse_args()
    runs = [run_figures(run) for run in args.runs]
    table = markdown(runs)
    write_results("pipeline_runs", {"machine": machine(), "runs": runs, "table": table})
    print(table)


if __name__ == "__main__":
    main()
