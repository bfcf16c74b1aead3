"""Stage ``agpo review import`` (also spelled ``agpo review-import``): human grades from Label Studio as gold.

Reads a Label Studio project export in its ``JSON`` format (a list of tasks, each with ``data`` as
``agpo review export`` wrote it and ``annotations``) and the review queue it came from. Per task, the
annotations that were not cancelled give their grade choice (``GRADE_CHOICES``); several annotators are
resolved by majority, a tie to the lower grade (agpo.sampling_metrics.majority, the teacher's rule). A task
without such an annotation is counted as unreviewed and left out. Writes into ``out_dir``:

- ``gold_labels.parquet`` (``GOLD_LABELS_SCHEMA``): pair_id, the human ``grade``, how many annotations
  gave it, the annotators, and the teacher's grade and confidence from the review queue. ``agpo distil
  --set review_gold=<it>`` replaces each reviewed pair's teacher label with it (pipelines.ads.distillation.distil);
- ``review_import.json``: counts and ``human_agreement``, the teacher scored against the human grades
  (accuracy, Cohen's kappa, confusion; pipelines.ads.annotation.report.human_agreement), which is also
  added to the annotation run's ``quality_report.json`` (beside the review folder) when there is one. It
  counts only the tasks exported without the teacher (``data.teacher_shown`` false: ``agpo review export``'s
  default); a reviewer who saw the teacher's grade pre-selected tends to keep it, so those tasks would
  inflate the agreement. ``agreement_tasks`` says how many tasks it counts and how many it left out and why
  (an export without ``teacher_shown``, from before the option, pre-selected the grade: left out).

A task whose pair is not in the review queue, or a choice that is not a grade, stops the import with the
task named: the export and the queue must come from the same ``agpo review export``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from agpo.sampling_metrics import majority
from pipelines.ads.annotation.report import human_agreement
from pipelines.ads.annotation.review_export import FROM_NAME, GRADE_CHOICES, read_review_queue
from pipelines.ads.annotation.review_import_config import ReviewImportConfig
from pipelines.ads.intake.contracts import ContractError, write_table
from pipelines.io import print_summary, require_file, write_json_atomic

GOLD_LABELS_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("grade", pa.int8(), nullable=False),
        pa.field("annotations", pa.int16(), nullable=False),
        pa.field("annotators", pa.list_(pa.string()), nullable=False),
        pa.field("teacher_grade", pa.int8()),
        pa.field("teacher_confidence", pa.float32(), nullable=False),
        pa.field("teacher_shown", pa.bool_(), nullable=False),  # the reviewer saw the teacher's grade pre-selected
    ]
)
CHOICE_GRADES = {choice: grade for grade, choice in GRADE_CHOICES.items()}


def annotation_grade(annotation: dict[str, Any], task_id: Any) -> int | None:
    """The grade one annotation chose (None: it chose none)."""
    for result in annotation.get("result") or []:
        if result.get("from_name") != FROM_NAME or result.get("type") != "choices":
            continue
        choices = result.get("value", {}).get("choices") or []
        unknown = [c for c in choices if c not in CHOICE_GRADES]
        if unknown or len(choices) != 1:
            raise ContractError(
                f"task {task_id}: grade choice {choices} is not one of {list(CHOICE_GRADES)}; the project must use "
                "the labeling_config.xml of `agpo review export`"
            )
        return CHOICE_GRADES[choices[0]]
    return None


def human_grades(tasks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """(one row per reviewed task: pair_id, grade, annotations, annotators; tasks left unreviewed)."""
    rows, unreviewed = [], 0
    for task in tasks:
        task_id = task.get("id")
        if "data" not in task or "annotations" not in task:
            raise ContractError(
                f"task {task_id}: no data/annotations; export the project in Label Studio's JSON format "
                "(not JSON_MIN or CSV)"
            )
        pair_id = task["data"].get("pair_id")
        if pair_id is None:
            raise ContractError(f"task {task_id} has no data.pair_id: it was not written by `agpo review export`")
        graded = [
            (grade, str(a.get("completed_by")))
            for a in task["annotations"]
            if not a.get("was_cancelled") and (grade := annotation_grade(a, task_id)) is not None
        ]
        if not graded:
            unreviewed += 1
            continue
        grade = majority([g for g, _ in graded], tie="lowest")
        rows.append(
            {
                "pair_id": pair_id,
                "grade": grade,
                "annotations": len(graded),
                "annotators": [w for _, w in graded],
                "teacher_shown": bool(task["data"].get("teacher_shown", True)),  # older exports pre-selected it
            }
        )
    return rows, unreviewed


def read_export(path: str | Path) -> list[dict[str, Any]]:
    fix = "export the project as JSON and set export="
    path = require_file(path, "Label Studio export", fix, FileNotFoundError)
    tasks = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(tasks, list):
        raise ContractError(f"{path} is not a list of tasks; export the project in Label Studio's JSON format")
    return tasks


def run(config: ReviewImportConfig) -> dict[str, Path]:
    rows, unreviewed = human_grades(read_export(config.export))
    queue = {r["pair_id"]: r for r in read_review_queue(config.review)}
    seen: set[str] = set()
    for row in rows:
        teacher = queue.get(row["pair_id"])
        if teacher is None:
            raise ContractError(f"pair {row['pair_id']!r} is not in the review queue {config.review}")
        if row["pair_id"] in seen:
            raise ContractError(f"pair {row['pair_id']!r} is in two tasks of {config.export}; import each once")
        if not 0 <= row["grade"] < config.num_grades:
            raise ContractError(f"pair {row['pair_id']!r}: grade {row['grade']} is outside 0..{config.num_grades - 1}")
        seen.add(row["pair_id"])
        row.update(teacher_grade=teacher["grade"], teacher_confidence=teacher["confidence"])
    out = Path(config.out_dir)
    paths = {
        "gold_labels": write_table(pa.Table.from_pylist(rows, schema=GOLD_LABELS_SCHEMA), out / "gold_labels.parquet")
    }
    blind = [r for r in rows if not r["teacher_shown"]]
    summary: dict[str, Any] = {
        "reviewed": len(rows),
        "unreviewed": unreviewed,
        "export": config.export,
        "agreement_tasks": {
            "counted": len(blind),
            "left_out_teacher_shown": len(rows) - len(blind),
            "why": "only tasks exported without the teacher's grade (review export's show_teacher: false) count: "
            "a pre-selected grade anchors the reviewer",
        },
    }
    if blind:
        summary["human_agreement"] = human_agreement(
            human=[r["grade"] for r in blind], teacher=[r["teacher_grade"] for r in blind], num_grades=config.num_grades
        )
        report = Path(config.review).parent / "quality_report.json"
        if report.is_file():
            amended = {**json.loads(report.read_text(encoding="utf-8")), "human_agreement": summary["human_agreement"]}
            paths["quality_report"] = write_json_atomic(report, amended)
    paths["summary"] = write_json_atomic(out / "review_import.json", summary)
    agreement = summary.get("human_agreement")
    if agreement is None:
        why = f"all {len(rows):,} graded tasks showed the teacher's grade" if rows else "no task was graded"
        figures = f"no teacher agreement: {why}"
    else:
        kappa = agreement["cohen_kappa"]
        figures = (
            f"teacher agreement on {len(blind):,} tasks without its grade shown {agreement['accuracy']:.3f}, Cohen's "
            f"kappa {'n/a' if kappa is None else f'{kappa:.3f}'}"
            + (f" ({len(rows) - len(blind):,} tasks that showed it left out)" if len(blind) < len(rows) else "")
        )
    print_summary(
        f"review import: {len(rows):,} pairs graded by people ({unreviewed:,} tasks unreviewed); {figures}; "
        "distil with --set review_gold=" + str(paths["gold_labels"]),
        paths,
    )
    return paths
