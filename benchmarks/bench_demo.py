"""``make demo`` timed as a newcomer runs it, from an existing venv: the whole DAG through Airflow on the
embedded defaults, as run ``--run`` (default ``bench-demo``), whose folder is removed first so nothing is
reused; first on a quiet machine, then beside ``--busy`` single-threaded busy processes (``while True:
pass``, run ``<run>-busy``; 0: not measured). The quiet run's RL teacher (``work/runs/<run>/teacher/rl/model``)
stays for bench_annotate_throughput.

Records the wall time of the make command (Airflow's DB migrate, the DAG run, the closing ``agpo compare``)
and, from the run's step markers (``work/runs/<run>/steps/*_SUCCESS.json``), when each step finished,
counted from the start; the gap between successive markers is each step's share (the annotate shards run
in parallel, so theirs overlap). Goals: under 3 minutes quiet, under 6 beside one busy process, on 2 cores.
Run: ``.venv/bin/python benchmarks/bench_demo.py`` (writes benchmarks/results/demo.json).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import write_results

ROOT = Path(__file__).resolve().parent.parent
GOALS_MINUTES = {"quiet": 3.0, "busy": 6.0}
BUSY = "while True: pass"


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


def timed_demo(run: str, busy: int) -> dict:
    """``make demo RUN=run`` from a removed run folder, beside ``busy`` busy processes: minutes and steps."""
    shutil.rmtree(ROOT / "work" / "runs" / run, ignore_errors=True)
    competitors = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        started = time.time()
        subprocess.run(["make", "demo", f"RUN={run}"], cwd=ROOT, check=True)
        minutes = (time.time() - started) / 60
    finally:
        for process in competitors:
            process.kill()
            process.wait()
    timeline = step_timeline(ROOT / "work" / "runs" / run / "steps", started)
    return {
        "command": f"make demo RUN={run}",
        "busy_processes": busy,
        "wall_minutes": round(minutes, 2),
        "steps_finished_at_s": timeline,
        "step_shares_s": step_shares(timeline),
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="bench-demo", help="run name; work/runs/<run> is removed first")
    parser.add_argument("--busy", type=int, default=1, help="busy processes beside the second run (0: none)")
    args = parser.parse_args()
    runs = {"quiet": timed_demo(args.run, 0)}
    if args.busy:
        runs["busy"] = timed_demo(f"{args.run}-busy", args.busy)
    targets = {
        f"demo_minutes_{kind}": {"value": run["wall_minutes"], "target": GOALS_MINUTES[kind]}
        for kind, run in runs.items()
    }
    for kind, run in runs.items():
        print(
            f"make demo ({kind}, {run['busy_processes']} busy): {run['wall_minutes']:.2f} min "
            f"(goal < {GOALS_MINUTES[kind]:g}); step shares (s): {run['step_shares_s']}"
        )
    results = {"run": args.run, **runs["quiet"], "runs": runs, "targets": targets}
    write_results("demo", results)
    return results


if __name__ == "__main__":
    main()
