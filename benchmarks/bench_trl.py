"""Trainer step time against TRL's ``GRPOTrainer``, side by side in one process.

Both train the same tiny teacher (benchmarks.common.tiny_teacher, 1.46 M parameters) from the same
weights on the same synthetic relevance prompts and reward, at one shape: 8 prompts x G = 8 samples, at
most 24 new tokens, T = 1 over the full softmax, one PPO epoch and one optimizer step per rollout batch
(64 rows in one micro-batch), AdamW at lr 1e-6, no KL term, token-mean loss (TRL's ``dapo``),
group-normalised advantages. Contenders:

- ours: ``RLTrainer`` with ``grpo`` and with ``agpo``;
- TRL (pinned in constraints.txt) with its defaults for this shape (gradient checkpointing on), and with
  gradient checkpointing off (the fastest TRL configuration found).

Each contender runs in a fresh process of its own, on the same weights (the tiny teacher is built once and
saved), one warm-up step and then its timed steps; ``--rounds`` rounds of fresh processes, the contenders
taking turns, share the ``--steps`` so that load from other processes hits all alike. (They used to share
one process, TRL's loop in a thread: torch then keeps an OpenMP team per calling thread, and each team's
threads spin on after their work, so every contender slowed the others: ours ran at half its own speed.)
Per step, medians over steps (:data:`PHASES`): rollout
(generation and reward), logprobs (old / reference log-probs without gradient: none for ours at one PPO
epoch and no KL; TRL's only when it needs them), forward_backward (the gradient passes, loss included),
optimizer (gradient clipping and AdamW's step) and other (the rest: advantages, batch assembly, metrics);
update (all but the rollout) and total; generated tokens per step, since sampled lengths differ a little,
and so also seconds per 1,000 generated tokens. Ratios: TRL time over ours; the target (issue 21): a step
2.5x faster than TRL's default. Ours reports its phases in its step metrics; TRL's are timed from outside
(nothing else changes): a callback marks each step's start and end and each optimizer step, and
``_generate_and_score_completions``, ``training_step``, ``_clip_grad_norm`` and the no-gradient calls of
``_get_per_token_logps_and_entropies`` are wrapped with timers.
Run: ``.venv/bin/python benchmarks/bench_trl.py`` (writes benchmarks/results/trl_comparison.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch
from common import machine, tiny_teacher, write_results

from agpo.models import count_parameters, load_model, save_model
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import OptimizerConfig, RolloutConfig
from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

SHAPE = {"prompts": 8, "group_size": 8, "max_new_tokens": 24, "learning_rate": 1e-6}
PHASES = ("rollout", "logprobs", "forward_backward", "optimizer", "other")
TARGET = 2.5  # TRL's default step time over ours (issue 21)


def step_phases(step: float, tokens: float, **seconds: float) -> dict[str, float]:
    """One step's record: the seconds of every phase but ``other``, which is the rest of ``step``; update
    (all but the rollout), step and generated tokens."""
    other = step - sum(seconds.values())
    return {**seconds, "other": other, "update": step - seconds["rollout"], "step": step, "tokens": tokens}


def our_phases(metrics: dict[str, float]) -> dict[str, float]:
    """:func:`step_phases` of one ``RLTrainer.step``'s metrics."""
    return step_phases(
        metrics["time_step"],
        metrics["step_tokens"],
        rollout=metrics["time_rollout"] + metrics["time_reward"],
        logprobs=metrics["time_logprobs"],
        forward_backward=metrics["time_forward_backward"],
        optimizer=metrics["time_optimizer"],
    )


def ours(model, tokenizer, rows, prompts, algorithm: str, steps: int, shape=SHAPE) -> Iterator[dict[str, float]]:
    config = TrainerConfig(
        algorithm=algorithm,
        max_steps=steps + 1,
        rollout=RolloutConfig(
            group_size=shape["group_size"], prompts_per_step=shape["prompts"], max_new_tokens=shape["max_new_tokens"]
        ),
        optimizer=OptimizerConfig(
            learning_rate=shape["learning_rate"],
            lr_schedule="constant",
            warmup_steps=0,
            micro_batch_size=shape.get("micro_batch", shape["prompts"] * shape["group_size"]),
        ),
    )
    gold = {"gold_grade": [r["gold_grade"] for r in rows]}
    trainer = RLTrainer(
        model,
        tokenizer,
        HFRolloutEngine(model, tokenizer),
        relevance_reward,
        prompts,
        gold,
        config,
        answer_fn=parse_grade,
        progress=False,
    )
    for _ in range(steps + 1):
        yield our_phases(trainer.step())


def trl(
    model, tokenizer, rows, prompts, gradient_checkpointing: bool, steps: int, shape=SHAPE, gpu: bool = False
) -> Iterator[dict[str, float]]:
    """TRL's GRPOTrainer, driven one step at a time from a callback (the trainer owns its loop); ``shape``'s
    optional ``micro_batch`` becomes its per-device batch with gradient accumulation over the rest."""
    import threading

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows_per_step = shape["prompts"] * shape["group_size"]
    micro_batch = shape.get("micro_batch", rows_per_step)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=rows_per_step // micro_batch,
        num_generations=shape["group_size"],
        max_completion_length=shape["max_new_tokens"],
        learning_rate=shape["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=steps + 1,
        num_iterations=1,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        gradient_checkpointing=gradient_checkpointing,
        use_cpu=not gpu,
        bf16=gpu,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    dataset = Dataset.from_dict({"prompt": prompts, "gold_grade": [r["gold_grade"] for r in rows]})
    trainer = GRPOTrainer(
        model=model, reward_funcs=relevance_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    clock = dict.fromkeys(("generate", "logprobs", "training_step", "optimizer", "tokens"), 0.0)  # this step's

    def timed(name: str, method, when=lambda: True):
        def wrapper(*a, **k):
            started = time.perf_counter()
            result = method(*a, **k)
            if when():
                clock[name] += time.perf_counter() - started
            return result

        return wrapper

    generate = trainer._generate_and_score_completions

    def counted_generate(*a, **k):
        batch = generate(*a, **k)
        clock["tokens"] += float(batch["completion_mask"].sum())
        return batch

    trainer._generate_and_score_completions = timed("generate", counted_generate)
    logprobs = trainer._get_per_token_logps_and_entropies  # without gradient: old / reference, not the loss's
    trainer._get_per_token_logps_and_entropies = timed("logprobs", logprobs, when=lambda: not torch.is_grad_enabled())
    trainer.training_step = timed("training_step", trainer.training_step)
    trainer._clip_grad_norm = timed("optimizer", trainer._clip_grad_norm)
    # The trainer's loop runs in a thread that hands each finished step over and waits for its turn, so
    # the contenders can alternate step by step.
    turn, done = threading.Semaphore(0), threading.Semaphore(0)
    record: dict[str, float] = {}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            turn.acquire()
            clock.update(dict.fromkeys(clock, 0.0))
            record["started"] = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            record["optimizer_started"] = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock["optimizer"] += time.perf_counter() - record["optimizer_started"]

        def on_step_end(self, args, state, control, **kwargs):
            record.update(
                step_phases(
                    time.perf_counter() - record["started"],
                    clock["tokens"],
                    rollout=clock["generate"] - clock["logprobs"],
                    logprobs=clock["logprobs"],
                    forward_backward=clock["training_step"] - clock["generate"],
                    optimizer=clock["optimizer"],
                )
            )
            done.release()

    trainer.add_callback(StepTimer())
    thread = threading.Thread(target=trainer.train, daemon=True)
    thread.start()
    for _ in range(steps + 1):
        turn.release()
        done.acquire()
        yield {key: record[key] for key in (*PHASES, "update", "step", "tokens")}
    thread.join()


def _split(items: range, parts: int) -> list[range]:
    """``items`` cut into ``parts`` consecutive runs of near-equal length."""
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


def summarise(history: list[dict[str, float]]) -> dict[str, float]:
    timed = history[1:]  # the first step warms up
    summary = {f"{k}_s": round(statistics.median(h[k] for h in timed), 4) for k in (*PHASES, "update", "step")}
    summary["tokens_per_step"] = round(statistics.fmean(h["tokens"] for h in timed), 1)
    summary["s_per_1k_tokens"] = round(1000 * sum(h["step"] for h in timed) / sum(h["tokens"] for h in timed), 4)
    return summary


CONTENDERS = ("ours_grpo", "ours_agpo", "trl_default", "trl_no_checkpointing")


def run_part(contender: str, teacher: str, steps: int) -> list[dict[str, float]]:
    """One contender's step records (warm-up first) in this process, on the saved teacher."""
    _, _, rows, prompts = tiny_teacher(sft_pairs=0)  # the same prompts; the model comes from ``teacher``
    model, tokenizer = load_model(teacher)
    if contender.startswith("ours"):
        return list(ours(model, tokenizer, rows, prompts, contender.removeprefix("ours_"), steps))
    return list(trl(model, tokenizer, rows, prompts, contender == "trl_default", steps))


def run_contender(contender: str, teacher: str, steps: int) -> list[dict[str, float]]:
    """``run_part`` in a fresh process; its step records, warm-up dropped."""
    command = [sys.executable, __file__, "--part", contender, "--teacher", teacher, "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{contender} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])[1:]


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per contender, over all rounds")
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per contender, taking turns")
    parser.add_argument(
        "--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS), help="which to time (default: all)"
    )
    parser.add_argument("--part", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal: one contender here
    parser.add_argument("--teacher", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(run_part(args.part, args.teacher, args.steps)))
        return {}
    import trl as trl_package

    base, tokenizer, _, _ = tiny_teacher()
    history: dict[str, list[dict[str, float]]] = {name: [{}] for name in args.contenders}  # {}: the warm-up
    with tempfile.TemporaryDirectory(prefix="bench-trl-teacher-") as teacher:
        save_model(base, tokenizer, teacher)
        for round_steps in (len(r) for r in _split(range(args.steps), args.rounds)):
            for name in args.contenders:
                history[name] += run_contender(name, teacher, round_steps)
    table = {name: summarise(h) for name, h in history.items()}
    ratios = {
        f"{t}_over_{o}": {
            "step": round(table[t]["step_s"] / table[o]["step_s"], 2),
            "per_token": round(table[t]["s_per_1k_tokens"] / table[o]["s_per_1k_tokens"], 2),
            "update": round(table[t]["update_s"] / table[o]["update_s"], 2),
        }
        for t in ("trl_default", "trl_no_checkpointing")
        for o in ("ours_grpo", "ours_agpo")
        if t in table and o in table
    }
    step_ratio = min((r["step"] for k, r in ratios.items() if k.startswith("trl_default")), default=None)
    results = {
        "machine": machine(),
        "trl": trl_package.__version__,
        "model_parameters": count_parameters(base),
        "shape": SHAPE,
        "steps_timed": args.steps,
        "rounds": args.rounds,
        "table": table,
        "ratios": ratios,
        "target": f"ours (grpo and agpo) at least {TARGET}x faster per step than TRL's default",
        "target_met": step_ratio is not None and step_ratio >= TARGET,
        "targets": {"step_over_trl_default": {"ratio": step_ratio, "target": TARGET}},
    }
    print(f"{'seconds per step':22s}", *(f"{p:>16s}" for p in (*PHASES, "step")))
    for name, row in table.items():
        print(f"{name:22s}", *(f"{row[f'{p}_s']:16.4f}" for p in (*PHASES, "step")))
    for name, row in ratios.items():
        print(f"{name:40s} {row}")
    write_results("trl_comparison", results)
    return results


if __name__ == "__main__":
    main()
