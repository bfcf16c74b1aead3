"""The optimizer shared by SFT and RL: AdamW with the learning-rate schedule of agpo.lr_schedule."""

from __future__ import annotations

import torch

from agpo.lr_schedule import lr_multiplier


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
