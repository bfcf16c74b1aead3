"""What the benchmarks share: the machine description, the tiny relevance teacher they time, and the JSON
results folder. Not a benchmark itself."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2, save_model, train_bpe_tokenizer
from agpo.sft import SFTConfig, supervised_finetune
from evaluation.backend_choice import cpu_fingerprint
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.teacher.prompts import RELEVANCE_V1

# AGPO_BENCH_RESULTS redirects the JSON (the smoke tests run benchmarks at tiny sizes without touching results/)
RESULTS_DIR = Path(os.environ.get("AGPO_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def memory_mb(field: str) -> float:
    """A ``/proc/self/status`` memory figure of this process in MB: ``VmRSS`` (now) or ``VmHWM`` (its peak;
    unlike ``ru_maxrss``, which Linux carries over fork and exec from the parent, it starts afresh at exec); NaN
    where the file has no such line."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def machine() -> dict[str, Any]:
    """CPU model and count, torch threads, torch / transformers versions, the GPU when there is one, and the
    load average (other processes skew CPU timings a lot)."""
    fingerprint = cpu_fingerprint()
    return {
        "cpu": fingerprint["cpu"] if fingerprint["cpu"] != "unknown" else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "cpu_vector_extensions": fingerprint["flags"],
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def tiny_teacher(sft_pairs: int = 500, model: TinyModelConfig | None = None):
    """The demo's tiny relevance teacher, built here: a BPE tokenizer learned from 1,000 synthetic pairs,
    a Qwen2 sized by ``model`` (default TinyModelConfig: hidden 256, 2 layers) and one SFT epoch on
    ``sft_pairs`` of them so responses have realistic lengths. Returns (model, tokenizer, rows, prompts)."""
    rows = generate_pairs(SyntheticConfig(train=1000, audit=0, unlabeled=0, test=0))
    prompts = [RELEVANCE_V1.render_pair(r) for r in rows]
    targets = [RELEVANCE_V1.target(r["gold_grade"], r["rationale"]) for r in rows]
    tokenizer = train_bpe_tokenizer([p + t for p, t in zip(prompts, targets, strict=True)], 1024)
    base = build_tiny_qwen2(tokenizer, model or TinyModelConfig())
    if sft_pairs:
        examples = list(zip(prompts[:sft_pairs], targets[:sft_pairs], strict=True))
        supervised_finetune(base, tokenizer, examples, SFTConfig(epochs=1))
    base.eval()
    return base, tokenizer, rows, prompts


def saved_tiny_teacher(directory: str | Path, model: TinyModelConfig | None = None) -> str:
    """``tiny_teacher`` saved as a model directory (what ``agpo annotate`` takes as its teacher)."""
    base, tokenizer, _, _ = tiny_teacher(model=model)
    return str(save_model(base, tokenizer, directory))


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median seconds of ``repeats`` calls and the last result."""
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def commit() -> str:
    """The checked-out commit, with ``+dirty`` when tracked files have uncommitted changes ("unknown" outside
    git; untracked files, such as the results being written, do not count)."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        status = ["git", "status", "--porcelain", "--untracked-files=no"]
        dirty = subprocess.run(status, cwd=root, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def write_results(name: str, results: dict[str, Any]) -> Path:
    """``benchmarks/results/<name>.json`` with the commit it measured, the UTC date and the machine (unless
    ``results`` already names one); prints where it went."""
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = {"commit": commit(), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    path.write_text(json.dumps({**stamp, "machine": machine(), **results}, indent=2) + "\n")
    print(f"written: {path}")
    return path
