"""Stage ``agpo teacher``: build the tiny base teacher locally and warm it up with SFT on gold pairs.

1. train a byte-level BPE tokenizer on the pairs' prompts and SFT targets (train, audit and unlabeled
   splits: no labels are read from unlabeled rows, only text; the test split stays unseen);
2. build a randomly initialised Qwen2 decoder (head_dim 64);
3. SFT on ``sft_examples`` train pairs: prompt -> " rationale <answer>k</answer>" (rationale when present);
4. grade the audit split greedily before and after SFT, save the model directory (safetensors) and a
   report with both accuracies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from agpo.models import TinyModelConfig, build_tiny_qwen2, count_parameters, save_model, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine
from agpo.sft import SFTConfig, supervised_finetune
from pipelines.ads.contracts import labeled_splits, read_pairs
from pipelines.ads.prompts import get_prompt
from pipelines.ads.teacher_eval import grade_pairs, relevance_accuracy
from pipelines.io import print_summary, write_json_atomic


@dataclass(frozen=True)
class TeacherConfig:
    """Inputs, outputs and sizes of the base teacher and its SFT warm start."""

    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs Parquet (from `agpo data`)"})
    out_dir: str = field(default="work/teacher/sft", metadata={"help": "model directory to write"})
    prompt_version: str = field(default="relevance-v1", metadata={"help": "prompt template version"})
    sft_examples: int = field(default=2000, metadata={"help": "train pairs used for SFT (the first N)"})
    audit_examples: int = field(default=300, metadata={"help": "audit pairs graded before and after SFT"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest graded answer in tokens"})
    model: TinyModelConfig = field(default_factory=TinyModelConfig, metadata={"help": "tiny model shape"})
    sft: SFTConfig = field(default_factory=SFTConfig, metadata={"help": "SFT settings"})


def run(config: TeacherConfig) -> dict[str, Path]:
    prompt = get_prompt(config.prompt_version)
    pairs = read_pairs(config.pairs).to_pylist()
    train, audit = labeled_splits(pairs, config.pairs, config.sft_examples, config.audit_examples)
    started = time.perf_counter()
    corpus = [prompt.render_pair(r) for r in pairs if r["split"] != "test"]  # test text is the student's, unseen
    corpus += [prompt.target(r["gold_grade"], r.get("rationale")) for r in train]
    tokenizer = train_bpe_tokenizer(corpus, config.model.vocab_size)
    model = build_tiny_qwen2(tokenizer, config.model)
    engine = HFRolloutEngine(model, tokenizer)
    audit_prompts = [prompt.render_pair(r) for r in audit]
    audit_gold = [r["gold_grade"] for r in audit]
    before = relevance_accuracy(grade_pairs(engine, tokenizer, audit_prompts, config.max_new_tokens)[0], audit_gold)

    examples = [(prompt.render_pair(r), prompt.target(r["gold_grade"], r.get("rationale"))) for r in train]
    steps = -(-len(examples) // config.sft.batch_size) * config.sft.epochs
    with tqdm(total=steps, desc="SFT warm start", unit="step", mininterval=1.0) as bar:
        losses = supervised_finetune(
            model,
            tokenizer,
            examples,
            config.sft,
            on_step=lambda _, loss: (bar.update(), bar.set_postfix(loss=f"{loss:.3f}", refresh=False)),
        )
    after = relevance_accuracy(grade_pairs(engine, tokenizer, audit_prompts, config.max_new_tokens)[0], audit_gold)
    out = Path(config.out_dir)
    save_model(model, tokenizer, out)
    report = {
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "sft_examples": len(examples),
        "sft_steps": len(losses),
        "sft_final_loss": losses[-1],
        "audit_examples": len(audit),
        "audit_accuracy_base": before["accuracy"],
        "audit_accuracy_sft": after["accuracy"],
        "audit_unparseable_sft": after["unparseable"],
        "prompt_version": prompt.version,
        "seconds": round(time.perf_counter() - started, 1),
    }
    paths = {"model": out, "report": write_json_atomic(out / "teacher_report.json", report)}
    print_summary(
        f"tiny teacher: {report['parameters']:,} parameters, vocab {report['vocab_size']}; audit accuracy "
        f"{before['accuracy']:.3f} (random init) -> {after['accuracy']:.3f} after SFT on {len(examples)} pairs "
        f"({report['seconds']} s)",
        paths,
    )
    return paths
