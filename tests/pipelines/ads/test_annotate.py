"""Annotation end to end with a small SFT teacher: every row accounted for, shards by several workers equal
one process, a SIGKILL mid-shard resumes with no lost or duplicated pair, and labels are identical; score
mode the same with exact grade distributions."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.annotation.commits import FingerprintMismatch
from pipelines.ads.distillation.distil import DistilConfig, training_rows
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.teacher.labeling import PairLabeler
from pipelines.config import load_config
from pipelines.lease import decode_record
from student.batches import label_probs

pytestmark = pytest.mark.integration
# one thread: a run compared to the bit with another must sum in the same order; the default thread count follows
# the machine's load (the other pytest worker), and 2 threads instead of 1 moved 2 of 60 probabilities by 1.7e-9
SETTINGS = {
    "num_shards": 4,
    "chunk_pairs": 12,
    "voting.votes": 3,
    "voting.max_new_tokens": 16,
    "gold": "null",
    "threads": 1,
}


def sets(teacher, input_path, out, **extra):
    values = {"teacher": teacher, "input.path": input_path, "input.split": "null", "out_dir": out, **SETTINGS, **extra}
    return [f"{k}={v}" for k, v in values.items()]


def labels_of(out: Path) -> list[dict]:
    rows = [r for p in sorted((out / "labels").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted(rows, key=lambda r: r["pair_id"])


@pytest.fixture(scope="module")
def single(small_teacher, input_file, tmp_path_factory):
    _, _, teacher = small_teacher
    out = tmp_path_factory.mktemp("single")
    paths = annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], out)))
    return out, paths


def test_every_row_is_labeled_or_quarantined_once(single, input_file):
    out, paths = single
    _, pairs, lines = input_file
    summary = json.loads(paths["summary"].read_text())
    assert summary["rows_in"] == lines and summary["prompt_version"] == "relevance-v1"  # from the shard manifests
    assert summary["labels"] == pairs and summary["quarantined"] == 7 and summary["skipped_other_splits"] == 0
    labels = labels_of(out)
    assert len({r["pair_id"] for r in labels}) == len(labels) == pairs
    reasons = sorted(r["reason"] for p in (out / "quarantine").glob("*.parquet") for r in pq.read_table(p).to_pylist())
    assert reasons == ["duplicate_pair_id"] * 3 + ["empty_text", "malformed_record", "missing_field", "unknown_grade"]
    for label in labels:
        assert sum(label["votes"]) <= 3 and label["prompt_version"] == "relevance-v1"
        assert label["teacher_run_id"].startswith("teacher-")
        top = max(label["votes"])
        assert label["confidence"] == pytest.approx(top / 3)
        assert (label["grade"] is None) == (top == 0)
    review = [r for p in (out / "review").glob("*.parquet") for r in pq.read_table(p).to_pylist()]
    assert len(review) == summary["review_queue"] > 0
    assert all(r["confidence"] < 0.75 or r["abstained"] for r in review)
    report = json.loads(paths["report"].read_text())
    assert report["throughput"]["pairs_per_s"] > 0 and paths["plot"].stat().st_size > 0
    assert not (out / "work").exists() or not any((out / "work").iterdir())


def test_rerun_is_a_no_op_with_the_same_labels(single, small_teacher, input_file, monkeypatch):
    out, _ = single
    before = labels_of(out)
    files = {p: p.stat().st_mtime_ns for d in ("labels", "review", "shards") for p in (out / d).iterdir()}
    calls = []
    monkeypatch.setattr(PairLabeler, "label", lambda self, pairs: calls.append(pairs))
    annotate(load_config(AnnotateConfig, [], sets(small_teacher[2], input_file[0], out)))
    assert calls == []  # no chunk labelled again
    assert {p: p.stat().st_mtime_ns for p in files} == files and labels_of(out) == before  # no file rewritten


def test_a_rerun_or_resume_with_other_settings_is_refused_naming_the_setting(
    single, small_teacher, input_file, labeling_dies_on_call, tmp_path
):
    teacher = small_teacher[2]
    with pytest.raises(FingerprintMismatch, match=r"shard 0 .*voting\.votes: 3 -> 2"):
        annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], single[0], **{"voting.votes": 2})))
    crashed = tmp_path / "crashed"
    with labeling_dies_on_call(2), pytest.raises(KeyboardInterrupt):
        annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], crashed)))
    with pytest.raises(FingerprintMismatch, match=r"work/00000 .*chunk_pairs: 12 -> 5"):
        annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], crashed, chunk_pairs=5)))
    annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], crashed)))  # the same settings resume
    assert labels_of(crashed) == labels_of(single[0])


def cli(args):
    return [sys.executable, "-m", "pipelines.cli", "annotate", *[a for s in args for a in ("--set", s)]]


def test_two_workers_give_the_single_process_labels(single, small_teacher, input_file, tmp_path):
    teacher, out = small_teacher[2], tmp_path / "workers"
    # two workers on two cores: one thread each, or torch's spinning threads slow both many times over
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    workers = [
        subprocess.Popen(
            cli(sets(teacher, input_file[0], out, shards=s)),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for s in ("[0,2]", "[1,3]")
    ]
    for worker in workers:
        assert worker.wait(timeout=600) == 0, worker.stderr.read()[-2000:]
    merged = subprocess.run(cli(sets(teacher, input_file[0], out)), env=env, capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert labels_of(out) == labels_of(single[0])


def test_sigkill_mid_shard_then_rerun_loses_and_duplicates_nothing(
    single, small_teacher, input_file, sigkilled_after_two_chunks, tmp_path
):
    teacher, out = small_teacher[2], tmp_path / "killed"
    env = sigkilled_after_two_chunks(cli(sets(teacher, input_file[0], out)), out)
    assert not (out / "summary.json").exists()
    rerun = subprocess.run(cli(sets(teacher, input_file[0], out)), env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert labels_of(out) == labels_of(single[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["labels"] + summary["quarantined"] == summary["rows_in"]


def shard_file(out: Path, kind: str = "labels") -> bytes:
    """The bytes of shard 0's ``kind`` file, as its manifest names it."""
    return (out / kind / json.loads((out / "shards" / "00000.json").read_text())[kind]["file"]).read_bytes()


def start_and_stop_mid_shard(args: list[str], out: Path, env: dict) -> subprocess.Popen:
    """A worker on shard 0, frozen (SIGSTOP) once its first chunk is committed."""
    worker = subprocess.Popen(cli(args), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(out.glob("work/00000/chunk-000000.done")) and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.poll() is None, "the worker ended before its first chunk was seen"
    worker.send_signal(signal.SIGSTOP)
    return worker


def test_two_processes_on_one_shard_leave_one_complete_result(single, small_teacher, input_file, tmp_path):
    """A stuck try and its retry (or overlapping ``shards`` lists) on the same shard: the second waits for
    the first's lease instead of labelling beside it, and finds the shard done; the files are the
    single-process run's."""
    teacher, out = small_teacher[2], tmp_path / "twice"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = sets(teacher, input_file[0], out, shards="[0]")
    first = start_and_stop_mid_shard(args, out, env)
    with (tmp_path / "second.err").open("w") as errors:
        second = subprocess.Popen(cli(args), env=env, stdout=subprocess.DEVNULL, stderr=errors)
        deadline = time.monotonic() + 300
        while "shard-00000: held by" not in (tmp_path / "second.err").read_text() and time.monotonic() < deadline:
            assert second.poll() is None, (tmp_path / "second.err").read_text()[-2000:]
            time.sleep(0.05)
        first.send_signal(signal.SIGCONT)  # the first finishes the shard while the second waits
        assert first.wait(timeout=300) == 0, first.stderr.read()[-2000:]
        assert second.wait(timeout=300) == 0, (tmp_path / "second.err").read_text()[-2000:]
    assert shard_file(out) == shard_file(single[0]) and shard_file(out, "review") == shard_file(single[0], "review")
    assert not (out / "work").exists() and not list(out.rglob("*.tmp"))
    [released] = (out / "leases" / "shard-00000").iterdir()  # the lease ends as its tombstone
    assert decode_record(released.read_bytes())["released"]


def test_a_stale_lease_is_taken_over_and_the_stopped_worker_is_fenced_off(single, small_teacher, input_file, tmp_path):
    """A worker frozen mid-shard (a zombie) loses its lease once it expires; the retry takes it over and
    finishes the shard; the zombie, woken, commits nothing and says why."""
    teacher, out = small_teacher[2], tmp_path / "zombie"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = sets(teacher, input_file[0], out, shards="[0]", lease_seconds=2)
    zombie = start_and_stop_mid_shard(args, out, env)
    try:
        retry = subprocess.run(cli(args), env=env, capture_output=True, text=True, timeout=600)
        assert retry.returncode == 0, retry.stderr[-2000:]
        finished = shard_file(out)
    finally:
        zombie.send_signal(signal.SIGCONT)
    _, error = zombie.communicate(timeout=300)
    assert zombie.returncode != 0 and "lease was taken over" in error
    assert shard_file(out) == finished == shard_file(single[0])
    assert not (out / "work").exists() and not list(out.rglob("*.tmp"))


def test_quality_report_agrees_with_the_labels_and_the_gold_file(small_teacher, input_file, tmp_path):
    """The report is accumulated in batches per shard: its counts must equal ones recomputed by hand."""
    work, _, teacher = small_teacher
    gold_path = work / "data" / "unlabeled_gold.parquet"
    paths = annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], tmp_path, gold=gold_path)))
    report = json.loads(paths["report"].read_text())
    labels = labels_of(tmp_path)
    table = pq.read_table(gold_path, columns=["pair_id", "gold_grade"]).to_pydict()
    gold = {p: g for p, g in zip(table["pair_id"], table["gold_grade"], strict=True) if g is not None}
    confusion = [[0] * 4 for _ in range(4)]
    for label in labels:
        if label["pair_id"] in gold and label["grade"] is not None:
            confusion[gold[label["pair_id"]]][label["grade"]] += 1
    assert report["label_distribution"] == {str(g): sum(x["grade"] == g for x in labels) for g in range(4)}
    assert report["abstention_rate"] == pytest.approx(sum(x["grade"] is None for x in labels) / len(labels))
    assert report["gold_agreement"]["confusion_gold_by_label"] == confusion
    assert report["gold_agreement"]["pairs"] == sum(x["pair_id"] in gold for x in labels) > 0


@pytest.fixture(scope="module")
def scored(small_teacher, input_file, tmp_path_factory):
    """Score mode on the same input: the teacher's exact grade distribution per pair."""
    _, _, teacher = small_teacher
    out = tmp_path_factory.mktemp("scored")
    paths = annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], out, **{"voting.mode": "score"})))
    return out, paths


def test_score_mode_labels_hold_the_exact_grade_distribution(scored, single, small_teacher, input_file):
    out, paths = scored
    summary = json.loads(paths["summary"].read_text())
    assert summary["mode"] == "score" and summary["labels"] == input_file[1] and summary["quarantined"] == 7
    labels = labels_of(out)
    assert [x["pair_id"] for x in labels] == [x["pair_id"] for x in labels_of(single[0])]
    for label in labels:
        probs = label["grade_probs"]
        assert len(probs) == 4 and sum(probs) == pytest.approx(1, abs=1e-5)
        assert label["grade"] == probs.index(max(probs)) and label["confidence"] == max(probs)
        assert label["votes"] == [0, 0, 0, 0] and label["parse_failures"] == 0
    review = [r for p in (out / "review").glob("*.parquet") for r in pq.read_table(p).to_pylist()]
    assert sorted(r["pair_id"] for r in review) == sorted(x["pair_id"] for x in labels if x["confidence"] < 0.75)
    report = json.loads(paths["report"].read_text())
    assert report["mode"] == "score" and report["parse_failure_rate"] == 0.0 and report["abstention_rate"] == 0.0
    assert report["mean_confidence"] == pytest.approx(sum(x["confidence"] for x in labels) / len(labels), abs=1e-6)
    assert report["throughput"]["scoring_seconds"] >= 0 and report["throughput"]["pairs_per_s"] > 0
    # the distil stage hands the exact probabilities to the student as its soft targets
    rows = list(
        training_rows(
            DistilConfig(labels=str(out / "labels"), pairs=str(small_teacher[1]), label_source="teacher"),
            read_pairs(small_teacher[1]),
        )
    )
    assert label_probs(rows, 4).tolist() == [pytest.approx(r["grade_probs"]) for r in rows]


def test_score_mode_workers_and_a_resume_after_a_crash_give_identical_labels(
    scored, small_teacher, input_file, labeling_dies_on_call, tmp_path
):
    """Greedy and exact: shards labeled by separate workers, or a run that died mid-shard and was rerun,
    give the single run's labels to the bit (the same chunks and batches); another chunking the same grades."""
    teacher, score = small_teacher[2], {"voting.mode": "score"}
    workers = tmp_path / "workers"
    for shards in ("[1,3]", "[0,2]"):  # the second worker finds every shard done and merges
        annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], workers, shards=shards, **score)))
    assert labels_of(workers) == labels_of(scored[0])

    crashed = load_config(AnnotateConfig, [], sets(teacher, input_file[0], tmp_path / "crashed", **score))
    with labeling_dies_on_call(2), pytest.raises(KeyboardInterrupt):  # shard 0's first chunk commits, not its second
        annotate(crashed)
    assert [p.name for p in (tmp_path / "crashed" / "work").glob("*/*.done")] == ["chunk-000000.done"]
    annotate(crashed)
    assert labels_of(tmp_path / "crashed") == labels_of(scored[0])

    rechunked = tmp_path / "rechunked"
    annotate(load_config(AnnotateConfig, [], sets(teacher, input_file[0], rechunked, chunk_pairs=5, **score)))
    for a, b in zip(labels_of(rechunked), labels_of(scored[0]), strict=True):
        assert a["grade"] == b["grade"] and a["grade_probs"] == pytest.approx(b["grade_probs"], abs=1e-5)
