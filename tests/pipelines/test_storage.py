"""Data where teams keep it (pipelines/storage.py): local paths and URIs through one seam, a folder as a dataset
with hive partitions, exactly-once publishing; the S3 tests run against the real SeaweedFS server the tests start
(the s3_store / s3_env fixtures, tests/conftest.py)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake.contracts import read_pairs
from pipelines.cli import main
from pipelines.storage import CLAIM, StorageError, create_exclusive, kept, locate, parts, publish

SECRET = "hunter2-not-for-logs"


def write_csv(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["search_term", "product_title", "relevance"])
        writer.writerows(rows)


def day_rows(day: int, count: int = 40) -> list[list[str]]:
    """Rows of one day: distinct queries, gold 1.0-3.0 rater means."""
    return [[f"query {day}-{i // 2}", f"product {day}-{i}", f"{1 + (i % 5) * 0.5:.1f}"] for i in range(count)]


def three_days(folder):
    for day in (1, 2, 3):
        write_csv(folder / f"dt=2026-12-0{day}" / "part-0.csv", day_rows(day))


def import_args(source: str, out: str, *more: str) -> list[str]:
    return [
        "data",
        "import",
        *("--set", f"input.path={source}"),
        *("--set", "input.columns={query: search_term, ad_title: product_title, gold_grade: relevance}"),
        *("--set", "input.grade_bins=[1.5, 2.0, 2.5]"),
        *("--set", f"out_dir={out}"),
        *more,
    ]


def test_a_uri_with_credentials_is_refused_without_echoing_them():
    for uri in (f"s3://key:{SECRET}@bucket/x", f"s3://bucket/x?secret_key={SECRET}"):
        with pytest.raises(StorageError, match="carries credentials") as caught:
            locate(uri)
        assert SECRET not in str(caught.value)


def test_a_local_folder_is_a_dataset_of_its_parts_with_hive_partitions(tmp_path):
    three_days(tmp_path / "pairs")
    (tmp_path / "pairs" / "_SUCCESS").write_text("")
    (tmp_path / "pairs" / "dt=2026-12-02" / ".part-1.csv.tmp").write_text("half")
    found = parts(locate(tmp_path / "pairs"))
    assert [p.partition for p in found] == [{"dt": f"2026-12-0{d}"} for d in (1, 2, 3)]
    kept_days = parts(locate(tmp_path / "pairs"), {"dt": "2026-12-02..2026-12-03"})
    assert [p.partition["dt"] for p in kept_days] == ["2026-12-02", "2026-12-03"]
    assert kept({"dt": "2026-12-01"}, {"dt": "2026-12-01,2026-12-03"})
    assert not kept({"dt": "2026-12-02"}, {"dt": "2026-12-01,2026-12-03"})
    assert not kept({}, {"dt": "2026-12-01"})
    with pytest.raises(StorageError, match=r"holds no data file in partitions \{'dt': '2027-01-01'\} \(3 in all\)"):
        parts(locate(tmp_path / "pairs"), {"dt": "2027-01-01"})


def test_a_partitioned_local_dataset_imports_with_rows_accounted_per_part(tmp_path):
    three_days(tmp_path / "pairs")
    write_csv(tmp_path / "pairs" / "dt=2026-12-02" / "part-1.csv", [["a query", "", "2.0"], ["q", "t", "x"]])
    days = "input.partitions={dt: 2026-12-01..2026-12-02}"
    assert main(import_args(str(tmp_path / "pairs"), str(tmp_path / "out"), "--set", days)) == 0
    summary = json.loads((tmp_path / "out" / "data_summary.json").read_text())
    rows = summary["rows"]
    assert rows["in"] == 82 == rows["pairs"] + rows["quarantined"] + rows["filtered"]  # two days of 40, 2 bad rows
    assert summary["rows_per_file"] == {
        "input:dt=2026-12-01/part-0.csv": {"in": 40, "quarantined": 0, "kept": 40},
        "input:dt=2026-12-02/part-0.csv": {"in": 40, "quarantined": 0, "kept": 40},
        "input:dt=2026-12-02/part-1.csv": {"in": 2, "quarantined": 2, "kept": 0},
    }
    quarantine = pq.read_table(tmp_path / "out" / "quarantine.parquet").to_pylist()
    assert [q["row_number"] for q in quarantine] == [80, 81]  # numbered across the parts
    assert all(q["detail"].startswith("dt=2026-12-02/part-1.csv: ") for q in quarantine), quarantine


def test_local_publish_is_exactly_once_and_refuses_another_result(tmp_path):
    run = tmp_path / "run"
    (run / "labels").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2, 3]}), run / "labels" / "00000.parquet")
    dest = locate(tmp_path / "published")
    publish(run, ["labels/00000.parquet"], dest, {"rows": {"labels": 3}})
    publish(run, ["labels/00000.parquet"], dest, {"rows": {"labels": 3}})  # a retry: nothing written twice
    manifest = json.loads((tmp_path / "published" / "_manifest.json").read_text())
    assert manifest["rows"] == {"labels": 3} and list(manifest["files"]) == ["labels/00000.parquet"]
    pq.write_table(pa.table({"x": [9]}), run / "labels" / "00000.parquet")
    with pytest.raises(StorageError, match="holds another result"):
        publish(run, ["labels/00000.parquet"], dest, {"rows": {"labels": 1}})
    # another result's parts have other names (named by content): refused before any is written
    pq.write_table(pa.table({"x": [9]}), run / "labels" / "00000-other.parquet")
    with pytest.raises(StorageError, match=r"holds another result \(labels/00000.parquet\)"):
        publish(run, ["labels/00000-other.parquet"], dest, {"rows": {"labels": 1}})
    assert not (tmp_path / "published" / "labels" / "00000-other.parquet").exists()


def test_of_two_results_published_at_once_the_first_claim_wins_and_the_other_writes_nothing(tmp_path):
    """Both pass the check for other objects (the prefix is empty for each); the other's claim came first."""
    run, dest = tmp_path / "run", locate(tmp_path / "published")
    (run / "labels").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2, 3]}), run / "labels" / "00000.parquet")
    create_exclusive(dest.child(CLAIM), b'{"files": {"labels/00000-theirs.parquet": "..."}}\n')
    with pytest.raises(StorageError, match=r"_claim.json holds another result"):
        publish(run, ["labels/00000.parquet"], dest, {"rows": {"labels": 3}})
    assert sorted(p.name for p in (tmp_path / "published").rglob("*")) == [CLAIM]


# --- against the real S3-compatible server -----------------------------------------------------------------


def upload_folder(folder, bucket: str, prefix: str) -> str:
    fs = locate(f"s3://{bucket}").filesystem
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with fs.open_output_stream(f"{bucket}/{prefix}/{path.relative_to(folder)}") as out:
            out.write(path.read_bytes())
    return f"s3://{bucket}/{prefix}/"


def test_data_import_reads_a_partitioned_s3_dataset_and_writes_the_pairs_to_the_bucket(s3_env, tmp_path, capsys):
    three_days(tmp_path / "export")
    source = upload_folder(tmp_path / "export", s3_env, "pairs")
    out = f"s3://{s3_env}/imported"
    assert main(import_args(source, out, "--set", "input.partitions={dt: '2026-12-01,2026-12-03'}")) == 0
    pairs = read_pairs(f"{out}/pairs.parquet")
    summary = json.loads(locate(f"{out}/data_summary.json").read_bytes())
    assert summary["rows"]["in"] == 80 and pairs.num_rows == summary["rows"]["pairs"] > 0
    assert not any(title.startswith("product 2-") for title in pairs["ad_title"].to_pylist())  # 2026-12-02 kept out
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in capsys.readouterr().out


@pytest.mark.parametrize("problem", ["missing bucket", "unknown key", "wrong secret", "denied"])
def test_s3_refusals_are_one_line_without_a_secret(problem, s3_store, s3_env, tmp_path, monkeypatch, capsys):
    three_days(tmp_path / "export")
    source = upload_folder(tmp_path / "export", s3_env, "pairs")
    out = f"s3://{s3_env}/imported"
    if problem == "missing bucket":
        source, expected = "s3://no-such-bucket-here/pairs/", "the bucket 'no-such-bucket-here' does not exist"
    elif problem == "unknown key":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANOSUCHKEY0000000")
        expected = "the store does not know this access key; check AWS_ACCESS_KEY_ID"
    elif problem == "wrong secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        expected = "refused the secret key; check AWS_SECRET_ACCESS_KEY"
    else:  # the reader identity may read the input, not write the pairs
        for key, value in s3_store.env("reader").items():
            monkeypatch.setenv(key, value)
        expected = "access denied"
    assert main(import_args(source, out)) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and expected in lines[0], err
    assert SECRET not in err and os.environ["AWS_SECRET_ACCESS_KEY"] not in err and "Traceback" not in err


def test_create_exclusive_on_s3_answers_once(s3_env):
    marker = locate(f"s3://{s3_env}/commits/00000.done")
    create_exclusive(marker, b"first")
    with pytest.raises(FileExistsError):
        create_exclusive(marker, b"second")
    assert marker.read_bytes() == b"first"


PUBLISH_CHILD = """
import sys, time
from pathlib import Path
import pipelines.storage as storage
real = storage.create_exclusive
def slow(location, data):
    real(location, data)
    time.sleep(0.5)  # time for the parent's SIGKILL between two objects
storage.create_exclusive = slow
storage.publish(Path(sys.argv[1]), sys.argv[3:], storage.locate(sys.argv[2]), {"rows": {"labels": 30}})
"""


def test_an_s3_publish_killed_midway_completes_on_rerun_byte_identical(s3_env, tmp_path):
    run = tmp_path / "run"
    names = [f"labels/{k:05d}.parquet" for k in range(3)]
    for k, name in enumerate(names):
        (run / "labels").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"pair_id": [f"p{k}-{i}" for i in range(10)]}), run / name)
    dest = f"s3://{s3_env}/labels-v1"
    child = subprocess.Popen([sys.executable, "-c", PUBLISH_CHILD, str(run), dest, *names], env=os.environ.copy())
    fs = locate(dest).filesystem
    import time

    deadline = time.monotonic() + 60
    while not fs.get_file_info(f"{s3_env}/labels-v1/{names[0]}").is_file and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not locate(f"{dest}/_manifest.json").exists()  # killed before its manifest: not published yet
    publish(run, names, locate(dest), {"rows": {"labels": 30}})  # the rerun
    publish(run, names, locate(dest), {"rows": {"labels": 30}})  # a retry of the finished publish
    for name in names:
        assert locate(f"{dest}/{name}").read_bytes() == (run / name).read_bytes()
    manifest = json.loads(locate(f"{dest}/_manifest.json").read_bytes())
    assert sorted(manifest["files"]) == names
    listed = [i.path for i in fs.get_file_info(pafs_selector(f"{s3_env}/labels-v1")) if i.is_file]
    assert len(listed) == len(names) + 2  # each part once, the claim and the manifest
    table = pq.read_table(f"{s3_env}/labels-v1/labels", filesystem=fs)
    assert table.num_rows == 30 and len(set(table["pair_id"].to_pylist())) == 30  # 0 lost, 0 duplicated


def pafs_selector(path: str):
    import pyarrow.fs as pafs

    return pafs.FileSelector(path, recursive=True)
