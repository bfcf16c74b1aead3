"""The config of ``agpo review-import`` (``ReviewImportConfig``: the Label Studio export, the review queue, the output
folder), which pipelines.ads.annotation.review_import runs. It imports no scikit-learn, so ``--print-config`` and
config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.runs import run_path_field


@dataclass(frozen=True)
class ReviewImportConfig:
    """A Label Studio JSON export -> human gold labels and the teacher's agreement with them."""

    export: str = run_path_field("review/export.json", "Label Studio project export, JSON format")
    review: str = run_path_field(
        "annotate/review", "the review queue the tasks came from (teacher grades; its quality report is amended)"
    )
    num_grades: int = field(default=4, metadata={"help": "grades 0..num_grades-1"})
    out_dir: str = run_path_field("review", "output folder: gold_labels.parquet")
