"""Fault injection: annotation SIGKILLed at 24 seeded points (partition, lease, chunk commits, shard finishes,
merge), rerun after each kill, ends byte-identical to an uninterrupted run with no row lost or twice and
nothing left behind. Each kill lands right after a chosen durable step (fsync, rename, link, unlink) of its
phase (tests/pipelines/ads/fault_child.py)."""

import hashlib
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration
CHILD = Path(__file__).with_name("fault_child.py")
SETTINGS = {"num_shards": 2, "chunk_pairs": 8, "voting.votes": 2, "voting.max_new_tokens": 16, "gold": "null"}
# kills per phase, in pipeline order; each run is killed at a seeded random step of its phase
PLAN = [("partition", 4), ("lease", 2), ("chunk commit", 8), ("shard finish", 6), ("merge", 4)]


def agpo_args(teacher, input_path, out):
    values = {"teacher": teacher, "input.path": input_path, "input.split": "null", "out_dir": out, **SETTINGS}
    return ["annotate", *[a for k, v in values.items() for a in ("--set", f"{k}={v}")]]


def run_child(phase, at, log, args):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(CHILD), phase, str(at), str(log), "--", *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done.returncode == -9


def steps_per_phase(log: Path) -> Counter:
    return Counter(line.split("\t")[0] for line in log.read_text().splitlines() if not line.startswith("KILLED"))


def kills_per_phase(log: Path) -> Counter:
    return Counter(line.split("\t")[1] for line in log.read_text().splitlines() if line.startswith("KILLED"))


def digests(out: Path) -> dict[str, str]:
    """SHA-256 of every output file that must not depend on how the run went (summary.json holds timings)."""
    files = [p for d in ("labels", "review", "quarantine", "shards") for p in sorted((out / d).iterdir())]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_two_dozen_kills_then_reruns_end_identical_to_an_uninterrupted_run(small_teacher, input_file, tmp_path):
    teacher, (input_path, pairs, lines) = small_teacher[2], input_file
    reference = tmp_path / "reference"
    assert not run_child("none", 0, tmp_path / "reference.log", agpo_args(teacher, input_path, reference))
    steps = steps_per_phase(tmp_path / "reference.log")
    # partition, lease and merge start over in every run; chunk commits and shard finishes go on where the
    # killed run stopped, so their kills take a step among the first few dozen still to do
    reach = {
        "partition": steps["partition"],
        "lease": steps["lease"] // (SETTINGS["num_shards"] + 2),
        "chunk commit": 30,
        "shard finish": steps["shard finish"] // SETTINGS["num_shards"],
        "merge": steps["merge"],
    }
    out, log, rng = tmp_path / "faulted", tmp_path / "faulted.log", random.Random(19)
    started = time.perf_counter()
    for phase, count in PLAN:
        for _ in range(count):
            assert run_child(phase, rng.randint(1, reach[phase]), log, agpo_args(teacher, input_path, out))
    assert not run_child("none", 0, log, agpo_args(teacher, input_path, out))  # the final, uninterrupted rerun
    seconds = time.perf_counter() - started

    kills = kills_per_phase(log)  # where each kill landed (a phase an earlier run finished passes it on)
    assert sum(kills.values()) == 24 and all(kills[phase] >= 2 for phase, _ in PLAN), kills
    assert digests(out) == digests(reference)  # byte-identical labels, review queue, quarantine, manifests
    labels = [r["pair_id"] for p in sorted((out / "labels").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert len(labels) == len(set(labels)) == pairs  # no row lost, none twice
    quarantined = sum(pq.ParquetFile(p).metadata.num_rows for p in (out / "quarantine").glob("*.parquet"))
    assert len(labels) + quarantined == lines  # every input line accounted for, counted from the files
    leftovers = [
        p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name in ("work", "leases") or "gen-" in p.name
    ]
    assert not leftovers  # no temp file or folder, work folder or lease of a killed worker
    print(
        f"\nfault injection: {dict(kills)} kills, {sum(steps.values())} durable steps in a run, {pairs} pairs and "
        f"{lines} input lines checked, {seconds:.0f} s"
    )
