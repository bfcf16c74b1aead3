"""The distillation's settings (``DistilTrainingConfig``: schedule, loss weights, early stopping); student.training
trains with them (its docstring has the loss). Needs no torch, so configs validate without it."""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEDULES = ("auto", "constant", "linear")
# what early stopping and the zero-shot floor read on the gold audit split (docs/student.md "The metric that decides")
SELECTION_METRICS = ("roc_auc_relevant", "macro_f1")


@dataclass(frozen=True)
class DistilTrainingConfig:
    """How the student learns from the teacher's labels."""

    epochs: int = field(default=30, metadata={"help": "most passes over the labeled pairs"})
    batch_size: int = field(default=32, metadata={"help": "pairs per forward pass"})
    accumulation_steps: int = field(
        default=1,
        metadata={
            "help": "batches per optimizer step (their gradients add up; the loss is normalised over the step's "
            "pairs, so a step of k batches of B pairs is one batch of k x B)"
        },
    )
    max_grad_norm: float | None = field(
        default=None, metadata={"help": "clip the gradient's global norm at this value before each step; null: no clip"}
    )
    length_grouped: bool = field(
        default=False,
        metadata={
            "help": "batch pairs of similar text length (sorted within mega-batches of 50 batches, seeded), so a batch "
            "pads little (faster; docs/benchmarks.md); false: consecutive pairs of the seeded shuffle. Off by "
            "default: where length tells the grade (templated text), grouped batches hold one grade each"
        },
    )
    loader_workers: int = field(
        default=0, metadata={"help": "DataLoader processes that tokenize batches while the model computes; 0: none"}
    )
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "AdamW peak learning rate; null: 5e-4 for the tiny backbone, 1e-4 for a pretrained one"},
    )
    schedule: str = field(
        default="auto",
        metadata={
            "help": f"learning-rate schedule, one of {list(SCHEDULES)}; auto: constant for the tiny backbone, "
            "linear for a pretrained one (warm-up over warmup_ratio of the steps, then linear decay to 0)"
        },
    )
    warmup_ratio: float = field(default=0.1, metadata={"help": "share of all steps spent warming up (linear)"})
    temperature: float = field(default=2.0, metadata={"help": "T of the soft-label term"})
    alpha: float = field(default=0.5, metadata={"help": "weight of the soft-label term (1 - alpha: hard labels)"})
    vote_smoothing: float = field(default=0.1, metadata={"help": "added to every vote count before normalising"})
    confidence_weighting: bool = field(default=True, metadata={"help": "weight each pair by the teacher's confidence"})
    gold_weight: float = field(default=0.0, metadata={"help": "weight of cross-entropy on gold grades where present"})
    teacher_weight: float = field(
        default=1.0,
        metadata={
            "help": "weight of a teacher-labeled pair against a gold one (label rows with source: teacher); "
            "0: the teacher's labels are left out (the gold-only student)"
        },
    )
    # the tiny student can sit on a plateau for several epochs before it learns: early stopping there would
    # keep a student that never learned (measured: a gold-label seed stopped at epoch 12 with accuracy 0.50)
    patience: int = field(default=6, metadata={"help": "epochs without validation gain before stopping"})
    min_epochs: int = field(default=15, metadata={"help": "epochs always run before early stopping may stop"})
    selection_metric: str = field(
        default="roc_auc_relevant",
        metadata={
            "help": f"one of {list(SELECTION_METRICS)}: the gold audit metric that picks the best epoch (a bi or "
            "hybrid student's epoch 0, its untrained encoder, included); roc_auc_relevant ranks pairs as a search "
            "team does, macro-F1 on skewed grades barely separates models on real text"
        },
    )
    relevant_from: int = field(default=2, metadata={"help": "grades >= this count as relevant (ROC-AUC)"})
    seed: int = field(default=0, metadata={"help": "shuffling seed"})

    def __post_init__(self) -> None:
        if self.selection_metric not in SELECTION_METRICS:
            raise ValueError(
                f"selection_metric must be one of {list(SELECTION_METRICS)}, got {self.selection_metric!r}"
            )
        if self.relevant_from < 1:
            raise ValueError(f"relevant_from must be >= 1, got {self.relevant_from}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.schedule!r}")
        if not 0 <= self.warmup_ratio < 1 or (self.learning_rate is not None and not self.learning_rate > 0):
            raise ValueError("warmup_ratio must be in [0, 1) and learning_rate > 0 (or null)")
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1 or self.min_epochs < 0:
            raise ValueError("epochs, batch_size and patience must be >= 1 and min_epochs >= 0")
        if self.accumulation_steps < 1 or self.loader_workers < 0:
            raise ValueError("accumulation_steps must be >= 1 and loader_workers >= 0")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or null, got {self.max_grad_norm!r}")
        if not self.temperature > 0 or not 0 <= self.alpha <= 1 or self.gold_weight < 0 or self.vote_smoothing < 0:
            raise ValueError("temperature must be > 0, alpha in [0, 1], gold_weight and vote_smoothing >= 0")
        if not self.teacher_weight >= 0:
            raise ValueError(f"teacher_weight must be >= 0, got {self.teacher_weight!r}")
