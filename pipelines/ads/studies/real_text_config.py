"""The config of ``agpo study real-text`` (``RealTextConfig``: the real export to carve, the gold sizes, the
query samples, the student kinds and their recipe), which pipelines.ads.studies.real_text runs. It imports no torch, so
``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from student.model_config import KINDS, StudentConfig
from student.training_config import DistilTrainingConfig

HOME_DEPOT = "../shared/data/homedepot/hd_dev.csv"


def _recipe() -> DistilConfig:
    """What every student of the study gets: MiniLM, one epoch (the linear schedule warms up and decays within
    it), so the default sizes, samples and kinds fit in 45 minutes on 2 cores."""
    return DistilConfig(
        student=StudentConfig(backbone="all-minilm-l6-v2"),
        training=DistilTrainingConfig(epochs=1, min_epochs=1),
        export_onnx=False,
    )


@dataclass(frozen=True)
class RealTextConfig:
    """Team-sized exports of a real query-product file, every student kind and the baselines on each."""

    source: str = field(
        default=HOME_DEPOT,
        metadata={
            "help": "a Home Depot style CSV (latin-1; id, product_title, search_term, relevance 1-3): the real "
            "pairs the exports are carved from (read in place, never copied into the repository)"
        },
    )
    sizes: tuple[int, ...] = field(
        default=(500, 2000), metadata={"help": "gold train pairs per export (whole queries), e.g. [500, 2000, 8000]"}
    )
    samples: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"help": "query samples (seeds) per size; the table shows mean ± sd over them"}
    )
    test_pairs: int = field(default=1600, metadata={"help": "gold test pairs of each sample (whole queries)"})
    audit_pairs: int = field(default=400, metadata={"help": "gold audit pairs of each sample (whole queries)"})
    kinds: tuple[str, ...] = field(default=KINDS, metadata={"help": f"student kinds trained, from {list(KINDS)}"})
    out_dir: str = field(default="work/studies/real-text", metadata={"help": "output folder"})
    distil: DistilConfig = field(
        default_factory=_recipe, metadata={"help": "the recipe of every student (label_source is train-gold)"}
    )
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig, metadata={"help": "how the models are scored"})

    def __post_init__(self) -> None:
        if not self.sizes or not self.samples or min(self.sizes) < 1:
            raise ValueError(f"need sizes >= 1 and at least one sample, got {list(self.sizes)}, {list(self.samples)}")
        if self.test_pairs < 1 or self.audit_pairs < 1:
            raise ValueError(f"test_pairs and audit_pairs must be >= 1, got {self.test_pairs}, {self.audit_pairs}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"kinds must be a non-empty list from {list(KINDS)}, got {list(self.kinds)}")
