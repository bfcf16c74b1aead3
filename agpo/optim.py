"""Optimizer and learning-rate schedule shared by SFT and RL: AdamW with warm-up then constant or cosine."""

from __future__ import annotations

import math

import torch

from agpo.checks import require_choice

SCHEDULES = ("constant", "cosine")


def lr_multiplier(step: int, total_steps: int, warmup_steps: int, schedule: str) -> float:
    """Linear warm-up over ``warmup_steps``, then 1 (constant) or cosine decay to 0 at ``total_steps``."""
    require_choice("lr schedule", schedule, SCHEDULES)
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def build_optimizer(
    model: torch.nn.Module,
    *,
    learning_rate: float,
    weight_decay: float,
    total_steps: int,
    warmup_steps: int = 0,
    schedule: str = "constant",
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters (no decay on biases and norms) and its LR schedule.

    The update runs as multi-tensor (foreach) kernels, one per operation over all parameters, rather than a
    Python loop over them (torch's default off CUDA): the same arithmetic, a quarter less optimizer time on
    the benchmarks' tiny model on CPU."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.dim() < 2 or "norm" in name else decay).append(param)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate,
        foreach=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, total_steps, warmup_steps, schedule)
    )
    return optimizer, scheduler
