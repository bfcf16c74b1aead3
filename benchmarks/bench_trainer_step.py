"""Trainer step time split by phase, and generated tokens/s, for the cpu-tiny preset.

Builds the tiny teacher from the embedded synthetic data (tokenizer, Qwen2 model, a short SFT so answers
have realistic lengths), then times ``--steps`` RL steps per algorithm in this process after one warm-up
step. Run: ``.venv/bin/python benchmarks/bench_trainer_step.py`` (writes benchmarks/results/trainer_step.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2, count_parameters, train_bpe_tokenizer
from agpo.rewards import parse_grade, relevance_reward
from agpo.rollout import HFRolloutEngine
from agpo.sft import SFTConfig, supervised_finetune
from agpo.trainer import RLTrainer, TrainerConfig
from pipelines.prompts import RELEVANCE_V1
from pipelines.synthetic import SyntheticConfig, generate_pairs

RESULTS = Path(__file__).resolve().parent / "results" / "trainer_step.json"
PHASES = ("time_rollout", "time_reward", "time_update", "time_step")


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--algorithms", default="grpo,agpo,adaptive_agpo")
    args = parser.parse_args()
    rows = generate_pairs(SyntheticConfig(train=1000, audit=0, unlabeled=0, test=0))
    prompts = [RELEVANCE_V1.render_pair(r) for r in rows]
    targets = [RELEVANCE_V1.target(r["gold_grade"], r["rationale"]) for r in rows]
    tokenizer = train_bpe_tokenizer([p + t for p, t in zip(prompts, targets, strict=True)], 1024)
    base = build_tiny_qwen2(tokenizer, TinyModelConfig())
    supervised_finetune(base, tokenizer, list(zip(prompts[:500], targets[:500], strict=True)), SFTConfig(epochs=1))
    state = {k: v.clone() for k, v in base.state_dict().items()}
    results: dict[str, object] = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "model_parameters": count_parameters(base),
        "shape": "8 prompts x 8 responses, max 24 new tokens, 1 PPO epoch (adaptive_agpo: 2), micro-batch 64",
    }
    for algorithm in args.algorithms.split(","):
        base.load_state_dict(state)
        config = TrainerConfig(
            algorithm=algorithm,
            max_new_tokens=24,
            max_steps=args.steps + 1,
            micro_batch_size=64,
            ppo_epochs=2 if algorithm == "adaptive_agpo" else 1,
        )
        engine = HFRolloutEngine(base, tokenizer)
        gold = {"gold_grade": [r["gold_grade"] for r in rows]}
        trainer = RLTrainer(
            base, tokenizer, engine, relevance_reward, prompts, gold, config, answer_fn=parse_grade, progress=False
        )
        trainer.step()  # warm-up
        steps = [trainer.step() for _ in range(args.steps)]
        summary = {phase: round(statistics.median(s[phase] for s in steps), 4) for phase in PHASES}
        summary["tokens_per_step"] = statistics.fmean(s["step_tokens"] for s in steps)
        summary["generated_tokens_per_s"] = round(
            sum(s["step_tokens"] for s in steps) / sum(s["time_step"] for s in steps), 1
        )
        summary["rollout_share"] = round(summary["time_rollout"] / summary["time_step"], 3)
        results[algorithm] = summary
        print(algorithm, summary, flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return results


if __name__ == "__main__":
    main()
