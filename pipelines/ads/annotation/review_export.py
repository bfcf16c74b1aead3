"""Stage ``agpo review export`` (also spelled ``agpo review-export``): the review queue as Label Studio tasks.

Reads annotation's review queue (``review/shard-*.parquet``: the pairs the teacher was unsure of or
abstained on) and writes into ``out_dir``:

- ``tasks.json``: one Label Studio task per pair, most doubtful first (abstained, then by confidence).
  By default (``show_teacher: false``) a reviewer sees the pair only: ``data`` holds ``pair_id``, ``query``,
  ``ad_title`` and ``teacher_shown: false``, and nothing of the teacher, so its grade cannot anchor the
  person (and the teacher's agreement with people, which ``agpo review import`` reports, is not inflated by
  it). With ``show_teacher: true`` ``data`` also holds the teacher's answers as one text
  (``teacher_answers``, shown as context), its grade, confidence, run id and prompt version, and
  ``predictions`` pre-selects its grade (``model_version`` = teacher_run_id, ``score`` = confidence; none for
  an abstained pair): faster to review, but the import leaves such tasks out of the agreement;
- ``labeling_config.xml``: the project's labeling interface: query and ad as text (and the teacher's answers
  when shown), and one required choice among the grades (``GRADE_CHOICES``: "0 irrelevant" ... "3 exact");
- ``review_export.json``: how many tasks, abstained, whether the teacher was shown, and the files.

A team creates a project with the labeling config, imports ``tasks.json`` (UI or REST API), grades, exports
the project as JSON and reads it back with ``agpo review import`` (pipelines.ads.annotation.review_import).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import quoteattr

import pyarrow.parquet as pq

from pipelines.ads.intake.contracts import ContractError
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.runs import run_path_field

# ESCI's grades, in the words of its guidelines (exact, substitute, complement, irrelevant)
GRADE_NAMES = {0: "irrelevant", 1: "complement", 2: "substitute", 3: "exact"}
GRADE_CHOICES = {grade: f"{grade} {name}" for grade, name in GRADE_NAMES.items()}
GRADE_HINTS = {
    0: "the ad does not serve the query",
    1: "the ad goes with what the query asks for (an accessory, a part)",
    2: "the ad can stand in for what the query asks for, some attributes differ",
    3: "the ad is what the query asks for, every named attribute matches",
}
FROM_NAME, TO_NAME = "grade", "ad"  # the choice control and the text it labels, in config and results


def labeling_config(show_teacher: bool = False) -> str:
    """Label Studio's labeling config: the pair (and the teacher's answers as context when shown), one grade
    choice."""
    choices = "\n".join(
        f"    <Choice value={quoteattr(GRADE_CHOICES[g])} hint={quoteattr(GRADE_HINTS[g])}/>" for g in GRADE_NAMES
    )
    teacher = (
        '  <Header value="Teacher answers (context; its grade is pre-selected)"/>\n'
        '  <Text name="teacher_answers" value="$teacher_answers"/>\n'
        if show_teacher
        else ""
    )
    return f"""<View>
  <Header value="Query"/>
  <Text name="query" value="$query"/>
  <Header value="Ad"/>
  <Text name="{TO_NAME}" value="$ad_title"/>
{teacher}  <Choices name="{FROM_NAME}" toName="{TO_NAME}" choice="single-radio" required="true" showInline="false">
{choices}
  </Choices>
</View>
"""


def grade_result(grade: int) -> list[dict[str, Any]]:
    """A Label Studio ``result`` that selects ``grade`` in the grade choice."""
    value = {"choices": [GRADE_CHOICES[grade]]}
    return [{"from_name": FROM_NAME, "to_name": TO_NAME, "type": "choices", "value": value}]


def task(row: dict[str, Any], show_teacher: bool = False) -> dict[str, Any]:
    """One review-queue row (REVIEW_SCHEMA) as a Label Studio task: the pair only, or with the teacher's
    answers and its grade pre-selected (``show_teacher``)."""
    data = {
        "pair_id": row["pair_id"],
        "query": row["query"],
        "ad_title": row["ad_title"],
        "teacher_shown": show_teacher,
    }
    if not show_teacher:
        return {"data": data, "predictions": []}
    answers = row["teacher_answers"] or []
    data |= {
        "teacher_answers": "\n".join(f"{i + 1}. {a}" for i, a in enumerate(answers)) or "(no answer)",
        "teacher_grade": row["grade"],
        "teacher_confidence": round(float(row["confidence"]), 6),
        "teacher_run_id": row["teacher_run_id"],
        "prompt_version": row["prompt_version"],
    }
    predictions = []
    if row["grade"] is not None:
        predictions.append(
            {
                "model_version": row["teacher_run_id"],
                "score": round(float(row["confidence"]), 6),
                "result": grade_result(row["grade"]),
            }
        )
    return {"data": data, "predictions": predictions}


@dataclass(frozen=True)
class ReviewExportConfig:
    """The review queue -> Label Studio tasks and labeling config."""

    review: str = run_path_field("annotate/review", "review queue folder (agpo annotate)")
    limit: int | None = field(default=None, metadata={"help": "export the most doubtful N pairs only (null: all)"})
    show_teacher: bool = field(
        default=False,
        metadata={
            "help": "show reviewers the teacher's answers and pre-select its grade (faster, but it anchors them: "
            "agpo review import leaves these tasks out of the teacher's agreement); false: the pair only"
        },
    )
    out_dir: str = run_path_field("review", "output folder: tasks.json, labeling_config.xml")

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 or null, got {self.limit}")


def read_review_queue(folder: str | Path) -> list[dict[str, Any]]:
    """Every row of the review queue's shard files, most doubtful first (abstained, then low confidence)."""
    files = sorted(Path(folder).glob("shard-*.parquet"))
    if not files:
        raise ContractError(f"no review/shard-*.parquet in {folder}; run `agpo annotate` first or set review=")
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    return sorted(rows, key=lambda r: (not r["abstained"], r["confidence"], r["pair_id"]))


def run(config: ReviewExportConfig) -> dict[str, Path]:
    rows = read_review_queue(config.review)[: config.limit]
    tasks = [task(r, config.show_teacher) for r in rows]
    out = Path(config.out_dir)
    paths = {
        "tasks": write_atomic(out / "tasks.json", json.dumps(tasks, ensure_ascii=False, indent=1) + "\n"),
        "labeling_config": write_atomic(out / "labeling_config.xml", labeling_config(config.show_teacher)),
    }
    summary = {
        "tasks": len(tasks),
        "abstained": sum(r["abstained"] for r in rows),
        "teacher_shown": config.show_teacher,
        "review": config.review,
    }
    paths["summary"] = write_json_atomic(out / "review_export.json", summary)
    shown = "the teacher's grade pre-selected" if config.show_teacher else "the pair only, the teacher hidden"
    print_summary(
        f"review export: {len(tasks):,} Label Studio tasks ({summary['abstained']:,} abstained; {shown}); create a "
        "project with labeling_config.xml, import tasks.json, grade, export JSON, then `agpo review import`",
        paths,
    )
    return paths
