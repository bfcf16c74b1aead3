"""Rollout throughput of the hf and vllm engines on the tiny teacher, and trainer step time with each.

Builds the demo's tiny teacher locally (TinyModelConfig defaults: hidden 256, 2 layers, BPE vocab 1024,
tokenizer learned from the synthetic pairs, a short SFT so responses have realistic lengths), then times
the same seeded rollout (64 prompts x n=8, 24 new tokens, T=1) with both engines: one warm-up call each,
then ``--repeats`` rounds in which the engines take turns; reports the median generated tokens/s and the
ratio. Also: vLLM start-up and weight-sync seconds, greedy agreement between the engines, the load
average (other processes skew CPU timings), and (``--trainer-steps``, 0 to skip) RLTrainer step time per
phase with each engine. Run in the vLLM venv:
``.venv-vllm/bin/python benchmarks/bench_engines.py`` (writes benchmarks/results/engines.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2, count_parameters, save_model, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine, encode_prompts
from agpo.sft import SFTConfig, supervised_finetune
from pipelines.prompts import RELEVANCE_V1
from pipelines.synthetic import SyntheticConfig, generate_pairs

RESULTS = Path(__file__).resolve().parent / "results" / "engines.json"
PHASES = ("time_rollout", "time_reward", "time_update", "time_step")


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls and the last result."""
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def rollout_benchmark(engines: dict, prompt_ids: list[list[int]], args) -> dict[str, object]:
    """Engines take turns (A B A B ...) so that load from other processes hits both alike."""

    def call(engine):
        return engine.generate(
            prompt_ids, n=args.n, temperatures=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed
        )

    for engine in engines.values():
        call(engine)  # warm-up: first calls pay one-off kernel and allocator set-up
    times: dict[str, list[float]] = {name: [] for name in engines}
    rollouts = {}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            started = time.perf_counter()
            rollouts[name] = call(engine)
            times[name].append(time.perf_counter() - started)
    results: dict[str, object] = {}
    for name, rollout in rollouts.items():
        seconds = statistics.median(times[name])
        results[name] = {
            "seconds": round(seconds, 3),
            "seconds_each": [round(t, 3) for t in times[name]],
            "generated_tokens": rollout.num_tokens,
            "tokens_per_s": round(rollout.num_tokens / seconds, 1),
            "tokens_per_s_best": round(rollout.num_tokens / min(times[name]), 1),  # least disturbed round
            "mean_response_tokens": round(rollout.num_tokens / len(rollout), 2),
        }
        print(name, results[name], flush=True)
    return results


def trainer_benchmark(base, tokenizer, prompts, rows, vllm_engine, steps: int) -> dict[str, object]:
    """AGPO steps (8 prompts x 8, 24 new tokens) with each engine on its own copy of ``base``, alternating."""
    from agpo.rewards import parse_grade, relevance_reward
    from agpo.trainer import RLTrainer, TrainerConfig

    gold = {"gold_grade": [r["gold_grade"] for r in rows]}
    trainers = {}
    for name in ("hf", "vllm"):
        model = copy.deepcopy(base)
        if name == "hf":
            engine = HFRolloutEngine(model, tokenizer)
        else:
            engine = vllm_engine
            engine.sync_weights(model)
        config = TrainerConfig(algorithm="agpo", max_new_tokens=24, max_steps=steps + 1, micro_batch_size=64)
        trainers[name] = RLTrainer(
            model, tokenizer, engine, relevance_reward, prompts, gold, config, answer_fn=parse_grade, progress=False
        )
        trainers[name].step()  # warm-up
    history: dict[str, list[dict[str, float]]] = {name: [] for name in trainers}
    for _ in range(steps):
        for name, trainer in trainers.items():
            history[name].append(trainer.step())
    results: dict[str, object] = {}
    for name, steps_run in history.items():
        summary = {phase: round(statistics.median(s[phase] for s in steps_run), 4) for phase in PHASES}
        summary["rollout_share"] = round(summary["time_rollout"] / summary["time_step"], 3)
        summary["tokens_per_step"] = statistics.fmean(s["step_tokens"] for s in steps_run)
        results[name] = summary
        print("trainer", name, summary, flush=True)
    return results


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-pairs", type=int, default=500, help="SFT examples before timing (0: random weights)")
    parser.add_argument("--trainer-steps", type=int, default=4, help="timed RLTrainer steps per engine (0: skip)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from agpo.rollout.vllm import VLLMRolloutEngine

    rows = generate_pairs(SyntheticConfig(train=1000, audit=0, unlabeled=0, test=0))
    prompts = [RELEVANCE_V1.render_pair(r) for r in rows]
    targets = [RELEVANCE_V1.target(r["gold_grade"], r["rationale"]) for r in rows]
    tokenizer = train_bpe_tokenizer([p + t for p, t in zip(prompts, targets, strict=True)], 1024)
    base = build_tiny_qwen2(tokenizer, TinyModelConfig())
    if args.sft_pairs:
        examples = list(zip(prompts[: args.sft_pairs], targets[: args.sft_pairs], strict=True))
        supervised_finetune(base, tokenizer, examples, SFTConfig(epochs=1))
    base.eval()
    prompt_ids = encode_prompts(tokenizer, prompts[-args.prompts :])  # not among the SFT examples
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as model_dir:
        save_model(base, tokenizer, model_dir)
        started = time.perf_counter()
        vllm_engine = VLLMRolloutEngine(model_dir, tokenizer)
        startup = time.perf_counter() - started
    sync_seconds, _ = timed(lambda: vllm_engine.sync_weights(base), 3)
    engines = {"hf": HFRolloutEngine(base, tokenizer), "vllm": vllm_engine}
    greedy = {
        name: e.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=args.max_new_tokens, greedy=True)
        for name, e in engines.items()
    }
    same = sum(a == b for a, b in zip(greedy["hf"].token_ids, greedy["vllm"].token_ids, strict=True))
    results: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
        "versions": _versions(),
        "model_parameters": count_parameters(base),
        "shape": f"{args.prompts} prompts x n={args.n}, max {args.max_new_tokens} new tokens, T=1, seeded; "
        f"median of {args.repeats} rounds, engines taking turns, after a warm-up call each",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "vllm_startup_s": round(startup, 2),
        "vllm_sync_weights_s": round(sync_seconds, 4),
        "greedy_rows_identical": f"{same}/{len(prompt_ids)}",
    }
    print({k: results[k] for k in ("vllm_startup_s", "vllm_sync_weights_s", "greedy_rows_identical")}, flush=True)
    rollout = rollout_benchmark(engines, prompt_ids, args)
    rollout["vllm_over_hf_tokens_per_s"] = round(rollout["vllm"]["tokens_per_s"] / rollout["hf"]["tokens_per_s"], 2)
    rollout["vllm_over_hf_best"] = round(rollout["vllm"]["tokens_per_s_best"] / rollout["hf"]["tokens_per_s_best"], 2)
    results["rollout"] = rollout
    print("vllm / hf tokens/s: median", rollout["vllm_over_hf_tokens_per_s"], "best", rollout["vllm_over_hf_best"])
    if args.trainer_steps:
        results["trainer_step"] = trainer_benchmark(base, tokenizer, prompts, rows, vllm_engine, args.trainer_steps)
    vllm_engine.close()
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written: {RESULTS}")
    return results


def _versions() -> dict[str, str]:
    import transformers
    import vllm

    return {"torch": torch.__version__, "transformers": transformers.__version__, "vllm": vllm.__version__}


if __name__ == "__main__":
    main()
