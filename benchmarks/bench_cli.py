"""How long ``agpo STAGE --print-config`` and a config error take for every stage, as a user types them: a fresh
``.venv/bin/agpo`` process each time, median of ``--repeats``. Goal: under 2 s for every stage (config
resolution imports no torch, transformers or mlflow: pipelines/cli.py).
Run: ``.venv/bin/python benchmarks/bench_cli.py`` (writes benchmarks/results/cli.json).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import write_results

from pipelines.cli import STAGES

GOAL_SECONDS = 2.0
AGPO = Path(sys.executable).with_name("agpo")


def seconds(args: list[str], expected_exit: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        done = subprocess.run([str(AGPO), *args], capture_output=True, text=True)
        times.append(time.perf_counter() - started)
        if done.returncode != expected_exit:
            raise RuntimeError(f"agpo {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return statistics.median(times)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = {}
    for stage in STAGES:
        table[stage] = {
            "print_config_s": round(seconds([stage, "--print-config"], 0, args.repeats), 3),
            "config_error_s": round(seconds([stage, "--set", "no_such_key=1"], 2, args.repeats), 3),
        }
        print(
            f"{stage:20s} --print-config {table[stage]['print_config_s']:.2f} s, "
            f"config error {table[stage]['config_error_s']:.2f} s",
            flush=True,
        )
    slowest = max(max(row.values()) for row in table.values())
    return write_results(
        "cli",
        {"stages": table, "targets": {"slowest_config_seconds": {"value": slowest, "target": GOAL_SECONDS}}},
    )


if __name__ == "__main__":
    main()
