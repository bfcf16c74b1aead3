"""The config of ``agpo teacher`` (``TeacherConfig``: pairs, base model, prompt, the tiny model's shape, SFT and
LoRA), which pipelines.ads.teacher.warm_start runs. It imports no torch, so ``--print-config`` and config errors
never load the stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_int
from agpo.lora_config import LoRAConfig
from agpo.sft_config import SFTConfig
from agpo.tiny_model_config import TinyModelConfig
from pipelines.ads.teacher.answer_format import AnswerFormat
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.runs import run_path_field
from pipelines.threads import check_threads, threads_field


@dataclass(frozen=True)
class TeacherConfig:
    """Inputs, outputs, base model and SFT settings of the base teacher."""

    pairs: str = run_path_field("data/pairs.parquet", "pairs Parquet (from `agpo data`)")
    out_dir: str = run_path_field("teacher/sft", "model directory to write")
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "pretrained causal LM to fine-tune: a local HF directory or a packaged name "
            "(smollm2-135m-instruct, gemma-3-270m); null: build the tiny teacher here"
        },
    )
    prompt_version: str | None = field(
        default=None,
        metadata={"help": "prompt template; null: relevance-instruct-v1 under a chat template, else relevance-v1"},
    )
    chat_template: bool | None = field(
        default=None, metadata={"help": "prompt through the tokenizer's chat template; null: when it has one"}
    )
    answer_format: AnswerFormat = field(
        default="reason", metadata={"help": "reason: a short reason then <answer>k</answer>; answer: the tag alone"}
    )
    sft_examples: int | None = field(
        default=None,
        metadata={"help": "pairs of the SFT part used (the first N); null: all (sft.max_steps bounds the cost)"},
    )
    rl_share: float = field(
        default=0.0,
        metadata={
            "help": "share of the gold train queries held out of SFT for the teacher's RL (the pipeline trains RL "
            "on them), so RL sees pairs SFT has not fitted; 0: SFT and RL both train on every pair"
        },
    )
    audit_examples: int = field(
        default=300, metadata={"help": "audit pairs graded before, during (sft.eval_every) and after SFT"}
    )
    audit_constrained: bool = field(
        default=True, metadata={"help": "grade the audit split within the answer grammar (every answer parses)"}
    )
    max_new_tokens: int = field(default=24, metadata={"help": "longest graded answer in tokens"})
    model: TinyModelConfig = field(
        default_factory=TinyModelConfig, metadata={"help": "tiny model shape (base_model: null)"}
    )
    trainable_layers: int = field(
        default=0,
        metadata={
            "help": "SFT trains only the top N decoder layers (with lora: adapters on those layers only); the rest "
            "stays frozen, which makes a step several times cheaper on a CPU; 0: all"
        },
    )
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "SFT settings"})
    lora: LoRAConfig = field(default_factory=LoRAConfig, metadata={"help": "LoRA adapters (base_model only)"})

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        if self.lora.enabled and not self.base_model:
            raise ValueError("lora needs a base_model: the tiny teacher is trained from scratch, all of it")
        require_int("trainable_layers", self.trainable_layers, 0)
        if self.trainable_layers and not self.base_model:
            raise ValueError("trainable_layers needs a base_model: the tiny teacher is trained from scratch, all of it")
