"""Timing a predictor, ``predict(queries, ads, batch_size) -> probabilities``: pairs/s over a batch and single-pair
latency. numpy and the standard library only, so the side venv's benchmark script (benchmarks/st_backends.py, in
.venv-optimum) times sentence-transformers exactly as the main one times ours."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

Predict = Callable[[Sequence[str], Sequence[str], int], np.ndarray]


def throughput(predict: Predict, queries: Sequence[str], ads: Sequence[str], size: int, repeats: int):
    """(pairs/s of the median of ``repeats`` passes after a warm-up pass, the warm-up's output)."""
    output = np.asarray(predict(queries, ads, size))
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        predict(queries, ads, size)
        seconds.append(time.perf_counter() - started)
    return len(queries) / statistics.median(seconds), output


def latency_ms(predict: Predict, queries: Sequence[str], ads: Sequence[str], requests: int) -> dict[str, float]:
    """p50 and p99 milliseconds of single-pair calls (pairs cycled), after one warm-up call."""
    predict(queries[:1], ads[:1], 1)
    times = []
    for i in range(requests):
        pair = i % len(queries)
        started = time.perf_counter()
        predict(queries[pair : pair + 1], ads[pair : pair + 1], 1)
        times.append(1000 * (time.perf_counter() - started))
    p50, p99 = np.percentile(times, [50, 99])
    return {"p50_ms": round(float(p50), 2), "p99_ms": round(float(p99), 2)}
