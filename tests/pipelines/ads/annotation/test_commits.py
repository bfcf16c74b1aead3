"""Commits of annotation work: fingerprints name what differs, a chunk marker is trusted only when its
count, checksums and fingerprint agree, a late writer cannot change a committed shard, and distil reads
only the label files its merge recorded."""

import json
import socket

import pyarrow as pa
import pytest

from durable.fileio import sha256_file
from pipelines.ads.annotation.commits import (
    FingerprintMismatch,
    check_fingerprint,
    commit_chunk,
    committed_chunk,
    publish_shard,
    shard_done,
    start_work,
    verified_outputs,
)
from pipelines.ads.annotation.merge import sweep, verified_labels
from pipelines.ads.intake.contracts import ContractError, write_table
from pipelines.io import remove_temps, temp_path
from pipelines.lease import Lease, LeaseLost

FINGERPRINT = {"teacher_weights": "teacher-abc", "voting.votes": 4, "chunk_pairs": 512, "engine_options": {}}


def test_a_fingerprint_mismatch_names_each_differing_key_and_both_values():
    with pytest.raises(FingerprintMismatch, match=r"there -> now: voting\.votes: 4 -> 8\); use the old settings"):
        check_fingerprint(FINGERPRINT, {**FINGERPRINT, "voting.votes": 8}, "shard 2", "use the old settings")
    with pytest.raises(FingerprintMismatch, match="older version"):
        check_fingerprint(None, FINGERPRINT, "shard 2", "fix")
    check_fingerprint(json.loads(json.dumps(FINGERPRINT)), FINGERPRINT, "shard 2", "fix")  # a JSON round trip


def test_work_begun_with_other_settings_is_refused(tmp_path):
    start_work(tmp_path, FINGERPRINT, "fix")
    start_work(tmp_path, FINGERPRINT, "fix")  # the same work resumes
    with pytest.raises(FingerprintMismatch, match="chunk_pairs: 512 -> 256"):
        start_work(tmp_path, {**FINGERPRINT, "chunk_pairs": 256}, "fix")


def chunk_tables(pairs: int) -> dict[str, pa.Table]:
    ids = [f"p{i}" for i in range(pairs)]
    return {"labels.parquet": pa.table({"pair_id": ids}), "review.parquet": pa.table({"pair_id": ids[:1]})}


def test_a_chunk_marker_is_trusted_only_when_count_checksums_and_fingerprint_agree(tmp_path):
    assert not committed_chunk(tmp_path, 0, 3, FINGERPRINT)
    commit_chunk(tmp_path, 0, chunk_tables(3), FINGERPRINT)
    assert committed_chunk(tmp_path, 0, 3, FINGERPRINT)
    with pytest.raises(ContractError, match=r"counts 3 pairs but its chunk has 4; delete .*chunk-000000\.done"):
        committed_chunk(tmp_path, 0, 4, FINGERPRINT)
    with pytest.raises(FingerprintMismatch, match="other settings"):
        committed_chunk(tmp_path, 0, 3, {**FINGERPRINT, "voting.votes": 2})
    write_table(pa.table({"pair_id": ["p0", "p1", "x"]}), tmp_path / "chunk-000000.labels.parquet")
    with pytest.raises(ContractError, match=r"chunk-000000\.labels\.parquet changed after it was committed"):
        committed_chunk(tmp_path, 0, 3, FINGERPRINT)


def merged_run(tmp_path):
    labels = tmp_path / "labels"
    files = {}
    for shard in range(2):
        path = write_table(pa.table({"pair_id": [f"p{shard}"]}), labels / f"shard-0000{shard}.parquet")
        files[f"labels/{path.name}"] = sha256_file(path)
    (tmp_path / "summary.json").write_text(json.dumps({"files": files}))
    return labels


def test_distil_reads_only_label_files_whose_merge_checksums_hold(tmp_path):
    labels = merged_run(tmp_path)
    assert [p.name for p in verified_labels(labels)] == ["shard-00000.parquet", "shard-00001.parquet"]
    write_table(pa.table({"pair_id": ["stray"]}), labels / "shard-00001-0123456789abcdef.parquet")
    assert len(verified_labels(labels)) == 2  # a file the merge did not record is never read
    (labels / "shard-00000.parquet").unlink()
    with pytest.raises(ContractError, match=r"missing: \['shard-00000.parquet'\]"):
        verified_labels(labels)
    merged_run(tmp_path)
    write_table(pa.table({"pair_id": ["changed"]}), labels / "shard-00001.parquet")
    with pytest.raises(ContractError, match=r"shard-00001\.parquet changed after its annotation run was merged"):
        verified_labels(labels)
    (tmp_path / "summary.json").unlink()
    with pytest.raises(ContractError, match="has no merge summary"):
        verified_labels(labels)


def test_temp_names_are_unique_per_writer_and_host_and_removable_by_target(tmp_path):
    target = tmp_path / "shard-00001.parquet"
    first, second = temp_path(target), temp_path(target)
    assert first != second and socket.gethostname() in first.name and first.name.startswith(".shard-00001.parquet.")
    first.write_text("left by a killed writer")
    (tmp_path / "keep.txt").write_text("not a temp file")
    assert remove_temps(tmp_path, "shard-00000.parquet") == 0  # another target's temps only
    assert remove_temps(tmp_path, target.name) == 1 and not first.exists() and (tmp_path / "keep.txt").exists()


class FencePassed:
    """A worker frozen right after its lease's fence passed: its ``check()`` has nothing more to say."""

    def check(self) -> None:
        pass


def publish_labels(out, pair_ids, lease):
    (out / "work" / "00000").mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("pair_id", pa.string())])
    sources = {"labels": ([pa.table({"pair_id": pair_ids}, schema=schema)], schema)}
    return publish_shard(out, 0, sources, {"rows_in": len(pair_ids)}, ("labels",), lease)


def test_a_fenced_out_writer_waking_mid_publish_cannot_change_what_the_manifest_describes(tmp_path):
    winner = Lease(tmp_path / "leases", "shard-00000", seconds=30)
    assert winner.acquire(done=lambda: False)
    manifest = publish_labels(tmp_path, ["a", "b"], winner)
    winner.release()
    with pytest.raises(LeaseLost, match="another worker committed it first; its manifest stands"):
        publish_labels(tmp_path, ["a", "c"], FencePassed())  # other labels: a frozen holder's, say
    assert shard_done(tmp_path, 0) == manifest
    verified_outputs(tmp_path, [manifest], ("labels",))  # the manifest's files are untouched
    assert len(list((tmp_path / "labels").glob("shard-*.parquet"))) == 2  # the late writer's, beside them
    sweep(tmp_path, ("labels",), [manifest])
    assert [p.name for p in (tmp_path / "labels").iterdir()] == [manifest["labels"]["file"]]
    with pytest.raises(LeaseLost):  # the same labels again: the same name, the same bytes, still refused
        publish_labels(tmp_path, ["a", "b"], FencePassed())
    verified_outputs(tmp_path, [manifest], ("labels",))
