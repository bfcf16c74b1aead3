"""Stage ``agpo compare-students``: the downstream result of the paper, as one table.

The same student (same backbone, seed and distillation settings) is trained on each label set: the hidden
gold grades of the labeled pairs (the reference) and the labels of each teacher (for the embedded setup:
the SFT-only, GRPO and AGPO teachers; ``make student-protocol`` produces them), and every student is
scored on the same gold test split. Per label set the table shows how good the labels were (their accuracy
and macro-F1 against the hidden gold, from the annotation quality report) and how good the student became
(accuracy, macro-F1, ROC-AUC and PR-AUC of "relevant", NDCG@10, ECE), as mean ± sample standard deviation
over ``seeds`` (each seed sets the student's initial weights and its shuffling).

``gold_noise: [0.1, 0.2, 0.3]`` adds controls: the gold grades with that share replaced by another grade
(``gold-noise-10`` ...; label accuracy exactly 1 - p). pipelines.ads.label_sensitivity fits student macro-F1
against label accuracy over the gold and control students and places each teacher's students against that
line (``sensitivity.png``, and a second table in ``comparison.md``).

Writes ``comparison.json`` (every student) and ``comparison.md`` (the table) into ``out_dir``, next to
one folder per student (``<labels>/seed-<s>``: ``distil`` + ``evaluate`` outputs). Every student
checkpoints, so a rerun resumes or is a no-op.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.ads.contracts import ContractError
from pipelines.ads.distil import DistilConfig
from pipelines.ads.evaluate import EvaluateConfig, distil_and_evaluate
from pipelines.ads.label_sensitivity import fit_sensitivity, plot_sensitivity, sensitivity_markdown
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.steps import check_path_name

GOLD = "gold"
COLUMNS = ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece")


@dataclass(frozen=True)
class StudentProtocolConfig:
    """Label sets to compare and the one student recipe they all get."""

    label_sets: dict[str, str] = field(
        default_factory=lambda: {
            "sft": "work/protocol/annotate-sft",
            "grpo": "work/protocol/annotate-grpo",
            "agpo": "work/annotate",
        },
        metadata={"help": "name -> annotation run folder (holding labels/ and quality_report.json)"},
    )
    include_gold: bool = field(default=True, metadata={"help": "also train the gold-label reference student"})
    gold_noise: tuple[float, ...] = field(
        default=(),
        metadata={"help": "controls: gold labels with this share replaced by another grade, e.g. [0.1, 0.2, 0.3]"},
    )
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "student seeds; the table shows mean ± sd"})
    out_dir: str = field(default="work/protocol/students", metadata={"help": "output folder"})
    distil: DistilConfig = field(default_factory=DistilConfig, metadata={"help": "the recipe every student gets"})
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig, metadata={"help": "how students are scored"})

    def __post_init__(self) -> None:
        if GOLD in self.label_sets:
            raise ValueError(f"label_sets may not use the name {GOLD!r}: it is the gold-label reference")
        for name in self.label_sets:  # each names the folder of its students
            check_path_name("label_sets name", name)
        if not self.seeds:
            raise ValueError("seeds must name at least one seed")
        if not all(0 < p < 1 for p in self.gold_noise):
            raise ValueError(f"every gold_noise share must be in (0, 1), got {list(self.gold_noise)}")
        if not self.label_sets and not self.include_gold:
            raise ValueError("nothing to compare: label_sets is empty and include_gold is false")


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
    """One row per label set: mean and sample standard deviation of each metric over its seeds."""
    rows = []
    for name in dict.fromkeys(s["labels"] for s in students):
        runs = [s for s in students if s["labels"] == name]
        row = {"labels": name, "seeds": len(runs), **{k: runs[0].get(k) for k in ("label_accuracy", "label_macro_f1")}}
        for key in (*COLUMNS, "best_epoch"):
            values = np.array([r[key] for r in runs], dtype=float)
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    header = [
        "labels",
        "label acc",
        "label F1",
        "student acc",
        "macro-F1",
        "ROC-AUC rel",
        "PR-AUC rel",
        "NDCG@10",
        "ECE",
        "best epoch",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for row in rows:
        cells = [row["labels"]]
        cells += ["1.000" if row["labels"] == GOLD else _fmt(row.get(k)) for k in ("label_accuracy", "label_macro_f1")]
        cells += [_fmt(row[k], row[f"{k}_sd"], row["seeds"]) for k in COLUMNS]
        cells.append(f"{row['best_epoch']:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, sd: float = 0.0, seeds: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f} ± {sd:.3f}" if seeds > 1 else f"{value:.3f}"


def run(config: StudentProtocolConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    runs = [(name, Path(folder), "teacher", 0.0) for name, folder in config.label_sets.items()]
    if config.include_gold or config.gold_noise:
        # the gold reference learns from the same pairs as the teachers' students: those of the first label set
        folder = runs[0][1] if runs else Path(config.distil.labels).parent
        gold = [(GOLD, folder, "gold", 0.0)] if config.include_gold else []
        runs = gold + [(f"{GOLD}-noise-{round(p * 100):02d}", folder, "gold", p) for p in config.gold_noise] + runs
    missing = [str(folder / "labels") for _, folder, _, _ in runs if not (folder / "labels").is_dir()]
    if missing:
        raise ContractError(
            f"no labels in {', '.join(missing)}; run `agpo annotate` for each teacher first (`make student-protocol`)"
        )
    students = []
    for name, folder, source, noise in runs:
        for seed in config.seeds:
            students.append(train_and_score(config, name, folder, source, seed, noise))
    rows = aggregate(students)
    split = f"gold {config.evaluate.split} split ({students[0]['training_pairs']:,} training pairs per student"
    split += f", seeds {list(config.seeds)})"
    table = markdown_table(rows)
    result: dict[str, Any] = {"evaluated_on": split, "table": rows, "students": students}
    paths: dict[str, Path] = {}
    if config.gold_noise:
        result["sensitivity"] = sensitivity = fit_sensitivity(students)
        table += "\n" + sensitivity_markdown(sensitivity)
        paths["plot"] = plot_sensitivity(students, sensitivity, out / "sensitivity.png")
    paths["json"] = write_json_atomic(out / "comparison.json", result)
    paths["markdown"] = write_atomic(out / "comparison.md", f"Students scored on the {split}.\n\n{table}")
    print(table, end="")
    print_summary(f"{len(rows)} label sets x {len(config.seeds)} seeds compared on the {split}", paths)
    return paths


def train_and_score(
    config: StudentProtocolConfig, name: str, folder: Path, source: str, seed: int, noise: float = 0.0
) -> dict[str, Any]:
    """One student: distil from ``folder``'s labels (gold ones with ``noise``) with ``seed``, score it, and
    return its table row."""
    student_dir = Path(config.out_dir) / name / f"seed-{seed}"
    distil_config = replace(
        config.distil,
        labels=str(folder / "labels"),
        label_source=source,
        gold_noise=noise,
        out_dir=str(student_dir),
        student=replace(config.distil.student, seed=seed),
        distill=replace(config.distil.distill, seed=seed),
    )
    trained, scored = distil_and_evaluate(distil_config, config.evaluate)
    history = json.loads(trained["summary"].read_text())
    metrics = json.loads(scored["metrics"].read_text())
    return {
        "labels": name,
        "seed": seed,
        "label_folder": str(folder),
        "training_pairs": history["training_pairs"],
        **(noisy_gold_quality(history) if source == "gold" else label_quality(folder)),
        **{k: metrics[k] for k in COLUMNS},
        **({"lexical_macro_f1": metrics["lexical_baseline"]["macro_f1"]} if "lexical_baseline" in metrics else {}),
        "best_epoch": history["best_epoch"],
        "epochs_run": len(history["history"]),
        "student": str(student_dir),
    }
