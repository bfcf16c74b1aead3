"""The config of ``agpo compare-students`` (``StudentProtocolConfig``: the label sets, controls, kinds, seeds and
the one student recipe they all get), which pipelines.ads.studies.compare_students runs. It imports no torch, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.steps import check_path_name
from student.model_config import KINDS

GOLD = "gold"


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
    train_gold: bool = field(
        default=False, metadata={"help": "also train the gold-only student (the gold train pairs, no teacher)"}
    )
    teacher_weights: tuple[float, ...] = field(
        default=(),
        metadata={
            "help": "also train on the gold train pairs + each label set at these teacher weights, e.g. [0.5, 1]"
        },
    )
    kinds: tuple[str, ...] = field(
        default=(), metadata={"help": f"student kinds to compare, from {list(KINDS)}; empty: the recipe's kind"}
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
        if not self.label_sets and not self.include_gold and not self.train_gold:
            raise ValueError("nothing to compare: label_sets is empty and include_gold and train_gold are false")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown:
            raise ValueError(f"kinds must be among {list(KINDS)}, got {unknown}")
        if not all(w >= 0 for w in self.teacher_weights):
            raise ValueError(f"every teacher weight must be >= 0, got {list(self.teacher_weights)}")
