"""Exactly-once publishing of ``agpo score`` to a real S3-compatible store (SeaweedFS: the s3_store / s3_env fixtures,
tests/conftest.py), under faults: the run folder stays on the local disk, the finished run's part files go to
``publish=s3://<bucket>/<prefix>`` (pipelines.storage.publish: ``If-None-Match: *``, ``_manifest.json`` last).

- a run SIGKILLed mid-shard, then rerun, publishes byte for byte what an uninterrupted run publishes;
- a worker frozen (SIGSTOP) holding a lease, whose work another worker takes over, finishes and publishes, changes no
  published object once it wakes (fenced by its lease, or its conditional PUTs answer 412 with the same bytes);
- a retry of a finished run writes nothing and exits 0;
- another result published to the same prefix is refused, naming the object.

The student is the lexical matcher (no torch forward pass); kills and freezes are real signals to real processes,
each at a chosen step (tests/pipelines/ads/fault_child.py for the kill), so no assertion depends on timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evaluation.lexical import LexicalMatcher
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.cli import main
from pipelines.storage import locate, s3_client

pytestmark = pytest.mark.integration
FAULT_CHILD = Path(__file__).with_name("fault_child.py")
FIELDS = ("pair_id", "query", "ad_title", "gold_grade", "split")
PAIRS, BAD_LINES, DUPLICATES = 60, 1, 2  # valid pairs; a broken JSON line; later copies of two pair_ids
LINES = PAIRS + BAD_LINES + DUPLICATES
SETTINGS = {"num_shards": 3, "chunk_pairs": 8, "threads": 1, "input.split": "null"}  # ~20 pairs, 3 chunks a shard
STEPS_PER_CHUNK = 6  # durable steps of one chunk commit (table, then marker: fsync, replace, fsync of the folder)
LEASE_SECONDS = 4  # the frozen worker's lease goes stale after this; its successor's heartbeat beats every 0.5 s
WAIT = 180  # seconds any wait for a child gives up after (a deadline, never a measured time)

# A worker that freezes itself (SIGSTOP) right after a step, holding its lease, until the test sends SIGCONT:
# ``shard``: after its first chunk commit (holding shard 0's lease); ``publish``: after its first published object
# (holding the merge lease). Any later call runs unhooked.
FROZEN_CHILD = """
import os, signal, sys
from pipelines.threads import prepare_openmp
prepare_openmp()
import pipelines.ads.serving.score as score
import pipelines.storage as storage
from pipelines.cli import main
where, argv = sys.argv[1], sys.argv[2:]
module, name = (score, "commit_chunk") if where == "shard" else (storage, "create_exclusive")
real = getattr(module, name)
def then_freeze(*args, **kwargs):
    setattr(module, name, real)
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGSTOP)
setattr(module, name, then_freeze)
sys.exit(main(argv))
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A JSONL of 60 pairs, a broken line and 2 duplicate pair_ids; two lexical matchers fitted to other grades."""
    work = tmp_path_factory.mktemp("publish-faults")
    synthetic = SyntheticConfig(train=PAIRS, audit=0, unlabeled=0, test=0)
    rows = [{k: r[k] for k in FIELDS} for r in generate_pairs(synthetic)]
    copies = [json.dumps({**rows[i], "ad_title": "a later copy"}) for i in (0, 5)]
    lines = [json.dumps(r) for r in rows] + ["{broken"] + copies
    (work / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    queries, ads, grades = [r["query"] for r in rows], [r["ad_title"] for r in rows], [r["gold_grade"] for r in rows]
    LexicalMatcher(4).fit(queries, ads, grades).save(work / "model-a")
    LexicalMatcher(4).fit(queries, ads, [(g + 1) % 4 for g in grades]).save(work / "model-b")  # another result
    return work


def score_args(work: Path, out: Path, publish: str, model: str = "model-a", **more) -> list[str]:
    values = {"input.path": work / "pairs.jsonl", "model": work / model, "out_dir": out, "publish": publish}
    return ["score", *[a for k, v in {**values, **SETTINGS, **more}.items() for a in ("--set", f"{k}={v}")]]


def child_env() -> dict[str, str]:
    """This test's environment (the store's AWS_* settings included), one OpenMP thread."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def listing(bucket: str, prefix: str) -> dict[str, tuple[str, float, int]]:
    """Every object under ``prefix``: key (relative) -> (ETag, LastModified, size)."""
    client = s3_client(locate(f"s3://{bucket}"))
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
    return {
        o["Key"][len(prefix) + 1 :]: (o["ETag"], o["LastModified"].timestamp(), o["Size"])
        for page in pages
        for o in page.get("Contents", [])
    }


def contents(bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix``: key (relative) -> its bytes."""
    client = s3_client(locate(f"s3://{bucket}"))
    return {
        key: client.get_object(Bucket=bucket, Key=f"{prefix}/{key}")["Body"].read() for key in listing(bucket, prefix)
    }


def next_second(objects: dict[str, tuple[str, float, int]]) -> None:
    """Wait until LastModified (whole seconds) of an object written now would differ from every one listed."""
    newest = max(modified for _, modified, _ in objects.values())
    time.sleep(max(0.0, min(newest + 1.05 - time.time(), 2.0)))


def check_published(bucket: str, prefix: str) -> dict[str, bytes]:
    """The published dataset holds every valid pair_id once (0 lost, 0 twice) and accounts for every input line;
    its manifest names exactly the part files, with their row counts; returns the objects."""
    objects = contents(bucket, prefix)
    manifest = json.loads(objects["_manifest.json"])
    assert sorted(manifest["files"]) == sorted(set(objects) - {"_manifest.json", "_claim.json"})
    tables = {key: pq.read_table(pa.BufferReader(data)) for key, data in objects.items() if key.endswith(".parquet")}
    scored = Counter(p for key, t in tables.items() if key.startswith("scores/") for p in t["pair_id"].to_pylist())
    quarantined = sum(t.num_rows for key, t in tables.items() if key.startswith("quarantine/"))
    assert len(scored) == PAIRS and set(scored.values()) == {1}
    assert sum(scored.values()) + quarantined == LINES
    rows = {"rows_in": LINES, "scored": PAIRS, "quarantined": LINES - PAIRS, "skipped_other_splits": 0}
    assert manifest["rows"] == rows
    return objects


def wait_stopped(child: subprocess.Popen) -> None:
    """Block until ``child`` has frozen itself (SIGSTOP), failing with its stderr if it ended instead."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        pid, status = os.waitpid(child.pid, os.WNOHANG | os.WUNTRACED)
        if pid and os.WIFSTOPPED(status):
            return
        if pid:  # it ended: Popen must not wait for it again
            child.returncode = os.waitstatus_to_exitcode(status)
            pytest.fail(f"the worker ended ({child.returncode}) before freezing")
        time.sleep(0.05)
    child.kill()
    pytest.fail(f"the worker did not freeze in {WAIT} s")


def test_a_run_killed_mid_shard_then_rerun_publishes_what_an_uninterrupted_run_does(work, s3_env, tmp_path):
    assert main(score_args(work, tmp_path / "reference", f"s3://{s3_env}/reference")) == 0
    run, log = tmp_path / "run", tmp_path / "kill.log"
    # SIGKILL right after the second chunk's table is in place, before its marker: one chunk committed
    at = STEPS_PER_CHUNK + 2
    args = score_args(work, run, f"s3://{s3_env}/scores")
    killed = subprocess.run(
        [sys.executable, str(FAULT_CHILD), "kill", "chunk commit", str(at), str(log), "--", *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "FAULT\tkill\tchunk commit" in log.read_text()
    assert len(list((run / "work").glob("*/*.done"))) == 1 and not list(run.glob("shards/*.json"))  # mid-shard
    assert listing(s3_env, "scores") == {}  # nothing published by an unfinished run

    assert main(args) == 0  # the rerun resumes at the second chunk
    published, reference = check_published(s3_env, "scores"), check_published(s3_env, "reference")
    assert published == reference  # the same keys, byte for byte, the manifest included
    assert len(published) == 2 * SETTINGS["num_shards"] + 3  # per shard 2, bad lines, claim, manifest


@pytest.mark.parametrize("frozen_in", ["shard", "publish"])
def test_a_frozen_worker_whose_lease_was_taken_over_changes_no_published_object(frozen_in, work, s3_env, tmp_path):
    """``shard``: frozen holding shard 0's lease after its first chunk commit; ``publish``: frozen holding the merge
    lease after its first published object. Another worker waits the lease out, takes over, finishes and publishes;
    then the frozen one wakes."""
    out, publish = tmp_path / "run", f"s3://{s3_env}/scores"
    args = score_args(work, out, publish, lease_seconds=LEASE_SECONDS)
    stderr = (tmp_path / "frozen.err").open("w")
    frozen = subprocess.Popen([sys.executable, "-c", FROZEN_CHILD, frozen_in, *args], env=child_env(), stderr=stderr)
    try:
        wait_stopped(frozen)
        assert len(listing(s3_env, "scores")) == (1 if frozen_in == "publish" else 0)
        assert main(args) == 0  # the successor: waits out the frozen lease, takes over, finishes, publishes
        before = listing(s3_env, "scores")
        published = check_published(s3_env, "scores")
        next_second(before)
    finally:
        frozen.send_signal(signal.SIGCONT)
    frozen.wait(timeout=WAIT)
    stderr.close()
    said = (tmp_path / "frozen.err").read_text()
    if frozen_in == "shard":  # fenced: its lease is lost, it commits nothing more
        assert frozen.returncode == 1 and "shard-00000: this worker's lease was taken over" in said, said[-3000:]
    else:  # past its last fence: each conditional PUT answers 412 and the bytes there are its own
        assert frozen.returncode == 0 and "merge: lease lost" in said, said[-3000:]
    assert listing(s3_env, "scores") == before  # no object rewritten (ETag, LastModified), none added
    assert contents(s3_env, "scores") == published


def test_a_retry_of_a_finished_run_writes_nothing_and_exits_0(work, s3_env, tmp_path):
    args = score_args(work, tmp_path / "run", f"s3://{s3_env}/scores")
    assert main(args) == 0
    before = listing(s3_env, "scores")
    published = check_published(s3_env, "scores")
    next_second(before)
    assert main(args) == 0  # an Airflow retry of the same task
    assert listing(s3_env, "scores") == before
    assert contents(s3_env, "scores") == published


def test_another_result_published_to_the_same_prefix_is_refused_and_changes_nothing(work, s3_env, tmp_path, capsys):
    publish = f"s3://{s3_env}/scores"
    assert main(score_args(work, tmp_path / "a", publish)) == 0
    before = listing(s3_env, "scores")
    published = check_published(s3_env, "scores")
    next_second(before)
    capsys.readouterr()
    assert main(score_args(work, tmp_path / "b", publish, model="model-b")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and f"{publish} holds another result (scores/" in errors[0], errors
    assert listing(s3_env, "scores") == before
    assert contents(s3_env, "scores") == published
