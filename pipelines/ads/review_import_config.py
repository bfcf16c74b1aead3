"""The config of ``agpo review-import`` (``ReviewImportConfig``: the Label Studio export, the review queue, the
output folder), which pipelines.ads.review_import runs. It imports no scikit-learn, so ``--print-config`` and config
errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReviewImportConfig:
    """A Label Studio JSON export -> human gold labels and the teacher's agreement with them."""

    export: str = field(
        default="work/review/export.json", metadata={"help": "Label Studio project export, JSON format"}
    )
    review: str = field(
        default="work/annotate/review",
        metadata={"help": "the review queue the tasks came from (teacher grades; its quality report is amended)"},
    )
    num_grades: int = field(default=4, metadata={"help": "grades 0..num_grades-1"})
    out_dir: str = field(default="work/review", metadata={"help": "output folder: gold_labels.parquet"})
