"""GPU check: our trainer step against TRL's ``GRPOTrainer`` on a Qwen2.5-0.5B-shaped model.

The model is a Qwen2 built from a config with Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query and 2
key/value heads of 64, MLP 4864, vocabulary 151,936, tied embeddings: 494 M parameters) and random
weights, in bf16 on the GPU; nothing is downloaded. The tokenizer and prompts are the tiny teacher's
(benchmarks.common.tiny_teacher: a 1,024-token BPE and synthetic relevance prompts): ids the random model
samples beyond the tokenizer's vocabulary decode to nothing, so almost no row ends early and each step
generates close to its full shape. Shape: 16 prompts x G = 8 samples, 256 new tokens, micro-batches of
16 rows (TRL: per-device batch 16, 8 gradient-accumulation steps, one generation per optimizer step), the
rest as benchmarks/bench_trl.py (whose drivers run both trainers here): T = 1, one PPO epoch, AdamW, no
KL, token-mean loss, the relevance reward (0 for every row of a random model; the update runs all the same).

Each contender runs in a fresh process under ``--part-timeout`` (one that fails, times out or lacks TRL
is recorded as such and the others still report): ``ours_grpo``, ``trl_default`` (TRL's defaults, so
gradient checkpointing on) and ``trl_no_checkpointing``; one warm-up step, then ``--steps`` timed steps.
Per contender, beside bench_trl's medians:

- rollout tokens/s = generated tokens per step / rollout seconds (generation and reward);
- update MFU = 6 N (R P + T) / update seconds / peak, with N the parameters, R the rows, P the mean prompt
  length in tokens, T the generated tokens: model FLOPs of a forward and backward pass over every row
  (recomputation under checkpointing and our shared prompt prefix are not counted: model FLOPs, not
  hardware FLOPs). The peak is the datasheet's dense bf16 rate looked up by the GPU's name (null when
  unknown, and on CPU); the bf16 rate of an 8192-cube matrix product measured here is reported beside it.

``--tiny`` runs the same code on CPU in fp32 with a 2-layer model, 2 prompts x G = 2 and 8 new tokens, so
that a test keeps it working. Run on a GPU through ``benchmarks/gpu_check.sh``; writes
benchmarks/results/gpu_check.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from bench_trl import ours, summarise, trl
from common import machine, tiny_teacher, write_results
from transformers import Qwen2Config, Qwen2ForCausalLM

from agpo.models import count_parameters

QWEN25_05B = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 4864,
    "vocab_size": 151936,
}
TINY_MODEL = QWEN25_05B | {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 256,
    "vocab_size": 2048,
}
SHAPE = {"prompts": 16, "group_size": 8, "max_new_tokens": 256, "learning_rate": 1e-6, "micro_batch": 16}
TINY_SHAPE = {"prompts": 2, "group_size": 2, "max_new_tokens": 8, "learning_rate": 1e-6, "micro_batch": 2}
CONTENDERS = ("ours_grpo", "trl_default", "trl_no_checkpointing")
# dense bf16 FLOP/s by the vendors' datasheets (SXM parts), matched as a substring of the device's name
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def build_model(tokenizer, tiny: bool) -> Qwen2ForCausalLM:
    """Random weights (seed 0) with Qwen2.5-0.5B's shape (``tiny``: a 2-layer one), bf16 on the GPU, else fp32."""
    config = Qwen2Config(
        **(TINY_MODEL if tiny else QWEN25_05B),
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    device, dtype = ("cpu", torch.float32) if tiny else ("cuda", torch.bfloat16)
    torch.manual_seed(0)
    with torch.device(device):  # initialised in place: no 2 GB copy from the host
        model = Qwen2ForCausalLM(config).to(dtype)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def peak_flops(device_name: str | None) -> float | None:
    return next((peak for name, peak in PEAK_BF16.items() if device_name and name in device_name), None)


def measured_matmul_flops() -> float:
    """bf16 FLOP/s of an 8192-cube matrix product on random data: median of 10 after 3 warm-ups."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    times = []
    for i in range(13):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(start.elapsed_time(end) / 1000)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192**3 / statistics.median(times)


def run_part(contender: str, tiny: bool, steps: int) -> dict[str, Any]:
    """One contender in this process: bench_trl's summary plus rollout tokens/s and the update's FLOPs."""
    _, tokenizer, rows, prompts = tiny_teacher(sft_pairs=0)  # its tokenizer and prompts; its model is unused
    shape = TINY_SHAPE if tiny else SHAPE
    model = build_model(tokenizer, tiny)
    if contender == "ours_grpo":
        history = list(ours(model, tokenizer, rows, prompts, "grpo", steps, shape))
    else:
        checkpointing = contender == "trl_default"
        history = list(trl(model, tokenizer, rows, prompts, checkpointing, steps, shape, gpu=not tiny))
    summary = summarise(history)
    rows_per_step = shape["prompts"] * shape["group_size"]
    prompt_tokens = statistics.fmean(len(tokenizer(p).input_ids) for p in prompts)
    update_tokens = rows_per_step * prompt_tokens + summary["tokens_per_step"]
    summary |= {
        "parameters": count_parameters(model),
        "rollout_tokens_per_s": round(summary["tokens_per_step"] / summary["rollout_s"], 1),
        "update_tokens": round(update_tokens),
        "update_flops_per_s": float(f"{6 * count_parameters(model) * update_tokens / summary['update_s']:.4g}"),
    }
    if torch.cuda.is_available():
        summary["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return summary


def run_contender(contender: str, tiny: bool, steps: int, timeout: float) -> dict[str, Any]:
    """``run_part`` in a fresh process; a failure, a timeout or a missing TRL becomes the contender's entry."""
    if contender.startswith("trl"):
        try:
            import trl as _  # noqa: F401
        except ImportError as error:
            return {"skipped": f"TRL is not installed: {error}"}
    command = [sys.executable, __file__, "--part", contender, "--steps", str(steps), *(["--tiny"] if tiny else [])]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": round(time.perf_counter() - started, 1)}


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model, tiny shape, fp32 on CPU")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per contender, after one warm-up")
    parser.add_argument("--part-timeout", type=float, default=130.0, help="seconds per contender")
    parser.add_argument("--contenders", default=",".join(CONTENDERS), help=f"comma-separated, from {CONTENDERS}")
    parser.add_argument("--part", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal: one contender here
    args = parser.parse_args()
    if args.part:
        print(json.dumps(run_part(args.part, args.tiny, args.steps)))
        return {}
    if not args.tiny and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --tiny for the CPU smoke run")
    gpu = None if args.tiny else torch.cuda.get_device_name()
    peak, matmul = peak_flops(gpu), None if args.tiny else round(measured_matmul_flops(), -9)
    table = {}
    for name in args.contenders.split(","):
        table[name] = row = run_contender(name, args.tiny, args.steps, args.part_timeout)
        if "update_flops_per_s" in row:
            row["update_mfu"] = round(row["update_flops_per_s"] / peak, 4) if peak else None
        print(f"{name:22s} {row}", flush=True)
    ours_row = table.get("ours_grpo", {})
    ratios = {
        f"{name}_over_ours_grpo": {k: round(row[k] / ours_row[k], 2) for k in ("step_s", "rollout_s", "update_s")}
        for name, row in table.items()
        if name != "ours_grpo" and "step_s" in row and "step_s" in ours_row
    }
    results = {
        "gpu": gpu,
        "machine": machine(),
        "model": "Qwen2 with Qwen2.5-0.5B's shape, random weights" if not args.tiny else "tiny Qwen2 (--tiny)",
        "model_parameters": next((row["parameters"] for row in table.values() if "parameters" in row), None),
        "dtype": "float32" if args.tiny else "bfloat16",
        "shape": TINY_SHAPE if args.tiny else SHAPE,
        "steps_timed": args.steps,
        "peak_bf16_flops_datasheet": peak,
        "measured_bf16_matmul_flops": matmul,
        "table": table,
        "ratios": ratios,
    }
    for name, row in ratios.items():
        print(f"{name:40s} {row}")
    write_results("gpu_check", results)
    return results


if __name__ == "__main__":
    main()
