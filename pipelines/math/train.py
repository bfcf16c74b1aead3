"""Stage ``agpo math-train``: RL with verifiable math rewards (the papers' setting), any algorithm.

Problems come from the synthetic arithmetic task (pipelines.arithmetic, the default: a tiny model learns
it in minutes) or a math set (GSM8K, MATH-500, CMATH via pipelines.math_data); the first ``eval_problems``
are held out and the rest are trained on. The policy starts from ``base_model`` (a local HF causal-LM
directory or a packaged name) or, when it is null, from a tiny Qwen2 built here and warmed up with SFT on
the training problems' worked answers (saved to ``out_dir/base`` so other algorithms can start from the
very same weights). The reward is 1.0 when the ``\\boxed{}`` answer is math-verify-equivalent to gold.
Held-out pass@1 and maj@n (``eval_samples`` samples per problem) are measured at the start, every
``trainer.eval_every`` steps and at the end. Writes ``model/``, ``metrics.jsonl``, ``summary.json`` and
``curves.png`` into ``out_dir``; rerunning resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agpo.distributed import load_deepspeed_config
from agpo.models import TinyModelConfig, build_tiny_qwen2, load_model, save_model, train_bpe_tokenizer
from agpo.pretrained import resolve_base_model
from agpo.rewards.math import extract_answer, math_reward
from agpo.rollout import encode_prompts
from agpo.rollout.factory import build_engine
from agpo.sft import SFTConfig, supervised_finetune
from agpo.trainer import RLTrainer, TrainerConfig
from pipelines.arithmetic import ArithmeticConfig, arithmetic_problems, sft_target
from pipelines.io import append_metrics, moving_average, print_summary, restart_metrics, write_json_atomic
from pipelines.math_data import LOADERS, load_math_set, render_prompt
from pipelines.math_eval import score_samples
from pipelines.plots import plot_learning_curves
from pipelines.rollout_fields import deepspeed_field, engine_field, engine_options_field

DATASETS = ("arithmetic", *sorted(LOADERS))


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
    trainer: TrainerConfig = field(default_factory=TrainerConfig, metadata={"help": "the RL trainer"})
    out_dir: str = field(default="work/math", metadata={"help": "run folder: base/, model/, metrics.jsonl, summary"})

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {list(DATASETS)}, got {self.dataset!r}")
        if self.eval_problems < 1 or self.eval_samples < 1:
            raise ValueError("eval_problems and eval_samples must be >= 1")


def problems_of(config: MathTrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) problems."""
    if config.dataset == "arithmetic":
        rows = arithmetic_problems(config.arithmetic)
    else:
        rows = load_math_set(config.dataset, config.path)
    if len(rows) <= config.eval_problems:
        raise ValueError(
            f"{config.dataset} has {len(rows)} problems; eval_problems={config.eval_problems} leaves none to train on"
        )
    return rows[config.eval_problems :], rows[: config.eval_problems]


def build_base(config: MathTrainConfig, train: list[dict[str, Any]]) -> Path:
    """A tiny Qwen2 warmed up on the worked answers of training problems, saved to ``out_dir/base``."""
    base = Path(config.out_dir) / "base"
    if (base / "config.json").is_file():
        return base
    if config.dataset != "arithmetic" and not all(p.get("solution") for p in train[: config.sft_examples]):
        raise ValueError(f"{config.dataset} has no worked solutions for a warm start; set base_model")
    examples = [
        (render_prompt(p["problem"]), sft_target(p) if config.dataset == "arithmetic" else " " + p["solution"])
        for p in train[: config.sft_examples]
    ]
    tokenizer = train_bpe_tokenizer([a + b for a, b in examples], config.model.vocab_size, split_digits=True)
    model = build_tiny_qwen2(tokenizer, config.model)
    steps = -(-len(examples) // config.sft.batch_size) * config.sft.epochs
    with tqdm(total=steps, desc="SFT warm start", unit="step", mininterval=1.0) as bar:
        supervised_finetune(model, tokenizer, examples, config.sft, on_step=lambda _, loss: bar.update())
    return save_model(model, tokenizer, base)


def held_out_scores(engine, tokenizer, problems, samples: int, temperature: float, max_new: int, seed: int) -> dict:
    ids = encode_prompts(tokenizer, [render_prompt(p["problem"]) for p in problems])
    rollout = engine.generate(ids, n=samples, temperatures=temperature, max_new_tokens=max_new, seed=seed)
    completions = [rollout.texts[i * samples : (i + 1) * samples] for i in range(len(problems))]
    return score_samples(problems, completions)


def run(config: MathTrainConfig) -> dict[str, Path]:
    train, held_out = problems_of(config)
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base_dir = resolve_base_model(config.base_model) if config.base_model else build_base(config, train)
    model, tokenizer = load_model(base_dir)
    engine = build_engine(config.engine, model, tokenizer, base_dir, **config.engine_options)
    n, trainer_config = config.eval_samples, config.trainer

    def evaluate() -> dict[str, float]:
        scores = held_out_scores(engine, tokenizer, held_out, n, trainer_config.temperature,
                                 trainer_config.max_new_tokens, trainer_config.seed)  # fmt: skip
        return {"heldout_pass@1": scores["pass_at_k"][1], f"heldout_maj@{n}": scores["maj_at_k"][n],
                "heldout_unparseable": scores["unparseable"]}  # fmt: skip

    metrics_path = out / "metrics.jsonl"
    trainer = RLTrainer(
        model, tokenizer, engine, math_reward, [render_prompt(p["problem"]) for p in train],
        {"answer": [p["answer"] for p in train]}, trainer_config, answer_fn=extract_answer, evaluate=evaluate,
        checkpoint_dir=out / "checkpoints",
        deepspeed_config=load_deepspeed_config(config.deepspeed) if config.deepspeed else None,
    )  # fmt: skip
    resumed_from = trainer.restore()
    if trainer.is_main_process:
        restart_metrics(metrics_path, resumed_from)
        trainer.callback = lambda step, metrics: append_metrics(metrics_path, step, metrics)
    started = time.perf_counter()
    result = trainer.train()
    model_dir = trainer.save_model(out / "model")
    if not trainer.is_main_process:
        return {}
    history = [json.loads(line) for line in metrics_path.read_text(encoding="utf-8").splitlines()]
    evals = [h for h in history if "eval/heldout_pass@1" in h]
    steps = [h for h in history if "reward_mean" in h]
    summary = {
        "dataset": config.dataset,
        "algorithm": trainer_config.algorithm,
        "steps": result.steps,
        "generated_tokens": result.generated_tokens,
        "seconds": round(time.perf_counter() - started, 1),
        "base_model": str(base_dir),
        "heldout_problems": len(held_out),
        "heldout_pass@1_start": evals[0]["eval/heldout_pass@1"],
        "heldout_pass@1_end": evals[-1]["eval/heldout_pass@1"],
        f"heldout_maj@{n}_end": evals[-1][f"eval/heldout_maj@{n}"],
    }
    curves = {
        "train reward (10-step mean)": (
            [h["step"] for h in steps],
            moving_average([h["reward_mean"] for h in steps], 10),
        ),
        "held-out pass@1": ([h["step"] for h in evals], [h["eval/heldout_pass@1"] for h in evals]),
    }
    paths = {
        "model": model_dir,
        "base": base_dir,
        "metrics": metrics_path,
        "summary": write_json_atomic(out / "summary.json", summary),
        "curves": plot_learning_curves(
            curves,
            out / "curves.png",
            title=f"Math RL with {trainer_config.algorithm}",
            xlabel="step",
            ylabel="reward / pass@1",
        ),
    }
    print_summary(
        f"math RL ({trainer_config.algorithm}, {config.dataset}): held-out pass@1 "
        f"{summary['heldout_pass@1_start']:.3f} -> {summary['heldout_pass@1_end']:.3f} in {result.steps} steps, "
        f"{result.generated_tokens:,} tokens",
        paths,
    )
    return paths
