"""``make demo`` timed as a newcomer runs it, from an existing venv: the whole DAG through Airflow on the
embedded defaults, as run ``--run`` (default ``bench-demo``), whose folder is removed first so nothing is
reused. Its RL teacher (``work/runs/<run>/teacher/rl/model``) stays for bench_annotate_throughput.

Records the wall time of the make command (Airflow's DB migrate, the DAG run, the closing ``agpo compare``)
and, from the run's step markers (``work/runs/<run>/steps/*_SUCCESS.json``), when each step finished,
counted from the start; the gap between successive markers is each step's share (the annotate shards run
in parallel, so theirs overlap). Target: under 5 minutes on 2 cores.
Run: ``.venv/bin/python benchmarks/bench_demo.py`` (writes benchmarks/results/demo.json).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from pathlib import Path

from common import write_results

ROOT = Path(__file__).resolve().parent.parent
GOAL_MINUTES = 5.0


def step_timeline(steps: Path, started: float) -> dict[str, float]:
    """Step name -> seconds from ``started`` to its success marker, in finishing order."""
    markers = sorted(steps.glob("*_SUCCESS.json"), key=lambda p: p.stat().st_mtime)
    return {p.name.removesuffix("_SUCCESS.json"): round(p.stat().st_mtime - started, 1) for p in markers}


def step_shares(timeline: dict[str, float]) -> dict[str, float]:
    """Seconds between each step's marker and the one before it (the first counts from the start)."""
    shares, previous = {}, 0.0
    for step, finished in timeline.items():
        shares[step] = round(finished - previous, 1)
        previous = finished
    return shares


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="bench-demo", help="run name; work/runs/<run> is removed first")
    args = parser.parse_args()
    shutil.rmtree(ROOT / "work" / "runs" / args.run, ignore_errors=True)
    started = time.time()
    subprocess.run(["make", "demo", f"RUN={args.run}"], cwd=ROOT, check=True)
    minutes = (time.time() - started) / 60
    timeline = step_timeline(ROOT / "work" / "runs" / args.run / "steps", started)
    results = {
        "run": args.run,
        "command": f"make demo RUN={args.run}",
        "wall_minutes": round(minutes, 2),
        "steps_finished_at_s": timeline,
        "step_shares_s": step_shares(timeline),
        "targets": {"demo_minutes": {"value": round(minutes, 2), "target": GOAL_MINUTES}},
    }
    print(f"make demo: {minutes:.2f} min (goal < {GOAL_MINUTES:g}); step shares (s): {results['step_shares_s']}")
    write_results("demo", results)
    return results


if __name__ == "__main__":
    main()
