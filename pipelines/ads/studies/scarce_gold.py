"""Stage ``agpo study scarce-gold``: where does a teacher pay off? Students against the gold budget.

The seed paper finds teachers help with large teachers, scarce gold and plentiful unlabeled traffic. This
study measures that regime on any pairs file (``pairs``: an ``agpo data import`` output; null: the synthetic
set of ``pipeline.data``, e.g. with configs/pipeline/realistic.yaml mounted under ``pipeline``):

    for each gold budget N in ``budgets`` and each seed in ``seeds``:
      arm pairs  = N gold train pairs (whole queries, drawn with the seed) + the same audit and test splits
                   + the same unlabeled pool (the first ``pool`` unlabeled pairs)
      teacher    = the pipeline's steps on the arm: SFT (+ the prior gate), RL, the gate, annotation of the pool
      students   = agpo compare-students on the arm (seed = the arm's seed): gold only (the N pairs),
                   teacher labels only, gold + teacher (gold wins a pair in both), and the baselines
                   (zero-shot encoder, lexical matcher) fitted on the N gold pairs; all on the same test pairs

A teacher that fails a gate labels nothing, as in the pipeline: its arm has the gold-only student and the
baselines only, and the table says why (``label_past_gate: true`` labels anyway and records the verdict, to
see what its labels would have given).

Outputs in ``out_dir``: one folder per arm (``n<N>-s<seed>/``: pairs, the pipeline run folder, the students),
``results.json`` (every arm: gate verdict, wall time per part, every model's test macro-F1 and ROC-AUC of
"relevant"), ``scarce_gold.md`` (mean ± sd over seeds per N and model, the crossover and the wall times) and
``scarce_gold.png`` (macro-F1 and ROC-AUC against N, a band of ± sd per model). The crossover is the
smallest N from which gold + teacher's mean macro-F1 no longer beats the gold-only student's. Every part is a
pipeline step or a checkpointed student, so a rerun resumes where it stopped and a finished arm is read
back, not trained again.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.intake import data as data_stage
from pipelines.ads.intake.contracts import ContractError, pairs_table, read_pairs, write_table
from pipelines.ads.pipeline_config import AdsPipelineConfig, distil_config, layout, study_run
from pipelines.ads.studies import compare_students
from pipelines.ads.studies.scarce_gold_config import ScarceGoldConfig
from pipelines.errors import StepSkipped
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_mean_sd_panels
from pipelines.steps import Caller

GOLD_ONLY, TEACHER, MIXED = "gold only", "teacher labels only", "gold + teacher"
STUDENT_ROWS = {compare_students.TRAIN_GOLD: GOLD_ONLY, "teacher": TEACHER, "teacher+gold-w1": MIXED}
METRICS = {"macro_f1": "test macro-F1", "roc_auc_relevant": "test ROC-AUC (relevant)"}
GATES_OFF = {"min_audit_accuracy": 0.0, "max_predicted_share": 1.0, "min_balanced_margin": None}


def source_pairs(config: ScarceGoldConfig, out: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The rows every arm draws from, and the hidden gold of the unlabeled pairs (when there is one)."""
    if config.pairs:
        return read_pairs(config.pairs).to_pylist(), config.unlabeled_gold
    synthetic = replace(config.pipeline.data.synthetic, train=max(config.budgets), unlabeled=config.pool)
    paths = data_stage.run(replace(config.pipeline.data, out_dir=str(out / "data"), synthetic=synthetic))
    return read_pairs(paths["pairs"]).to_pylist(), str(paths["unlabeled_gold"])


def arm_rows(rows: list[dict[str, Any]], budget: int, pool: int, seed: int) -> list[dict[str, Any]]:
    """``budget`` gold train pairs (whole queries in a seeded random order, the last query cut to fit), the
    audit and test splits as they are, and the first ``pool`` unlabeled pairs."""
    train = [r for r in rows if r["split"] == "train" and r["gold_grade"] is not None]
    if len(train) < budget:
        raise ContractError(f"a gold budget of {budget} needs as many gold train pairs; the pairs have {len(train)}")
    by_query: dict[str, list[dict[str, Any]]] = {}
    for r in train:
        by_query.setdefault(r["query"], []).append(r)
    queries = sorted(by_query)
    random.Random(seed).shuffle(queries)
    drawn = [r for q in queries for r in by_query[q]][:budget]
    unlabeled = [r for r in rows if r["split"] == "unlabeled"][:pool]
    return drawn + [r for r in rows if r["split"] in ("audit", "test")] + unlabeled


def run_arm(config: ScarceGoldConfig, rows: list[dict[str, Any]], gold: str | None, budget: int, seed: int):
    """One (budget, seed) arm: its result row (read back when the arm finished before)."""
    name = f"n{budget}-s{seed}"
    arm = Path(config.out_dir) / name
    done = arm / "arm.json"
    if done.is_file():
        return json.loads(done.read_text())
    pairs = arm / "pairs.parquet"
    if not pairs.is_file():
        write_table(pairs_table(arm_rows(rows, budget, config.pool, seed)), pairs)
    pipeline = study_run(
        config.pipeline, name, arm / "runs", seed, config.experiment, pairs=str(pairs), unlabeled_gold=gold
    )
    caller = Caller(dag_run_id=name)
    pipeline, verdict, labeled, seconds = teach(pipeline, caller, config.label_past_gate)
    if labeled:
        started = time.perf_counter()
        for shard in ads_pipeline.partition_shards(pipeline, caller):
            ads_pipeline.annotate_shard(pipeline, shard, caller)
        ads_pipeline.merge(pipeline, caller)
        seconds["annotate"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    root = layout(pipeline)
    students = compare_students.StudentProtocolConfig(
        label_sets={"teacher": str(root.annotate)} if labeled else {},
        include_gold=False,
        train_gold=True,
        teacher_weights=(1.0,) if labeled else (),
        seeds=(seed,),
        out_dir=str(arm / "students"),
        distil=distil_config(pipeline),  # compare-students scores on its pairs: the arm's
        evaluate=pipeline.evaluate,
    )
    table = json.loads(Path(compare_students.run(students)["json"]).read_text())["table"]
    seconds["students"] = round(time.perf_counter() - started, 1)
    result = {
        "budget": budget,
        "seed": seed,
        "gate": verdict,
        "labeled": labeled,
        "seconds": seconds,
        "teacher": _teacher_figures(root),
        "models": {
            STUDENT_ROWS.get(row["labels"], row["labels"]): {k: row[k] for k in (*METRICS, "label_accuracy")}
            for row in table
        },
    }
    write_json_atomic(done, result)
    return result


def teach(pipeline: AdsPipelineConfig, caller: Caller, label_past_gate: bool):
    """The teacher steps of the pipeline on one arm: (the config the rest of the arm runs with, the gate
    verdict, whether the teacher labels the pool, seconds per part). A gate failure ends the teacher part, or
    (``label_past_gate``) is recorded and the part's steps rerun with the gates off: done steps return at once."""
    verdict, seconds = "passed", {}
    for part, steps in (("teacher", ("validate", "build_teacher")), ("rl", ("train", "gate"))):
        started = time.perf_counter()
        try:
            for step in steps:
                getattr(ads_pipeline, step)(pipeline, caller)
        except StepSkipped as failure:  # a teacher below a gate: the pipeline skips it
            verdict = str(failure)
            if not label_past_gate:
                seconds[part] = round(time.perf_counter() - started, 1)
                return pipeline, verdict, False, seconds
            pipeline = replace(pipeline, **GATES_OFF)
            for step in steps:
                getattr(ads_pipeline, step)(pipeline, caller)
        seconds[part] = round(time.perf_counter() - started, 1)
    return pipeline, verdict, True, seconds


def _teacher_figures(root) -> dict[str, Any]:
    """The SFT teacher's audit figures and the RL teacher's, for the table (absent parts are skipped)."""
    figures: dict[str, Any] = {}
    report, summary = root.sft / "teacher_report.json", root.rl / "summary.json"
    if report.is_file():
        sft = json.loads(report.read_text())
        figures.update({k: sft[k] for k in ("audit_balanced_accuracy_sft", "train_audit_gap", "sft_best_step")})
    if summary.is_file():
        rl = json.loads(summary.read_text())
        figures.update({k: rl.get(k) for k in ("audit_balanced_accuracy_end", "all_correct_frac_mean")})
    return figures


def summarise(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and sample sd per (budget, model, metric), the crossover budget and the mean wall time per part."""
    budgets = sorted({a["budget"] for a in arms})
    models = list(dict.fromkeys(m for a in arms for m in a["models"]))
    table: dict[str, dict[str, dict[str, list[float | None]]]] = {}
    for model in models:
        for metric in METRICS:
            means, sds = [], []
            for n in budgets:
                values = [a["models"][model][metric] for a in arms if a["budget"] == n and model in a["models"]]
                means.append(float(np.mean(values)) if values else None)
                sds.append(float(np.std(values, ddof=1)) if len(values) > 1 else 0.0 if values else None)
            table.setdefault(model, {})[metric] = {"mean": means, "sd": sds}
    return {
        "budgets": budgets,
        "table": table,
        "crossover": crossover(budgets, table),
        "gates_passed": {n: sum(a["gate"] == "passed" for a in arms if a["budget"] == n) for n in budgets},
        "seeds": {n: sum(a["budget"] == n for a in arms) for n in budgets},
        "mean_seconds": {
            part: float(np.mean([a["seconds"][part] for a in arms if part in a["seconds"]]))
            for part in dict.fromkeys(p for a in arms for p in a["seconds"])
        },
    }


def crossover(budgets: list[int], table: dict[str, Any]) -> dict[str, Any]:
    """The smallest budget from which gold + teacher's mean macro-F1 stays at or below gold only's."""
    if MIXED not in table:
        return {"budget": None, "reading": "no teacher labels at any budget (every teacher failed a gate)"}
    gains = [
        None if m is None or g is None else m - g
        for m, g in zip(table[MIXED]["macro_f1"]["mean"], table[GOLD_ONLY]["macro_f1"]["mean"], strict=True)
    ]
    known = [(n, d) for n, d in zip(budgets, gains, strict=True) if d is not None]
    if all(d <= 0 for _, d in known):
        return {"budget": None, "gains": gains, "reading": "gold + teacher never beats gold only"}
    tail = [n for i, (n, _) in enumerate(known) if all(d <= 0 for _, d in known[i:])]
    if not tail:
        return {"budget": None, "gains": gains, "reading": "gold + teacher beats gold only at the largest budget"}
    return {"budget": tail[0], "gains": gains, "reading": f"gold + teacher stops beating gold only at N = {tail[0]}"}


def markdown(summary: dict[str, Any]) -> str:
    budgets = summary["budgets"]
    lines = []
    for metric, title in METRICS.items():
        lines += [f"{title}, mean ± sd over seeds:", "", "| model | " + " | ".join(f"N = {n}" for n in budgets) + " |"]
        lines.append("|---|" + "---:|" * len(budgets))
        for model, metrics in summary["table"].items():
            cells = [
                "n/a" if m is None else f"{m:.3f} ± {s:.3f}"
                for m, s in zip(metrics[metric]["mean"], metrics[metric]["sd"], strict=True)
            ]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
    gates = ", ".join(f"N = {n}: {summary['gates_passed'][n]} of {summary['seeds'][n]}" for n in budgets)
    walls = ", ".join(f"{part} {s / 60:.1f} min" for part, s in summary["mean_seconds"].items())
    lines += [f"Crossover: {summary['crossover']['reading']}.", f"Teachers past the gates: {gates}."]
    lines.append(f"Mean wall time per arm: {walls}.")
    return "\n".join(lines) + "\n"


def run(config: ScarceGoldConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    rows, gold = source_pairs(config, out)
    arms = [run_arm(config, rows, gold, n, seed) for n in config.budgets for seed in config.seeds]
    summary = summarise(arms)
    curves = {
        title: {
            model: (summary["budgets"], metrics[metric]["mean"], metrics[metric]["sd"])
            for model, metrics in summary["table"].items()
            if None not in metrics[metric]["mean"]
        }
        for metric, title in METRICS.items()
    }
    paths = {
        "results": write_json_atomic(out / "results.json", {"arms": arms, **summary}),
        "table": write_atomic(out / "scarce_gold.md", markdown(summary)),
        "plot": plot_mean_sd_panels(
            curves, out / "scarce_gold.png", "Students against the gold budget", "gold train pairs N"
        ),
    }
    print(markdown(summary), end="")
    print_summary(
        f"scarce-gold study: {len(arms)} arms (budgets {list(config.budgets)}, seeds {list(config.seeds)}); "
        f"{summary['crossover']['reading']}",
        paths,
    )
    return paths
