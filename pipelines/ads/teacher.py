"""Stage ``agpo teacher``: the base teacher, warmed up with SFT on gold pairs.

The base is either

- a pretrained causal LM (``base_model``: a local HF directory or a packaged name, ``smollm2-135m-instruct``
  or ``gemma-3-270m``): loaded as it is; instruction-tuned models are prompted through their chat template,
  base models (Gemma 3 270M) with the plain prompt after their BOS token (:mod:`pipelines.ads.prompts`), or
- the tiny teacher built here (``base_model: null``): a byte-level BPE tokenizer trained on the pairs' text
  (train, audit and unlabeled splits: no labels are read from unlabeled rows, only text; the test split
  stays unseen) and a randomly initialised Qwen2 decoder (head_dim 64).

Then:

1. grade the audit split greedily (within the answer grammar by default, so every answer parses);
2. SFT on ``sft_examples`` train pairs: prompt -> the target of ``answer_format`` (``reason``: the pair's
   rationale when it has one, then ``<answer>k</answer>``; ``answer``: the tag alone), the whole model or,
   with ``lora.rank > 0``, low-rank adapters that are merged into the weights afterwards; with
   ``trainable_layers: N`` only the top N decoder layers (or their adapters) train;
3. grade the audit split again, save the model directory (safetensors, plus ``teacher_prompt.json`` so later
   stages prompt it the same way) and a report with both accuracies, per-grade recall and the predicted
   grade distribution.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from agpo.checks import require_int
from agpo.lora import LoRAConfig, add_adapters, merge_adapters, trainable_parameters
from agpo.models import (
    TinyModelConfig,
    build_tiny_qwen2,
    count_parameters,
    load_model,
    save_model,
    train_bpe_tokenizer,
    train_top_layers,
)
from agpo.pretrained import resolve_base_model
from agpo.rewards import ESCI_GRADES
from agpo.rollout import HFRolloutEngine
from agpo.sft import LEARNING_RATES, SFTConfig, supervised_finetune
from pipelines.ads.contracts import labeled_splits, read_pairs
from pipelines.ads.prompts import AnswerFormat, TeacherPrompt, teacher_prompt
from pipelines.ads.teacher_eval import grade_breakdown, grade_pairs, relevance_accuracy
from pipelines.io import print_summary, write_json_atomic


@dataclass(frozen=True)
class TeacherConfig:
    """Inputs, outputs, base model and SFT settings of the base teacher."""

    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs Parquet (from `agpo data`)"})
    out_dir: str = field(default="work/teacher/sft", metadata={"help": "model directory to write"})
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
    sft_examples: int = field(default=2000, metadata={"help": "train pairs used for SFT (the first N)"})
    audit_examples: int = field(default=300, metadata={"help": "audit pairs graded before and after SFT"})
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

    def __post_init__(self) -> None:
        if self.lora.enabled and not self.base_model:
            raise ValueError("lora needs a base_model: the tiny teacher is trained from scratch, all of it")
        require_int("trainable_layers", self.trainable_layers, 0)
        if self.trainable_layers and not self.base_model:
            raise ValueError("trainable_layers needs a base_model: the tiny teacher is trained from scratch, all of it")


def run(config: TeacherConfig) -> dict[str, Path]:
    pairs = read_pairs(config.pairs).to_pylist()
    train, audit = labeled_splits(pairs, config.pairs, config.sft_examples, config.audit_examples)
    started = time.perf_counter()
    if config.base_model:
        model_dir = resolve_base_model(config.base_model)
        model, tokenizer = load_model(model_dir)
        prompt = teacher_prompt(model_dir, tokenizer, config.prompt_version, config.answer_format, config.chat_template)
    else:
        prompt = teacher_prompt(None, None, config.prompt_version, config.answer_format, config.chat_template)
        model, tokenizer = _build_tiny(config, prompt, pairs, train)

    audit_prompts = [prompt.render_pair(r) for r in audit]
    audit_gold = [r["gold_grade"] for r in audit]
    constraint = prompt.grammar(ESCI_GRADES) if config.audit_constrained else None

    def grade_audit() -> dict[str, float]:
        engine = HFRolloutEngine(model, tokenizer)
        predicted = grade_pairs(engine, tokenizer, audit_prompts, config.max_new_tokens, constraint=constraint)[0]
        return relevance_accuracy(predicted, audit_gold)

    before = grade_audit()
    examples = [(prompt.render_pair(r), prompt.target(r["gold_grade"], r.get("rationale"))) for r in train]
    if config.lora.enabled:
        trained = add_adapters(model, config.lora, top_layers=config.trainable_layers)
    else:
        trained = model
        if config.trainable_layers:
            train_top_layers(model, config.trainable_layers)
    regime = ("lora" if config.lora.enabled else "full") if config.base_model else "scratch"
    trainable = trainable_parameters(trained)
    steps = -(-len(examples) // config.sft.batch_size) * config.sft.epochs
    sft_started = time.perf_counter()
    with tqdm(total=steps, desc="SFT warm start", unit="step", mininterval=1.0) as bar:
        losses = supervised_finetune(
            trained,
            tokenizer,
            examples,
            config.sft,
            on_step=lambda _, loss: (bar.update(), bar.set_postfix(loss=f"{loss:.3f}", refresh=False)),
            classes=[r["gold_grade"] for r in train],  # what sft.balance balances
            regime=regime,
        )
    sft_seconds = time.perf_counter() - sft_started
    model = merge_adapters(trained) if config.lora.enabled else trained
    after = grade_audit()
    out = Path(config.out_dir)
    save_model(model, tokenizer, out)
    prompt.save(out)
    report = {
        "base_model": config.base_model or "tiny",
        "parameters": count_parameters(model),
        "trainable_parameters": trainable,
        "lora_rank": config.lora.rank,
        "trainable_layers": config.trainable_layers,
        "vocab_size": len(tokenizer),
        "sft_examples": len(examples),
        "sft_steps": len(losses),
        "sft_final_loss": losses[-1],
        "sft_seconds_per_step": round(sft_seconds / len(losses), 2),
        "sft_learning_rate": config.sft.learning_rate or LEARNING_RATES[regime],
        "audit_examples": len(audit),
        "audit_constrained": config.audit_constrained,
        "audit_accuracy_base": before["accuracy"],
        "audit_accuracy_sft": after["accuracy"],
        "audit_unparseable_sft": after["unparseable"],
        **grade_breakdown("audit_sft_", after),
        "prompt_version": prompt.version,
        "chat_template": prompt.chat_tokenizer is not None,
        "answer_format": prompt.answer_format,
        "seconds": round(time.perf_counter() - started, 1),
    }
    paths = {"model": out, "report": write_json_atomic(out / "teacher_report.json", report)}
    what = f"tiny teacher, vocab {report['vocab_size']}" if not config.base_model else config.base_model
    how = f"LoRA rank {config.lora.rank}" if config.lora.enabled else "fine-tuning"
    if config.trainable_layers:
        how += f" of the top {config.trainable_layers} layers"
    print_summary(
        f"teacher ({what}): {report['parameters']:,} parameters ({trainable:,} trained, {how}); audit accuracy "
        f"{before['accuracy']:.3f} -> {after['accuracy']:.3f} after SFT on {len(examples)} pairs "
        f"({report['seconds']} s)",
        paths,
    )
    return paths


def _build_tiny(config: TeacherConfig, prompt: TeacherPrompt, pairs: list[dict], train: list[dict]):
    """The tiny teacher: a BPE tokenizer on the prompts and SFT targets, and a fresh Qwen2 decoder."""
    corpus = [prompt.render_pair(r) for r in pairs if r["split"] != "test"]  # test text is the student's, unseen
    corpus += [prompt.target(r["gold_grade"], r.get("rationale")) for r in train]
    tokenizer = train_bpe_tokenizer(corpus, config.model.vocab_size)
    return build_tiny_qwen2(tokenizer, config.model), tokenizer
