"""The config of ``agpo math-eval`` (``MathEvalConfig``: the model, the math set, samples, engine), which
pipelines.math.math_eval runs. It imports no torch, so ``--print-config`` and config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.engine_options import check_engine_options
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.math.math_data import MATH_SETS
from pipelines.rl.engine_fields import engine_field, engine_options_field
from pipelines.threads import check_threads, threads_field


@dataclass(frozen=True)
class MathEvalConfig:
    """Which model, which problems, how many samples."""

    model: str = field(default="work/math/model", metadata={"help": "HF causal-LM directory or a packaged name"})
    dataset: str = field(default="gsm8k", metadata={"help": f"one of {list(MATH_SETS)}"})
    path: str | None = field(default=None, metadata={"help": "local JSONL file; null: the hub (where reachable)"})
    limit: int | None = field(default=None, metadata={"help": "first N problems; null: all"})
    samples: int = field(default=8, metadata={"help": "n: completions sampled per problem"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    max_new_tokens: int = field(default=256, metadata={"help": "longest completion in tokens"})
    batch_problems: int = field(default=16, metadata={"help": "problems per generation call"})
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    seed: int = field(default=0, metadata={"help": "sampling seed"})
    out_dir: str = field(default="work/math-eval", metadata={"help": "output folder"})

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        if self.dataset not in MATH_SETS:
            raise ValueError(f"dataset must be one of {list(MATH_SETS)}, got {self.dataset!r}")
        if self.samples < 1 or self.batch_problems < 1 or self.max_new_tokens < 1:
            raise ValueError("samples, batch_problems and max_new_tokens must be >= 1")
        check_engine_options(self.engine, self.engine_options)
