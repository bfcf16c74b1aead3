"""Stage ``agpo compare-students``: students from different labels and of different kinds, as one table.

The same student recipe (``distil``: backbone, distillation settings) is trained, for each seed, on:

- each teacher label set (``label_sets``: name -> annotation run folder; for the embedded setup the SFT-only,
  GRPO and AGPO teachers, ``make student-protocol``), and with ``teacher_weights`` also on the gold train
  pairs plus that set at each teacher weight (``<name>+gold-w<weight>``: label_source gold+teacher);
- the labeled pairs' hidden gold (``include_gold``: the reference) and gold with a share p of its grades
  replaced (``gold_noise``: controls of label accuracy exactly 1 - p);
- the gold train pairs alone (``train_gold``: the student a team has without any teacher);

and, with ``kinds``, once per student kind (cross, bi, hybrid: student.model). Every student is scored on
the gold audit split (what picks a default) and on the gold test split; the baselines (the zero-shot
encoder and the lexical matcher, evaluation.zero_shot, fitted once on the gold train pairs) are scored on
the same splits as reference rows. Students are compared as trained: the distil stage's zero-shot floor (a
shipping rule) is off here.

Per row the table shows how good the labels were (their accuracy and macro-F1 against the hidden gold, from
the annotation quality report) and how good the student became (audit macro-F1 and ROC-AUC; test accuracy,
macro-F1, ROC-AUC and PR-AUC of "relevant", NDCG@10, ECE), as mean ± sample standard deviation over
``seeds`` (each seed sets the student's initial weights and its shuffling). With ``gold_noise``,
pipelines.ads.studies.label_sensitivity fits student macro-F1 against label accuracy over the gold and control
students and places each teacher's students against that line (``sensitivity.png``, a second table).

Writes ``comparison.json`` (every student) and ``comparison.md`` (the table) into ``out_dir``, next to
one folder per student (``<labels>[-<kind>]/seed-<s>``: ``distil`` + ``evaluate`` outputs). Every student
checkpoints, so a rerun resumes or is a no-op.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from evaluation.baseline_registry import fit_baselines
from evaluation.baselines_config import BaselinesConfig
from evaluation.comparison import title
from evaluation.zero_shot import gold_train_rows
from pipelines.ads.distillation import evaluate as evaluate_stage
from pipelines.ads.distillation.evaluate import distil_and_evaluate, relevance_metrics
from pipelines.ads.intake.contracts import ContractError, read_pairs
from pipelines.ads.studies.compare_students_config import GOLD, StudentProtocolConfig
from pipelines.ads.studies.label_sensitivity import fit_sensitivity, plot_sensitivity, sensitivity_markdown
from pipelines.io import print_summary, write_atomic, write_json_atomic

TRAIN_GOLD = "train-gold"
COLUMNS = ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece")
AUDIT_COLUMNS = ("audit_macro_f1", "audit_roc_auc_relevant")
NO_BASELINES = BaselinesConfig(names=())


class StudentSpec(NamedTuple):
    """One row of the table before seeds: what the student learns from and its kind ('' : the recipe's)."""

    name: str
    folder: Path
    source: str
    noise: float = 0.0
    kind: str = ""
    teacher_weight: float = 1.0


def label_quality(annotation_dir: Path) -> dict[str, Any]:
    """The labels' agreement with the hidden gold, from the annotation quality report (empty if none)."""
    report = annotation_dir / "quality_report.json"
    if not report.is_file():
        return {}
    agreement = json.loads(report.read_text())["gold_agreement"] or {}
    return {"label_accuracy": agreement.get("accuracy"), "label_macro_f1": agreement.get("macro_f1")}


def noisy_gold_quality(history: dict[str, Any]) -> dict[str, Any]:
    """Gold labels with a share p replaced: accuracy 1 - round(p * n) / n, exactly (distil.corrupted)."""
    pairs = history["training_pairs"]
    return {"label_accuracy": 1 - round(history["gold_noise"] * pairs) / pairs, "control": True}


def aggregate(students: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (labels, kind): mean and sample standard deviation of each metric over its seeds."""
    rows = []
    for name, kind in dict.fromkeys((s["labels"], s["kind"]) for s in students):
        runs = [s for s in students if (s["labels"], s["kind"]) == (name, kind)]
        row = {"labels": name, "kind": kind, "seeds": len(runs)}
        row.update({k: runs[0].get(k) for k in ("label_accuracy", "label_macro_f1", "baseline")})
        for key in (*AUDIT_COLUMNS, *COLUMNS, "best_epoch"):
            values = np.array([np.nan if r.get(key) is None else r[key] for r in runs], dtype=float)
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    header = ["labels", "kind", "label acc", "label F1", "audit macro-F1", "audit ROC-AUC", "test acc"]
    header += ["test macro-F1", "ROC-AUC rel", "PR-AUC rel", "NDCG@10", "ECE", "best epoch"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for row in rows:
        cells = [row["labels"], row["kind"]]
        gold = row["labels"] in (GOLD, TRAIN_GOLD)
        cells += ["1.000" if gold else _fmt(row.get(k)) for k in ("label_accuracy", "label_macro_f1")]
        cells += [_fmt(row[k], row[f"{k}_sd"], row["seeds"]) for k in (*AUDIT_COLUMNS, *COLUMNS)]
        cells.append("-" if np.isnan(row["best_epoch"]) else f"{row['best_epoch']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, sd: float = 0.0, seeds: int = 1) -> str:
    if value is None or np.isnan(value):
        return "n/a"
    return f"{value:.3f} ± {sd:.3f}" if seeds > 1 else f"{value:.3f}"


def student_specs(config: StudentProtocolConfig) -> list[StudentSpec]:
    """Every (labels, kind) row the config asks for, in table order: gold rows, teachers, then mixes."""
    teachers = [StudentSpec(name, Path(folder), "teacher") for name, folder in config.label_sets.items()]
    # the gold reference learns from the same pairs as the teachers' students: those of the first label set
    folder = teachers[0].folder if teachers else Path(config.distil.labels).parent
    specs = [StudentSpec(TRAIN_GOLD, folder, "train-gold")] if config.train_gold else []
    specs += [StudentSpec(GOLD, folder, "gold")] if config.include_gold else []
    specs += [StudentSpec(f"{GOLD}-noise-{round(p * 100):02d}", folder, "gold", p) for p in config.gold_noise]
    specs += teachers
    specs += [
        StudentSpec(f"{t.name}+gold-w{w:g}", t.folder, "gold+teacher", teacher_weight=w)
        for t in teachers
        for w in config.teacher_weights
    ]
    return [spec._replace(kind=kind) for spec in specs for kind in (config.kinds or ("",))]


def baseline_rows(config: StudentProtocolConfig) -> list[dict[str, Any]]:
    """The baselines fitted once on the gold train pairs, scored on the audit and test splits: table rows."""
    pairs = read_pairs(config.distil.pairs).to_pylist()
    fitted = fit_baselines(config.evaluate.baselines, gold_train_rows(pairs), config.distil.student.num_grades)
    rows = []
    for name, model in fitted.items():
        row: dict[str, Any] = {"labels": title(name), "kind": "-", "baseline": True, "best_epoch": None}
        for split in ("audit", config.evaluate.split):
            gold = [r for r in pairs if r["split"] == split and r["gold_grade"] is not None]
            probs = model.predict_proba([r["query"] for r in gold], [r["ad_title"] for r in gold])
            metrics = relevance_metrics(probs, [r["gold_grade"] for r in gold], [r["query"] for r in gold])
            if split == "audit":
                row.update({f"audit_{k}": metrics[k] for k in ("macro_f1", "roc_auc_relevant")})
            else:
                row.update({k: metrics[k] for k in COLUMNS})
        rows.append(row)
    return rows


def run(config: StudentProtocolConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    specs = student_specs(config)
    missing = sorted({str(s.folder / "labels") for s in specs if s.source != "train-gold"} - _existing(specs))
    if missing:
        raise ContractError(
            f"no labels in {', '.join(missing)}; run `agpo annotate` for each teacher first (`make student-protocol`)"
        )
    students = [train_and_score(config, spec, seed) for spec in specs for seed in config.seeds]
    baselines = baseline_rows(config)
    rows = aggregate(students + baselines)
    split = f"gold {config.evaluate.split} split ({students[0]['training_pairs']:,} training pairs in the first row"
    split += f", seeds {list(config.seeds)})"
    table = markdown_table(rows)
    result: dict[str, Any] = {"evaluated_on": split, "table": rows, "students": students, "baselines": baselines}
    paths: dict[str, Path] = {}
    if config.gold_noise:
        result["sensitivity"] = sensitivity = fit_sensitivity(students)
        table += "\n" + sensitivity_markdown(sensitivity)
        paths["plot"] = plot_sensitivity(students, sensitivity, out / "sensitivity.png")
    paths["json"] = write_json_atomic(out / "comparison.json", result)
    paths["markdown"] = write_atomic(out / "comparison.md", f"Students scored on the {split}.\n\n{table}")
    print(table, end="")
    print_summary(f"{len(rows)} rows ({len(config.seeds)} seeds each) compared on the {split}", paths)
    return paths


def _existing(specs: list[StudentSpec]) -> set[str]:
    return {str(s.folder / "labels") for s in specs if (s.folder / "labels").is_dir()}


def train_and_score(config: StudentProtocolConfig, spec: StudentSpec, seed: int) -> dict[str, Any]:
    """One student: distil from ``spec``'s labels with ``seed``, score it on the audit and test splits, and
    return its table row."""
    folder_name = spec.name if not spec.kind else f"{spec.name}-{spec.kind}"
    student_dir = Path(config.out_dir) / folder_name / f"seed-{seed}"
    student = replace(config.distil.student, seed=seed, kind=spec.kind or config.distil.student.kind)
    distil_config = replace(
        config.distil,
        labels=str(spec.folder / "labels"),
        label_source=spec.source,
        gold_noise=spec.noise,
        zero_shot_floor=False,
        out_dir=str(student_dir),
        student=student,
        training=replace(config.distil.training, seed=seed, teacher_weight=spec.teacher_weight),
    )
    evaluate_config = replace(config.evaluate, baselines=NO_BASELINES, compare_with={})
    trained, scored = distil_and_evaluate(distil_config, evaluate_config)
    audit = evaluate_stage.run(
        replace(
            evaluate_config,
            model=str(trained["model"]),
            pairs=distil_config.pairs,
            split="audit",
            out_dir=str(student_dir / "eval-audit"),
        )
    )
    history = json.loads(trained["summary"].read_text())
    metrics = json.loads(scored["metrics"].read_text())
    audit_metrics = json.loads(audit["metrics"].read_text())
    quality = noisy_gold_quality(history) if spec.source == "gold" else {}
    if spec.source == "teacher":
        quality = label_quality(spec.folder)
    return {
        "labels": spec.name,
        "kind": history["kind"],
        "seed": seed,
        "label_folder": str(spec.folder),
        "training_pairs": history["training_pairs"],
        "teacher_weight": spec.teacher_weight,
        **quality,
        **{k: metrics[k] for k in COLUMNS},
        **{f"audit_{k}": audit_metrics[k] for k in ("macro_f1", "roc_auc_relevant")},
        "best_epoch": history["best_epoch"],
        "epochs_run": sum(record["epoch"] > 0 for record in history["history"]),  # epoch 0: a bi student's start
        "student": str(student_dir),
    }
