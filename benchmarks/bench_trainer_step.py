"""Trainer step time split by phase, and generated tokens/s, for the cpu-tiny shape; and how the step
time grows with the group size G = 4, 8, 16 at 8 prompts per step.

Builds the tiny teacher (benchmarks.common.tiny_teacher), then times ``--steps`` RL steps per algorithm
(8 prompts x G = 8, at most 24 new tokens, one micro-batch) in this process after one warm-up step, each
algorithm from the same weights; then ``grpo`` at each G in ``--group-sizes``. Medians over steps, of the
trainer's own timings and of the step's phases as bench_trl splits them (``phases_s``: rollout, logprobs,
forward_backward, optimizer, other).
Run: ``.venv/bin/python benchmarks/bench_trainer_step.py`` (writes benchmarks/results/trainer_step.json).
"""

from __future__ import annotations

import argparse
import statistics

from bench_trl import PHASES as STEP_PHASES
from bench_trl import our_phases
from common import machine, tiny_teacher, write_results

from agpo.models import count_parameters
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import OptimizerConfig, RolloutConfig
from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

PHASES = ("time_rollout", "time_reward", "time_update", "time_step")


def time_steps(
    base, state, tokenizer, rows, prompts, steps: int, algorithm: str, group_size: int = 8, **optimizer
) -> dict[str, float]:
    base.load_state_dict(state)
    config = TrainerConfig(
        algorithm=algorithm,
        max_steps=steps + 1,
        rollout=RolloutConfig(group_size=group_size, max_new_tokens=24),
        optimizer=OptimizerConfig(**optimizer),
    )
    gold = {"gold_grade": [r["gold_grade"] for r in rows]}
    trainer = RLTrainer(
        base,
        tokenizer,
        HFRolloutEngine(base, tokenizer),
        relevance_reward,
        prompts,
        gold,
        config,
        answer_fn=parse_grade,
        progress=False,
    )
    trainer.step()  # warm-up
    history = [trainer.step() for _ in range(steps)]
    summary = {phase: round(statistics.median(s[phase] for s in history), 4) for phase in PHASES}
    phases = [our_phases(s) for s in history]
    summary["phases_s"] = {phase: round(statistics.median(p[phase] for p in phases), 4) for phase in STEP_PHASES}
    summary["tokens_per_step"] = statistics.fmean(s["step_tokens"] for s in history)
    summary["generated_tokens_per_s"] = round(
        sum(s["step_tokens"] for s in history) / sum(s["time_step"] for s in history), 1
    )
    summary["rollout_share"] = round(summary["time_rollout"] / summary["time_step"], 3)
    return summary


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--algorithms", default="grpo,agpo,adaptive_agpo")
    parser.add_argument("--group-sizes", default="4,8,16")
    args = parser.parse_args()
    base, tokenizer, rows, prompts = tiny_teacher()
    state = {k: v.clone() for k, v in base.state_dict().items()}
    results: dict[str, object] = {
        "machine": machine(),
        "model_parameters": count_parameters(base),
        "shape": "8 prompts x 8 responses, max 24 new tokens, 1 PPO epoch (adaptive_agpo: 2), one micro-batch",
    }
    for algorithm in args.algorithms.split(","):
        ppo_epochs = 2 if algorithm == "adaptive_agpo" else 1
        summary = time_steps(
            base,
            state,
            tokenizer,
            rows,
            prompts,
            args.steps,
            algorithm=algorithm,
            micro_batch_size=64,
            ppo_epochs=ppo_epochs,
        )
        results[algorithm] = summary
        print(algorithm, summary, flush=True)
    scaling = {}
    for group_size in map(int, args.group_sizes.split(",")):
        scaling[group_size] = time_steps(
            base,
            state,
            tokenizer,
            rows,
            prompts,
            args.steps,
            algorithm="grpo",
            group_size=group_size,
            micro_batch_size=8 * group_size,
        )
        print("G =", group_size, scaling[group_size], flush=True)
    smallest = min(scaling)
    results["group_size_scaling"] = {
        str(g): {
            **row,
            "step_time_over_smallest_g": round(row["time_step"] / scaling[smallest]["time_step"], 2),
            "rows_over_smallest_g": g / smallest,
        }
        for g, row in scaling.items()
    }
    write_results("trainer_step", results)
    return results


if __name__ == "__main__":
    main()
