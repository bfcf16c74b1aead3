"""The shape of the tiny Qwen2 teacher and its tokenizer (``TinyModelConfig``); agpo.models builds it. Needs
no torch or transformers, so configs validate without them."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_ints


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny Qwen2 teacher and its tokenizer."""

    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size (merges learned locally)"})
    hidden_size: int = field(default=256, metadata={"help": "model width; head_dim is fixed at 64"})
    num_layers: int = field(default=2, metadata={"help": "decoder layers"})
    intermediate_size: int = field(default=512, metadata={"help": "MLP width"})
    max_positions: int = field(default=256, metadata={"help": "longest prompt + response in tokens"})
    seed: int = field(default=0, metadata={"help": "seed of the random initial weights"})

    def __post_init__(self) -> None:
        require_ints(self, ("vocab_size", "hidden_size", "num_layers", "intermediate_size", "max_positions"), 1)
        if self.hidden_size % 64:
            raise ValueError(f"hidden_size must be a multiple of head_dim 64, got {self.hidden_size}")
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 byte symbols + merges), got {self.vocab_size}")
