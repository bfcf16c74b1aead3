"""Config fields every stage that generates text shares: the rollout engine, its options and DeepSpeed.

One definition each, so ``--help`` reads the same in every stage and a new engine is named once. A config
with these fields checks them with ``agpo.engine_options.check_engine_options(engine, engine_options)``.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from agpo.engine_options import ENGINES


def engine_field() -> Any:
    return field(default="hf", metadata={"help": f"rollout engine, one of {list(ENGINES)}"})


def engine_options_field() -> Any:
    return field(
        default_factory=dict,
        metadata={
            "help": "engine settings: hf {max_batch_rows}; vllm {gpu_memory_utilization, max_model_len, ...}; "
            "vllm refuses changes to trust_remote_code, load_format and its other pinned settings"
        },
    )


def deepspeed_field() -> Any:
    return field(
        default=None, metadata={"help": "DeepSpeed JSON config (configs/deepspeed/); launch with torchrun; null: off"}
    )
