"""The supervised warm start's settings (``SFTConfig``), its class-balance modes and default learning rates.

SFT itself is in agpo.sft (its module docstring explains the balance modes); this module needs no torch, so
configs validate without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice, require_int, require_ints, require_positive
from agpo.lr_schedule import SCHEDULES

BALANCE_MODES = ("none", "loss", "sample")
# The peak learning rate when the config leaves it open: a model trained from scratch (the tiny teacher)
# takes a large one; a pretrained model keeps what it knows only with a small one (full fine-tuning), while
# LoRA's zero-initialised adapters need a larger one to move at all.
LEARNING_RATES = {"scratch": 1e-3, "full": 1e-4, "lora": 5e-4}


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-start settings."""

    epochs: int = field(default=4, metadata={"help": "passes over the examples"})
    max_steps: int | None = field(
        default=None, metadata={"help": "optimizer steps at most (the schedule spans them); null: epochs decide"}
    )
    eval_every: int = field(
        default=0,
        metadata={"help": "evaluate on held-out pairs every N steps and keep the best checkpoint; 0: at the end only"},
    )
    patience: int = field(
        default=0, metadata={"help": "stop after N evaluations without improvement (needs eval_every); 0: never"}
    )
    batch_size: int = field(default=16, metadata={"help": "examples per optimizer step"})
    learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "AdamW peak learning rate; null: by regime (LEARNING_RATES): 1e-3 from scratch, 1e-4 full "
            "fine-tuning of a pretrained model, 5e-4 LoRA"
        },
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_steps: int = field(default=10, metadata={"help": "linear warm-up steps"})
    lr_schedule: str = field(default="cosine", metadata={"help": f"one of {list(SCHEDULES)}"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    seed: int = field(default=0, metadata={"help": "shuffling seed"})
    balance: str = field(
        default="sample",
        metadata={
            "help": f"class balance over the examples' classes (the teacher's gold grades), one of "
            f"{list(BALANCE_MODES)}: sample trains on every class equally often (N/K slots per epoch), loss "
            "weighs each example N/(K*count of its class); no effect where examples have no class (math)"
        },
    )

    def __post_init__(self) -> None:
        require_ints(self, ("epochs", "batch_size"), 1)
        require_ints(self, ("eval_every", "patience"), 0)
        if self.max_steps is not None:
            require_int("max_steps", self.max_steps, 1)
        if self.patience and not self.eval_every:
            raise ValueError("patience counts evaluations: it needs eval_every > 0")
        if self.learning_rate is not None:
            require_positive(learning_rate=self.learning_rate)
        require_choice("lr_schedule", self.lr_schedule, SCHEDULES)
        require_choice("balance", self.balance, BALANCE_MODES)
