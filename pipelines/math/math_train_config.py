"""The config of ``agpo math-train`` (``MathTrainConfig``: the problems, the starting model and its warm start,
engine, ranks and the RL trainer), which pipelines.math.math_train runs. It imports no torch, so ``--print-config`` and
config errors never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.sft_config import SFTConfig
from agpo.tiny_model_config import TinyModelConfig
from agpo.trainer_config import TrainerConfig
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.math.arithmetic import ArithmeticConfig
from pipelines.math.math_data import MATH_SETS
from pipelines.rl.engine_fields import deepspeed_field, engine_field, engine_options_field
from pipelines.rl.stage_fields import check_rl_settings, processes_field, resume_field
from pipelines.threads import check_threads, threads_field

DATASETS = ("arithmetic", *MATH_SETS)


@dataclass(frozen=True)
class MathTrainConfig:
    """Problems, starting model and trainer of a math RL run."""

    dataset: str = field(default="arithmetic", metadata={"help": f"one of {list(DATASETS)}"})
    path: str | None = field(default=None, metadata={"help": "local JSONL of a math set (not for arithmetic)"})
    arithmetic: ArithmeticConfig = field(default_factory=ArithmeticConfig, metadata={"help": "the synthetic task"})
    eval_problems: int = field(default=100, metadata={"help": "held-out problems (the first N)"})
    eval_samples: int = field(default=4, metadata={"help": "samples per held-out problem: pass@1 and maj@n"})
    base_model: str | None = field(
        default=None, metadata={"help": "HF causal-LM directory or packaged name; null: build a tiny model + SFT"}
    )
    model: TinyModelConfig = field(
        default_factory=lambda: TinyModelConfig(vocab_size=400), metadata={"help": "tiny model (base_model: null)"}
    )
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(epochs=3), metadata={"help": "warm start (base: null)"})
    sft_examples: int = field(default=600, metadata={"help": "training problems imitated by the warm start"})
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    deepspeed: str | None = deepspeed_field()
    processes: int = processes_field()
    resume: bool = resume_field()
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the RL trainer"})
    out_dir: str = field(default="work/math", metadata={"help": "run folder: base/, model/, metrics.jsonl, summary"})

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {list(DATASETS)}, got {self.dataset!r}")
        if self.eval_problems < 1 or self.eval_samples < 1:
            raise ValueError("eval_problems and eval_samples must be >= 1")
        check_rl_settings(self)
