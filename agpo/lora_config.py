"""The LoRA adapters' settings (``LoRAConfig``); agpo.lora adds and merges them. Needs no torch or peft, so
configs validate without them."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_int, require_positive

LLAMA_LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters; ``rank: 0`` turns them off (full fine-tuning)."""

    rank: int = field(default=0, metadata={"help": "adapter rank; 0: full fine-tuning, no adapters"})
    alpha: float = field(default=16.0, metadata={"help": "scale: the update is (alpha / rank) * B A"})
    dropout: float = field(default=0.0, metadata={"help": "dropout on the adapter input during training"})
    target_modules: tuple[str, ...] = field(
        default=LLAMA_LINEAR_LAYERS,
        metadata={"help": "names of the linear layers that get adapters (Llama / Qwen2 / Gemma 3 names)"},
    )

    def __post_init__(self) -> None:
        require_int("rank", self.rank, 0)
        require_positive(alpha=self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer")

    @property
    def enabled(self) -> bool:
        return self.rank > 0
