"""Stage ``agpo math-train``: RL with verifiable math rewards (the papers' setting), any algorithm.

Problems come from the synthetic arithmetic task (pipelines.math.arithmetic, the default: a tiny model learns
it in minutes) or a math set (GSM8K, MATH-500, CMATH via pipelines.math.math_data); the first ``eval_problems``
are held out and the rest are trained on. The policy starts from ``base_model`` (a local HF causal-LM
directory or a packaged name) or, when it is null, from a tiny Qwen2 built here and warmed up with SFT on
the training problems' worked answers (saved to ``out_dir/base`` so other algorithms can start from the
very same weights). The reward is 1.0 when the ``\\boxed{}`` answer is math-verify-equivalent to gold.
Held-out pass@1 and maj@n (``eval_samples`` samples per problem) are measured at the start, every
``trainer.eval_every`` steps and at the end. Writes ``model/``, ``metrics.jsonl``, ``summary.json`` and
``curves.png`` into ``out_dir``. The sequence is pipelines.rl.stage's, shared with ``agpo train``: rerunning
resumes from the newest checkpoint (``resume``, with ``trainer.checkpoint.every``), and ``processes: N``
with a ``deepspeed`` config trains with N torchrun ranks (the base is built once, before they start).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agpo.models import build_tiny_qwen2, save_model, train_bpe_tokenizer
from agpo.pretrained import resolve_base_model
from agpo.rewards.math import extract_answer, math_reward
from agpo.rollout import encode_prompts
from agpo.sft import supervised_finetune
from pipelines.devices import use_device
from pipelines.math.arithmetic import arithmetic_problems, sft_target
from pipelines.math.math_data import load_math_set, render_prompt
from pipelines.math.math_eval import score_samples
from pipelines.math.math_train_config import MathTrainConfig
from pipelines.progress import progress_bar
from pipelines.rl.stage import RLTask, run_rl_stage
from pipelines.threads import use_threads


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
    device = use_device(config)
    model = build_tiny_qwen2(tokenizer, config.model).to(device.torch_device())
    steps = -(-len(examples) // config.sft.batch_size) * config.sft.epochs
    with progress_bar(total=steps, desc="SFT warm start", unit="step", mininterval=1.0) as bar:
        supervised_finetune(
            model,
            tokenizer,
            examples,
            config.sft,
            on_step=lambda _, loss: bar.update(),
            autocast_dtype=device.autocast_dtype(),
        )
    return save_model(model, tokenizer, base)


def held_out_scores(engine, tokenizer, problems, samples: int, temperature: float, max_new: int, seed: int) -> dict:
    ids = encode_prompts(tokenizer, [render_prompt(p["problem"]) for p in problems])
    rollout = engine.generate(ids, n=samples, temperatures=temperature, max_new_tokens=max_new, seed=seed)
    completions = [rollout.texts[i * samples : (i + 1) * samples] for i in range(len(problems))]
    return score_samples(problems, completions)


def run(config: MathTrainConfig) -> dict[str, Path]:
    use_threads(config.threads)  # for the base's SFT too (run_rl_stage sets them again for RL)
    train, held_out = problems_of(config)
    base_dir = resolve_base_model(config.base_model) if config.base_model else build_base(config, train)
    paths = run_rl_stage("math-train", config, base_dir, math_task(config, train, held_out))
    return {**paths, "base": base_dir} if paths else paths


def math_task(config: MathTrainConfig, train: list[dict[str, Any]], held_out: list[dict[str, Any]]) -> RLTask:
    """Train on the training problems; sample the held-out ones (pass@1, pass@n and maj@n)."""
    n, trainer = config.eval_samples, config.trainer

    def evaluation(engine, tokenizer):
        def evaluate() -> dict[str, float]:
            scores = held_out_scores(
                engine,
                tokenizer,
                held_out,
                n,
                trainer.rollout.temperature,
                trainer.rollout.max_new_tokens,
                trainer.seed,
            )
            return {
                "heldout_pass@1": scores["pass_at_k"][1],
                **({f"heldout_pass@{n}": scores["pass_at_k"][n]} if n > 1 else {}),
                f"heldout_maj@{n}": scores["maj_at_k"][n],
                "heldout_unparseable": scores["unparseable"],
            }

        return evaluate

    return RLTask(
        title="math RL",
        prompts=[render_prompt(p["problem"]) for p in train],
        columns={"answer": [p["answer"] for p in train]},
        reward_fn=math_reward,
        answer_fn=extract_answer,
        evaluation=evaluation,
        curves={"held-out pass@1": "heldout_pass@1"},
        summary={"dataset": config.dataset, "heldout_problems": len(held_out)},
    )
