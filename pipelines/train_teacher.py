"""Stage ``agpo train``: RL of the teacher on verifiable relevance grades (any registered algorithm).

Reads the SFT teacher directory and the pairs file; trains on the labeled train split with the relevance
reward (1 when the parsed grade equals gold); grades the audit split greedily at the start, every
``trainer.eval_every`` steps and at the end. Writes into ``out_dir``: ``model/`` (the trained teacher,
safetensors), ``metrics.jsonl`` (one line per step), ``summary.json`` and ``curves.png``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from agpo.checks import require_choice
from agpo.models import load_model, save_model
from agpo.rewards import parse_grade, relevance_reward
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from pipelines.contracts import labeled_splits, read_pairs
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_learning_curves
from pipelines.prompts import get_prompt
from pipelines.teacher_eval import grade_pairs, relevance_accuracy, sampled_accuracy

ENGINES = ("hf",)
SMOOTHING = 10  # steps averaged in the plotted train reward (one step is only G x prompts samples)


@dataclass(frozen=True)
class TrainTeacherConfig:
    """Inputs, outputs and trainer settings of teacher RL."""

    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs Parquet (from `agpo data`)"})
    base_model: str = field(default="work/teacher/sft", metadata={"help": "teacher model directory to start from"})
    out_dir: str = field(default="work/teacher/rl", metadata={"help": "run folder: model/, metrics.jsonl, summary"})
    prompt_version: str = field(default="relevance-v1", metadata={"help": "prompt template version"})
    engine: str = field(default="hf", metadata={"help": f"rollout engine, one of {list(ENGINES)}"})
    max_batch_rows: int = field(default=1024, metadata={"help": "hf engine: generated rows per generate call"})
    train_examples: int | None = field(default=None, metadata={"help": "use the first N train pairs; null: all"})
    audit_examples: int = field(default=300, metadata={"help": "audit pairs graded during training"})
    audit_samples: int = field(
        default=4, metadata={"help": "samples per audit pair: audit accuracy is their mean (pass@1), plus maj@n"}
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the RL trainer"})

    def __post_init__(self) -> None:
        require_choice("engine", self.engine, ENGINES)


def run(config: TrainTeacherConfig) -> dict[str, Path]:
    prompt = get_prompt(config.prompt_version)
    pairs = read_pairs(config.pairs).to_pylist()
    train, audit = labeled_splits(pairs, config.pairs, config.train_examples, config.audit_examples)
    model, tokenizer = load_model(config.base_model)
    engine = HFRolloutEngine(model, tokenizer, max_batch_rows=config.max_batch_rows)
    audit_prompts = [prompt.render_pair(r) for r in audit]
    audit_gold = [r["gold_grade"] for r in audit]
    max_new = config.trainer.max_new_tokens

    def evaluate() -> dict[str, float]:
        predicted, _ = grade_pairs(engine, tokenizer, audit_prompts, max_new)
        greedy = relevance_accuracy(predicted, audit_gold)
        sampled = sampled_accuracy(
            engine,
            tokenizer,
            audit_prompts,
            audit_gold,
            n=config.audit_samples,
            temperature=config.trainer.temperature,
            max_new_tokens=max_new,
            seed=config.trainer.seed,
        )
        return {
            "audit_accuracy": sampled["pass@1"],
            f"audit_maj@{config.audit_samples}": sampled[f"maj@{config.audit_samples}"],
            "audit_greedy_accuracy": greedy["accuracy"],
            "audit_unparseable": greedy["unparseable"],
        }

    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def record(step: int, metrics: dict[str, float]) -> None:
        lines.append(json.dumps({"step": step, **metrics}))

    trainer = RLTrainer(
        model,
        tokenizer,
        engine,
        relevance_reward,
        [prompt.render_pair(r) for r in train],
        {"gold_grade": [r["gold_grade"] for r in train]},
        config.trainer,
        answer_fn=parse_grade,
        callback=record,
        evaluate=evaluate,
    )
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    evals = [h for h in result.history if "eval/audit_accuracy" in h]
    summary = {
        "algorithm": config.trainer.algorithm,
        "steps": result.steps,
        "generated_tokens": result.generated_tokens,
        "seconds": round(seconds, 1),
        "audit_accuracy_start": evals[0]["eval/audit_accuracy"],
        "audit_accuracy_end": evals[-1]["eval/audit_accuracy"],
        "audit_greedy_accuracy_start": evals[0]["eval/audit_greedy_accuracy"],
        "audit_greedy_accuracy_end": evals[-1]["eval/audit_greedy_accuracy"],
        f"audit_maj@{config.audit_samples}_start": evals[0][f"eval/audit_maj@{config.audit_samples}"],
        f"audit_maj@{config.audit_samples}_end": evals[-1][f"eval/audit_maj@{config.audit_samples}"],
        "audit_unparseable_end": evals[-1]["eval/audit_unparseable"],
        "train_reward_last": result.history[-1].get("reward_mean"),
        "base_model": config.base_model,
        "prompt_version": prompt.version,
    }
    steps = [h for h in result.history if "reward_mean" in h]
    paths = {
        "model": save_model(model, tokenizer, out / "model"),
        "metrics": write_atomic(out / "metrics.jsonl", "\n".join(lines) + "\n"),
        "summary": write_json_atomic(out / "summary.json", summary),
        "curves": plot_learning_curves(
            {
                f"train reward ({SMOOTHING}-step mean)": (
                    [h["step"] for h in steps],
                    _moving_average([h["reward_mean"] for h in steps], SMOOTHING),
                ),
                "audit accuracy (sampled, pass@1)": (
                    [h["step"] for h in evals],
                    [h["eval/audit_accuracy"] for h in evals],
                ),
                "audit accuracy (greedy)": (
                    [h["step"] for h in evals],
                    [h["eval/audit_greedy_accuracy"] for h in evals],
                ),
            },
            out / "curves.png",
            title=f"Teacher RL with {config.trainer.algorithm}",
            xlabel="step",
            ylabel="reward / accuracy",
        ),
    }
    print_summary(
        f"teacher RL ({config.trainer.algorithm}): audit accuracy (sampled) {summary['audit_accuracy_start']:.3f} -> "
        f"{summary['audit_accuracy_end']:.3f}, greedy {summary['audit_greedy_accuracy_start']:.3f} -> "
        f"{summary['audit_greedy_accuracy_end']:.3f} in {result.steps} steps, "
        f"{result.generated_tokens:,} generated tokens, {summary['seconds']} s",
        paths,
    )
    return paths


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values at each position."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i - max(0, i - window + 1) + 1) for i in range(len(values))]
