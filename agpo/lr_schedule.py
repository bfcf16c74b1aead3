"""The learning-rate schedules shared by SFT and RL: their names and the multiplier of the peak rate per step.

Plain Python (no torch), so that the configs naming a schedule validate without loading torch.
"""

from __future__ import annotations

import math

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
