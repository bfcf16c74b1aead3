"""Mapped annotation shards side by side against one after another: what LocalExecutor does with the ads DAG's
``annotate_shard`` tasks when ``AGPO_PARALLEL_SHARDS`` lets ``--shards`` of them run at once.

Each shard is one ``agpo annotate --set shards=[k]`` process over one partitioned run (the tiny teacher, 1 vote,
``--pairs`` synthetic unlabeled pairs), as each mapped task is one task process. ``sequential``: the shards'
processes one after another, each with every core (``AGPO_TASK_SLOTS=1``). ``parallel``: all of them at once,
each told ``AGPO_TASK_SLOTS=<shards>`` as pipelines.threads.prepare_airflow_task tells a mapped task, so each
runs ``cores / shards`` threads (at least 1). Both include each process's start-up, as task processes pay it.
Goal: parallel pairs/s at least 0.9x sequential. Airflow's own scheduling delays are not in either figure: the
DAG itself runs in tests/dags and the distributed stack's test.
Run: ``.venv/bin/python benchmarks/bench_parallel_shards.py`` (writes benchmarks/results/parallel_shards.json).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import saved_tiny_teacher, write_results

from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs

GOAL = 0.9
AGPO = Path(sys.executable).with_name("agpo")


def shard_command(teacher: str, pairs: Path, out: Path, shards: int, shard: int) -> list[str]:
    sets = {
        "teacher": teacher,
        "input.path": pairs,
        "input.split": "unlabeled",
        "out_dir": out,
        "num_shards": shards,
        "shards": f"[{shard}]",
        "gold": "null",
        "dedup": "false",
        "voting.votes": 1,
    }
    return [str(AGPO), "annotate", *[arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]]


def run_shards(teacher: str, pairs: Path, out: Path, shards: int, parallel: bool) -> float:
    """Seconds to label every shard, their processes at once (``parallel``) or one after another."""
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    env |= {"HF_HUB_OFFLINE": "1", "AGPO_TASK_SLOTS": str(shards if parallel else 1)}
    commands = [shard_command(teacher, pairs, out, shards, k) for k in range(shards)]
    started = time.perf_counter()
    if parallel:
        processes = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
        failed = [p.stderr.read().decode()[-2000:] for p in processes if p.wait() != 0]
    else:
        done = [subprocess.run(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
        failed = [d.stderr.decode()[-2000:] for d in done if d.returncode != 0]
    if failed:
        raise RuntimeError(f"a shard failed: {failed[0]}")
    return time.perf_counter() - started


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-parallel-shards-"))
    try:
        teacher = saved_tiny_teacher(work / "teacher")
        rows = generate_pairs(SyntheticConfig(train=0, audit=0, unlabeled=args.pairs, test=0))
        pairs = write_table(pairs_table(rows), work / "pairs.parquet")
        seconds = {
            mode: run_shards(teacher, pairs, work / mode, args.shards, mode == "parallel")
            for mode in ("sequential", "parallel")
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rate = {mode: args.pairs / value for mode, value in seconds.items()}
    ratio = rate["parallel"] / rate["sequential"]
    print(
        f"{args.shards} shards of {args.pairs:,} pairs: sequential {rate['sequential']:.1f} pairs/s, parallel "
        f"{rate['parallel']:.1f} pairs/s: {ratio:.2f}x (goal >= {GOAL})"
    )
    return write_results(
        "parallel_shards",
        {
            "pairs": args.pairs,
            "shards": args.shards,
            # 3 decimals: a tiny run's few pairs/s rounded to 0.1 would not give its ratio back
            "seconds": {mode: round(value, 3) for mode, value in seconds.items()},
            "pairs_per_s": {mode: round(value, 3) for mode, value in rate.items()},
            "targets": {"parallel_over_sequential": {"ratio": round(ratio, 3), "target": GOAL}},
        },
    )


if __name__ == "__main__":
    main()
