"""The config of ``agpo distil`` (``DistilConfig``: label source, gold splits, the student and its distillation),
which pipelines.ads.distillation.distil runs. It imports no torch, so ``--print-config`` and config errors never load
the stage."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from agpo.checks import require_choice
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.runs import run_path_field
from pipelines.threads import check_threads, threads_field
from student.model_config import StudentConfig
from student.training_config import DistilTrainingConfig

LABEL_SOURCES = ("gold+teacher", "teacher", "train-gold", "gold")
TEACHER_SOURCES = ("gold+teacher", "teacher")  # the sources that read an annotation run's labels


@dataclass(frozen=True)
class DistilConfig:
    """Labels to learn from, gold splits to stop and score on, and the student."""

    labels: str = run_path_field("annotate/labels", "labels Parquet folder (agpo annotate)")
    pairs: str = run_path_field("data/pairs.parquet", "pairs file: text, audit and test gold")
    label_source: str = field(
        default="gold+teacher",
        metadata={
            "help": f"one of {list(LABEL_SOURCES)}: the gold train pairs plus the teacher's labels of the rest, "
            "the teacher's labels alone, the gold train pairs alone, or the labeled pairs' hidden gold"
        },
    )
    gold: str | None = run_path_field(
        "data/unlabeled_gold.parquet", "hidden gold of the labeled pairs (label_source: gold); null: none"
    )
    gold_noise: float = field(
        default=0.0,
        metadata={
            "help": "label_source gold: replace the grade of round(p * pairs) pairs, drawn with gold_noise_seed, by "
            "another grade drawn uniformly (a control of known label accuracy 1 - p); 0: clean gold"
        },
    )
    gold_noise_seed: int = field(default=0, metadata={"help": "seed of gold_noise (fixed across student seeds)"})
    review_gold: str | None = field(
        default=None,
        metadata={
            "help": "human grades from `agpo review import` (gold_labels.parquet): each replaces its pair's teacher "
            "label (one-hot, confidence 1, gold term weighted by training.gold_weight); null: none"
        },
    )
    zero_shot_floor: bool = field(
        default=True,
        metadata={
            "help": "ship the zero-shot encoder (fitted on the gold train pairs) instead of a student whose gold "
            "audit score on training.selection_metric is below it, and say so"
        },
    )
    zero_shot_encoder: str = field(
        default="all-minilm-l6-v2",
        metadata={"help": "the zero-shot floor's sentence encoder (packaged name or folder)"},
    )
    out_dir: str = run_path_field("student", "output folder")
    student: StudentConfig = field(default_factory=StudentConfig, metadata={"help": "the student model"})
    training: DistilTrainingConfig = field(
        default_factory=DistilTrainingConfig, metadata={"help": "how the student trains on its labels"}
    )
    # the previous release's name of ``training`` (one release: pipelines.config.move_renamed_keys)
    renamed_keys: ClassVar[Mapping[str, str]] = MappingProxyType({"distill": "training"})
    export_onnx: bool = field(
        default=True,
        metadata={"help": "also write model/student.onnx (onnxruntime serving) and the Hugging Face model.onnx"},
    )
    serving_backends: bool = field(
        default=False,
        metadata={
            "help": "also write the int8 graphs (onnxruntime's dynamic; OpenVINO's static, calibrated on half the "
            "audit pairs) and model/backends.json: each backend's pairs/s and ROC-AUC change on the other half, and "
            "the one backend=auto serves (evaluation.backend_choice); needs export_onnx"
        },
    )

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        if self.serving_backends and not self.export_onnx:
            raise ValueError("serving_backends measures the exported graphs: set export_onnx: true with it")
        require_choice("label_source", self.label_source, LABEL_SOURCES)
        if not 0 <= self.gold_noise < 1 or (self.gold_noise and self.label_source != "gold"):
            raise ValueError(f"gold_noise must be in [0, 1) and needs label_source: gold, got {self.gold_noise!r}")
        if self.review_gold is not None and self.label_source not in TEACHER_SOURCES:
            raise ValueError(f"review_gold replaces teacher labels: it needs label_source in {list(TEACHER_SOURCES)}")
