"""Fault injection: annotation hit by 43 seeded faults across its phases (partition, lease, chunk commits,
shard finishes, merge): SIGKILL after a durable step, the step failing with ENOSPC or EIO, and the worker
thread killed while its process lives on; rerun after each, every series ends byte-identical to an
uninterrupted run with no row lost or twice and nothing left behind (tests/pipelines/ads/fault_child.py)."""

import hashlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.minutes(3)]
CHILD = Path(__file__).with_name("fault_child.py")
SETTINGS = {"num_shards": 2, "chunk_pairs": 8, "voting.votes": 2, "voting.max_new_tokens": 16, "gold": "null"}
# faults per kind and phase, in pipeline order; each run is hit at a seeded random step of its phase
PLAN = {
    "kill": [("partition", 4), ("lease", 2), ("chunk commit", 8), ("shard finish", 6), ("merge", 4)],
    "enospc": [("partition", 1), ("lease", 1), ("chunk commit", 2), ("shard finish", 2), ("merge", 1)],
    "eio": [("partition", 1), ("lease", 1), ("chunk commit", 2), ("shard finish", 2), ("merge", 1)],
    "thread": [("partition", 1), ("lease", 1), ("chunk commit", 1), ("shard finish", 1), ("merge", 1)],
}
EXPECTED = {  # how a run of each kind may end: exit code -> what its stderr says
    "kill": {-9: ""},
    # a failed step stops the run with the disk error, unless it was a clean-up whose failure is harmless
    # (shutil.rmtree(ignore_errors=True) of a temp folder): the plain rerun clears it
    "enospc": {1: "disk error: [Errno 28] No space left on device", 0: ""},
    "eio": {1: "disk error: [Errno 5] Input/output error", 0: ""},
    "thread": {0: "WorkerThreadKilled"},
}


def agpo_args(teacher, input_path, out):
    values = {"teacher": teacher, "input.path": input_path, "input.split": "null", "out_dir": out, **SETTINGS}
    return ["annotate", *[a for k, v in values.items() for a in ("--set", f"{k}={v}")]]


class ForkServer:
    """``fault_child.py --serve``: each run is a fork of a process that imported torch and transformers once, its
    own process to SIGKILL, started in a fraction of a fresh interpreter's time."""

    def __init__(self):
        # pyarrow's jemalloc starts no background thread at import: the server forks only while it holds one thread
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "JE_ARROW_MALLOC_CONF": "background_thread:false",
        }
        command = [sys.executable, str(CHILD), "--serve"]
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(command, env=env, stdin=pipe, stdout=pipe, text=True, start_new_session=True)

    def run(self, argv: list[str], output: Path) -> tuple[int, str]:
        """The exit code and stderr of one run; its stdout and stderr are kept in ``output``.out / .err."""
        out, err = output.with_suffix(".out"), output.with_suffix(".err")
        request = {"argv": argv, "stdout": str(out), "stderr": str(err)}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.died(argv)
        if not select.select([self.process.stdout], [], [], 600)[0]:
            os.killpg(self.process.pid, signal.SIGKILL)  # a run that hangs (a dead thread's lease) fails the test
            pytest.fail(f"no answer in 600 s to {argv}; its stderr ends {err.read_text()[-2000:]}")
        answer = self.process.stdout.readline()
        if not answer:
            self.died(argv)
        return json.loads(answer)["returncode"], err.read_text()

    def died(self, argv: list[str]) -> None:
        """The server itself ended (its traceback is in the test's captured stderr)."""
        pytest.fail(f"the fork server ended with exit code {self.process.wait()} before answering {argv}")

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.process.stdin.close()
        assert self.process.wait(timeout=60) == 0


def run_child(server, kind, phase, at, log, args):
    """Run ``agpo`` with one fault; the exit code when the fault landed (the log says where), else None."""
    faults_before = sum(faults(log).values()) if log.is_file() else 0
    returncode, stderr = server.run([kind, phase, str(at), str(log), "--", *args], log)
    landed = sum(faults(log).values()) > faults_before
    expected = EXPECTED[kind] if landed else {0: ""}
    assert returncode in expected and expected[returncode] in stderr, (kind, phase, returncode, stderr[-3000:])
    assert "Traceback" not in stderr or kind == "thread", stderr[-3000:]  # errors say what to do
    return returncode if landed else None


def steps_per_phase(log: Path) -> Counter:
    return Counter(line.split("\t")[0] for line in log.read_text().splitlines() if not line.startswith("FAULT"))


def faults(log: Path) -> Counter:
    """(kind, phase) -> faults that landed there."""
    return Counter(tuple(line.split("\t")[1:]) for line in log.read_text().splitlines() if line.startswith("FAULT"))


def digests(out: Path) -> dict[str, str]:
    """SHA-256 of every output file that must not depend on how the run went (summary.json holds timings)."""
    files = [p for d in ("labels", "review", "quarantine", "shards") for p in sorted((out / d).iterdir())]
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def check_outputs(out: Path, reference: Path, pairs: int, lines: int) -> None:
    assert digests(out) == digests(reference)  # byte-identical labels, review queue, quarantine, manifests
    labels = [r["pair_id"] for p in sorted((out / "labels").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert len(labels) == len(set(labels)) == pairs  # no row lost, none twice
    quarantined = sum(pq.ParquetFile(p).metadata.num_rows for p in (out / "quarantine").glob("*.parquet"))
    assert len(labels) + quarantined == lines  # every input line accounted for, counted from the files
    leftovers = [
        p for p in out.rglob("*") if p.name.endswith(".tmp") or p.name in ("work", "leases") or "gen-" in p.name
    ]
    assert not leftovers  # no temp file or folder, work folder or lease of a killed worker


def test_forty_faults_of_four_kinds_then_reruns_end_identical_to_an_uninterrupted_run(
    small_teacher, input_file, tmp_path
):
    teacher, (input_path, pairs, lines) = small_teacher[2], input_file
    reference = tmp_path / "reference"
    with ForkServer() as server:
        reference_fault = run_child(
            server, "none", "none", 0, tmp_path / "reference.log", agpo_args(teacher, input_path, reference)
        )
    assert reference_fault is None
    steps = steps_per_phase(tmp_path / "reference.log")
    # partition, lease and merge start over in every run; chunk commits and shard finishes go on where the
    # faulted run stopped, so their faults take a step among the first few dozen still to do
    reach = {
        "partition": steps["partition"],
        "lease": steps["lease"] // (SETTINGS["num_shards"] + 2),
        "chunk commit": 30,
        "shard finish": steps["shard finish"] // SETTINGS["num_shards"],
        "merge": steps["merge"],
    }
    # a series of faults on one out_dir per kind; a thread fault's process finishes the run itself, so each
    # thread fault gets an out_dir of its own. The steps are drawn in order first, so the series are the same
    # whichever finishes first; two run at a time (each child is one thread)
    rng = random.Random(19)
    series = [
        (number, kind, [(phase, rng.randint(1, reach[phase])) for phase, count in plan for _ in range(count)])
        for number, (kind, plan) in enumerate(
            [(k, plan) for k, plan in PLAN.items() if k != "thread"] + [("thread", [p]) for p in PLAN["thread"]]
        )
    ]

    def run_series(number, kind, faults_at):
        out, log, exits = tmp_path / f"{number}-{kind}", tmp_path / f"{number}-{kind}.log", Counter()
        with ForkServer() as server:
            for phase, at in faults_at:
                code = run_child(server, kind, phase, at, log, agpo_args(teacher, input_path, out))
                assert code is not None, (kind, phase)  # the fault landed
                exits[kind, code] += 1
            assert run_child(server, "none", "none", 0, log, agpo_args(teacher, input_path, out)) is None  # the rerun
        check_outputs(out, reference, pairs, lines)
        return faults(log), exits

    started, landed, exits = time.perf_counter(), Counter(), Counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        for series_faults, series_exits in pool.map(lambda args: run_series(*args), series):
            landed += series_faults
            exits += series_exits
    seconds = time.perf_counter() - started

    assert sum(landed.values()) == sum(n for plan in PLAN.values() for _, n in plan) >= 40
    phases_hit = {kind: {phase for k, phase in landed if k == kind} for kind in PLAN}
    assert all(len(hit) >= 4 for hit in phases_hit.values()), landed  # every kind across the phases
    assert exits["enospc", 1] >= 4 and exits["eio", 1] >= 4, exits  # most disk errors stop the run
    print(
        f"\nfault injection: {sum(landed.values())} faults {dict(sorted(landed.items()))}, exits "
        f"{dict(sorted(exits.items()))}, "
        f"{sum(steps.values())} durable steps in a run, {pairs} pairs and {lines} input lines checked after each "
        f"of {len(series)} series, {seconds:.0f} s"
    )
