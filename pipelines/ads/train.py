"""Stage ``agpo train``: RL of the teacher on verifiable relevance grades (any registered algorithm).

Reads the base teacher (the SFT teacher directory, any local HF causal-LM directory, or a packaged model
name such as ``smollm2-135m-instruct``) and the pairs file; trains on the labeled train split with the
relevance reward (1 when the parsed grade equals gold); grades the audit split at the start, every
``trainer.eval_every`` steps and at the end. Writes into ``out_dir``: ``model/`` (the trained teacher,
safetensors), ``metrics.jsonl`` (one line per step, appended as training goes), ``summary.json``,
``curves.png`` and, with ``trainer.checkpoint_every``, ``checkpoints/``.

Rerunning the same command resumes from the newest checkpoint (``resume: true``): ``metrics.jsonl`` is cut
back to that step and the following steps are trained again, so every step appears exactly once. Under
torchrun with a ``deepspeed`` config every rank trains its share of each step and rank 0 writes the
outputs; ``processes: N`` launches that torchrun itself (pipelines.launch), so a command or an Airflow task
trains with N ranks from its config alone (on CPU: gloo, e.g. N = 2 with configs/deepspeed/zero1.json).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from agpo.checks import require_choice, require_int
from agpo.distributed import load_deepspeed_config
from agpo.models import load_model
from agpo.pretrained import resolve_base_model
from agpo.rewards import parse_grade, relevance_reward
from agpo.rollout.factory import ENGINES, build_engine
from agpo.trainer import RLTrainer, TrainerConfig
from pipelines.contracts import labeled_splits, read_pairs
from pipelines.io import append_metrics, moving_average, print_summary, restart_metrics, write_json_atomic
from pipelines.launch import torchrun, under_torchrun
from pipelines.plots import plot_learning_curves
from pipelines.prompts import get_prompt
from pipelines.rollout_fields import deepspeed_field, engine_field, engine_options_field
from pipelines.teacher_eval import grade_pairs, relevance_accuracy, sampled_accuracy

SMOOTHING = 10  # steps averaged in the plotted train reward (one step is only G x prompts samples)


@dataclass(frozen=True)
class TrainTeacherConfig:
    """Inputs, outputs and trainer settings of teacher RL."""

    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs Parquet (from `agpo data`)"})
    base_model: str = field(
        default="work/teacher/sft",
        metadata={
            "help": "model to start from: a local HF causal-LM directory or a packaged name (smollm2-135m-instruct)"
        },
    )
    out_dir: str = field(default="work/teacher/rl", metadata={"help": "run folder: model/, metrics.jsonl, summary"})
    prompt_version: str = field(default="relevance-v1", metadata={"help": "prompt template version"})
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    deepspeed: str | None = deepspeed_field()
    processes: int = field(
        default=1, metadata={"help": "data-parallel ranks on this machine: > 1 launches torchrun (needs deepspeed)"}
    )
    resume: bool = field(default=True, metadata={"help": "continue from the newest checkpoint in out_dir if any"})
    train_examples: int | None = field(default=None, metadata={"help": "use the first N train pairs; null: all"})
    audit_examples: int = field(default=300, metadata={"help": "audit pairs graded during training"})
    audit_samples: int = field(
        default=4, metadata={"help": "samples per audit pair: audit accuracy is their mean (pass@1), plus maj@n"}
    )
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the RL trainer"})

    def __post_init__(self) -> None:
        require_choice("engine", self.engine, ENGINES)
        require_int("processes", self.processes, 1)
        if self.processes > 1 and not self.deepspeed:
            raise ValueError(
                f"processes={self.processes} trains data-parallel through DeepSpeed: set deepspeed too "
                "(e.g. deepspeed=configs/deepspeed/zero1.json)"
            )


def outputs(out: Path) -> dict[str, Path]:
    """What a run writes into ``out`` (the in-process run and the torchrun launcher both return it)."""
    return {"model": out / "model", "metrics": out / "metrics.jsonl", "summary": out / "summary.json",
            "curves": out / "curves.png"}  # fmt: skip


def run(config: TrainTeacherConfig) -> dict[str, Path]:
    if config.processes > 1 and not under_torchrun():
        torchrun("train", config, config.processes, Path(config.out_dir))
        return outputs(Path(config.out_dir))
    prompt = get_prompt(config.prompt_version)
    pairs = read_pairs(config.pairs).to_pylist()
    train, audit = labeled_splits(pairs, config.pairs, config.train_examples, config.audit_examples)
    base_dir = resolve_base_model(config.base_model)
    model, tokenizer = load_model(base_dir)
    engine = build_engine(config.engine, model, tokenizer, base_dir, **config.engine_options)
    ds_config = load_deepspeed_config(config.deepspeed) if config.deepspeed else None
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
    paths = outputs(out)
    metrics_path = paths["metrics"]
    trainer = RLTrainer(
        model,
        tokenizer,
        engine,
        relevance_reward,
        [prompt.render_pair(r) for r in train],
        {"gold_grade": [r["gold_grade"] for r in train]},
        config.trainer,
        answer_fn=parse_grade,
        evaluate=evaluate,
        checkpoint_dir=out / "checkpoints",
        deepspeed_config=ds_config,
    )
    resumed_from = trainer.restore() if config.resume else None
    if trainer.is_main_process:
        restart_metrics(metrics_path, resumed_from)
        trainer.callback = lambda step, metrics: append_metrics(metrics_path, step, metrics)
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    trainer.save_model(paths["model"])
    if not trainer.is_main_process:
        return {}
    history = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines()]
    evals = [h for h in history if "eval/audit_accuracy" in h]
    summary = {
        "algorithm": config.trainer.algorithm,
        "steps": result.steps,
        "generated_tokens": result.generated_tokens,
        "seconds": round(seconds, 1),
        "resumed_from_step": resumed_from,
        "engine": config.engine,
        "world_size": trainer.updater.world_size,
        "audit_accuracy_start": evals[0]["eval/audit_accuracy"],
        "audit_accuracy_end": evals[-1]["eval/audit_accuracy"],
        "audit_greedy_accuracy_start": evals[0]["eval/audit_greedy_accuracy"],
        "audit_greedy_accuracy_end": evals[-1]["eval/audit_greedy_accuracy"],
        f"audit_maj@{config.audit_samples}_start": evals[0][f"eval/audit_maj@{config.audit_samples}"],
        f"audit_maj@{config.audit_samples}_end": evals[-1][f"eval/audit_maj@{config.audit_samples}"],
        "audit_unparseable_end": evals[-1]["eval/audit_unparseable"],
        "train_reward_last": history[-1].get("reward_mean"),
        "base_model": config.base_model,
        "prompt_version": prompt.version,
    }
    steps = [h for h in history if "reward_mean" in h]
    write_json_atomic(paths["summary"], summary)
    plot_learning_curves(
        {
            f"train reward ({SMOOTHING}-step mean)": (
                [h["step"] for h in steps],
                moving_average([h["reward_mean"] for h in steps], SMOOTHING),
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
        paths["curves"],
        title=f"Teacher RL with {config.trainer.algorithm}",
        xlabel="step",
        ylabel="reward / accuracy",
    )
    print_summary(
        f"teacher RL ({config.trainer.algorithm}): audit accuracy (sampled) {summary['audit_accuracy_start']:.3f} -> "
        f"{summary['audit_accuracy_end']:.3f}, greedy {summary['audit_greedy_accuracy_start']:.3f} -> "
        f"{summary['audit_greedy_accuracy_end']:.3f} in {result.steps} steps, "
        f"{result.generated_tokens:,} generated tokens, {summary['seconds']} s",
        paths,
    )
    return paths
