"""Supervised warm start: next-token cross-entropy on the completion tokens of (prompt, completion) pairs.

Each example is tokenized as prompt + completion + EOS; the prompt tokens are masked out of the loss, so
the model learns to answer, not to echo queries. Batches are right-padded; examples are shuffled per epoch
with the config's seed, so the same seed gives the same weights.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerBase

from agpo.checks import require_choice, require_ints, require_positive
from agpo.optim import SCHEDULES, build_optimizer

IGNORE = -100


@dataclass(frozen=True)
class SFTConfig:
    """Supervised warm-start settings."""

    epochs: int = field(default=4, metadata={"help": "passes over the examples"})
    batch_size: int = field(default=16, metadata={"help": "examples per optimizer step"})
    learning_rate: float = field(default=1e-3, metadata={"help": "AdamW peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    warmup_steps: int = field(default=10, metadata={"help": "linear warm-up steps"})
    lr_schedule: str = field(default="cosine", metadata={"help": f"one of {list(SCHEDULES)}"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    seed: int = field(default=0, metadata={"help": "shuffling seed"})

    def __post_init__(self) -> None:
        require_ints(self, ("epochs", "batch_size"), 1)
        require_positive(learning_rate=self.learning_rate)
        require_choice("lr_schedule", self.lr_schedule, SCHEDULES)


def tokenize_example(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Input ids and labels (prompt positions masked) for one example."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [IGNORE] * len(prompt_ids) + completion_ids


def supervised_finetune(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, str]],
    config: SFTConfig = SFTConfig(),
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on ``(prompt, completion)`` examples; returns the loss per step."""
    if not examples:
        raise ValueError("SFT needs at least one (prompt, completion) example")
    encoded = [tokenize_example(tokenizer, p, c) for p, c in examples]
    steps_per_epoch = math.ceil(len(encoded) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer, scheduler = build_optimizer(
        model,
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        total_steps=total,
        warmup_steps=config.warmup_steps,
        schedule=config.lr_schedule,
    )
    rng = random.Random(config.seed)
    model.train()
    losses = []
    for _ in range(config.epochs):
        order = list(range(len(encoded)))
        rng.shuffle(order)
        for start in range(0, len(order), config.batch_size):
            batch = [encoded[i] for i in order[start : start + config.batch_size]]
            input_ids, labels, attention = _right_pad(batch, tokenizer.pad_token_id)
            logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=IGNORE
            )
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(len(losses), losses[-1])
    model.eval()
    return losses


def _right_pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention
