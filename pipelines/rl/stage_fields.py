"""Config fields the RL stages (``agpo train``, ``agpo math-train``) share beyond the rollout ones of
pipelines.rl.engine_fields, and ``check_rl_settings``, the checks an RL stage's config makes on them.

One definition each, so ``--help`` reads the same in both stages; pipelines.rl.stage runs what they set.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from agpo.checks import require_choice, require_int
from agpo.engine_options import ENGINES


def processes_field() -> Any:
    return field(
        default=1, metadata={"help": "data-parallel ranks on this machine: > 1 launches torchrun (needs deepspeed)"}
    )


def resume_field() -> Any:
    return field(default=True, metadata={"help": "continue from the newest checkpoint in out_dir if any"})


def check_rl_settings(config: Any) -> None:
    """The checks every RL stage config makes on its shared fields."""
    require_choice("engine", config.engine, ENGINES)
    require_int("processes", config.processes, 1)
    if config.processes > 1 and not config.deepspeed:
        raise ValueError(
            f"processes={config.processes} trains data-parallel through DeepSpeed: set deepspeed too "
            "(e.g. deepspeed=configs/deepspeed/zero1.json)"
        )
