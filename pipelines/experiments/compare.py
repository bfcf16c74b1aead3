"""Stage ``agpo compare``: the pipeline runs of an MLflow experiment side by side.

One row per pipeline run (newest first): algorithm, whether the teacher was used or skipped (a teacher
below its gate; the MLflow parent run's ``teacher_skipped_reason`` tag says why), teacher audit accuracy,
the labels' agreement with gold, the student's gold test metrics beside the ROC-AUC of the gold-only student
and the baselines (zero-shot encoder, lexical matcher), what the teacher's labels added over the gold-only
student (with its bootstrap interval), which model the champion rule chose and whether it was promoted,
teacher tokens and wall time; then where each run's report page (``report.html``) is logged. Prints the table
(Markdown), writes it with a bar chart of the student metrics per run into ``out_dir``; the MLflow UI shows the
same numbers on the parent runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.io import print_summary, write_atomic
from pipelines.tracking import REPORT_TAG, TrackingConfig, pipeline_runs

COLUMNS = (
    ("algorithm", "algorithm", "{}"),
    ("teacher", "teacher", "{}"),
    ("teacher_audit_accuracy", "teacher audit acc", "{:.3f}"),
    ("label_gold_accuracy", "label acc", "{:.3f}"),
    ("student_accuracy", "student acc", "{:.3f}"),
    ("student_macro_f1", "macro-F1", "{:.3f}"),
    ("student_roc_auc_relevant", "ROC-AUC rel", "{:.3f}"),
    ("student_ndcg_at_10", "NDCG@10", "{:.3f}"),
    ("gold_only_roc_auc_relevant", "gold-only ROC-AUC", "{:.3f}"),
    ("zero_shot_roc_auc_relevant", "zero-shot ROC-AUC", "{:.3f}"),
    ("lexical_roc_auc_relevant", "lexical ROC-AUC", "{:.3f}"),
    ("teacher_added", "teacher added (macro-F1)", "{}"),
    ("champion_candidate", "candidate", "{}"),
    ("promoted", "promoted", "{}"),
    ("teacher_generated_tokens", "tokens", "{:,.0f}"),
    ("minutes", "minutes", "{:.1f}"),
    ("status", "status", "{}"),
)


@dataclass(frozen=True)
class CompareRunsConfig:
    """Which experiment to compare and where the table goes."""

    experiment: str = field(default="ads_relevance_agpo", metadata={"help": "MLflow experiment name"})
    tracking: TrackingConfig = field(default_factory=TrackingConfig, metadata={"help": "the MLflow store"})
    out_dir: str = field(default="work/compare-runs", metadata={"help": "output folder"})


def teacher_added(row: dict[str, Any]) -> str | None:
    """``+0.012 [-0.010, +0.034]``: the run's student minus its gold-only student, macro-F1 (None if absent)."""
    keys = ("teacher_added_macro_f1", "teacher_added_macro_f1_low", "teacher_added_macro_f1_high")
    if any(row.get(k) is None for k in keys):
        return None
    return "{:+.3f} [{:+.3f}, {:+.3f}]".format(*(row[k] for k in keys))


def table(rows: list[dict[str, Any]]) -> str:
    rows = [{**row, "teacher_added": teacher_added(row)} for row in rows]
    lines = ["| run | " + " | ".join(title for _, title, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row in rows:
        cells = [row["run_key"]] + ["n/a" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def report_pages(rows: list[dict[str, Any]]) -> str:
    """Where each run's report page (report.html: its decision, comparison, plots, data and teacher) is logged."""
    lines = ["report pages (MLflow artifacts of each pipeline run):"]
    for row in rows:
        lines.append(
            f"- {row['run_key']}: {row.get(REPORT_TAG) or 'none (a run from before report pages, or unfinished)'}"
        )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        ("teacher_audit_accuracy", "teacher audit acc"),
        ("student_accuracy", "student acc"),
        ("student_macro_f1", "student macro-F1"),
        ("student_roc_auc_relevant", "student ROC-AUC rel"),
    ]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows) + 2), 4))
    width = 0.8 / len(metrics)
    for i, (key, title) in enumerate(metrics):
        ax.bar([r + i * width for r in range(len(rows))], [row.get(key) or 0 for row in rows], width, label=title)
    ax.set_xticks([r + 0.4 - width / 2 for r in range(len(rows))])
    ax.set_xticklabels([f"{row['run_key'].split('/')[-1][:24]}\n{row.get('algorithm')}" for row in rows], fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("score")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("pipeline runs: teacher and student")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(config: CompareRunsConfig) -> dict[str, Path]:
    tracking = TrackingConfig(**{**config.tracking.__dict__, "experiment": config.experiment})
    rows = pipeline_runs(tracking)
    if not rows:
        print(f"no pipeline runs in experiment {config.experiment!r} yet; run `make demo` or the DAG first")
        return {}
    markdown = table(rows) + "\n" + report_pages(rows)
    out = Path(config.out_dir)
    paths = {"table": write_atomic(out / "runs.md", markdown), "plot": plot(rows, out / "runs.png")}
    print(markdown, end="")
    print_summary(f"{len(rows)} pipeline runs in experiment {config.experiment!r}", paths)
    return paths
