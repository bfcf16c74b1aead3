"""The label cache (pipelines.ads.annotation.label_cache): a second run over last run's pairs plus 10 % new ones
labels only the new pairs and writes the labels a cache-less run writes; another teacher, prompt or voting setting
reads another folder and misses; a run stopped mid-shard or mid-publication, or SIGKILLed mid-shard, leaves no
cache entry of its own, and its rerun counts every chunk once; the pipeline keeps the cache beside its runs."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.annotation import label_cache
from pipelines.ads.annotation.annotate import AnnotateConfig, ShardLabeler, partition_input
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.annotation.label_cache import content_key, shard_keys
from pipelines.ads.annotation.shards import shard_input
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.pipeline_config import AdsPipelineConfig, annotate_config
from pipelines.ads.teacher.labeling import PairLabeler
from pipelines.config import ConfigError, load_config

SETTINGS = {"num_shards": 2, "chunk_pairs": 8, "voting.votes": 2, "voting.max_new_tokens": 16, "gold": "null"}
SETTINGS |= {"threads": 1, "input.split": "null"}
NEW_PAIRS = 6  # 10 % of the 60 unlabeled pairs


def test_the_key_is_the_text_the_prompt_reads_and_nothing_else():
    pair = {"pair_id": "a", "query": "red shoes", "ad_title": "Red running shoes", "gold_grade": 3}
    assert content_key(pair) == content_key({**pair, "pair_id": "b", "gold_grade": None})
    assert content_key(pair) == content_key({**pair, "query": "red\x00shoes"})  # the prompt shows a space
    assert content_key(pair) != content_key({**pair, "query": "Red shoes"})  # case is the teacher's to read
    assert content_key(pair) != content_key({**pair, "ad_title": "Red running shoe"})
    assert content_key(pair) != content_key({"query": "red shoes\x00Red", "ad_title": "running shoes"})


def test_the_pipeline_keeps_its_cache_beside_the_run_folders_and_owns_where(tmp_path):
    annotate = annotate_config(AdsPipelineConfig(out_dir=str(tmp_path / "runs"), run_id="week-2"))
    assert annotate.cache and annotate.cache_dir == str(tmp_path / "runs" / "label_cache")
    with pytest.raises(ConfigError, match=r"annotate\.cache_dir is set by the pipeline"):
        load_config(AdsPipelineConfig, [], ["annotate.cache_dir=elsewhere"])
    assert not annotate_config(load_config(AdsPipelineConfig, [], ["annotate.cache=false"])).cache


def config(teacher, input_path, out, cache_dir: Path, **extra) -> AnnotateConfig:
    values = {"teacher": teacher, "input.path": input_path, "out_dir": out, "cache_dir": cache_dir, **SETTINGS, **extra}
    return load_config(AnnotateConfig, [], [f"{k}={v}" for k, v in values.items()])


def rows(out: Path, folder: str) -> list[dict]:
    found = [r for p in sorted((out / folder).glob("shard-*.parquet")) for r in pq.read_table(p).to_pylist()]
    return sorted(found, key=lambda r: r["pair_id"])


def cache_parts(cache: Path) -> list[Path]:
    return sorted(cache.rglob("part-*.parquet"))


@pytest.fixture(scope="module")
def weeks(small_teacher, tmp_path_factory):
    """Week 1's pairs, and week 2's: the same plus 10 % new pairs (texts no week-1 pair has)."""
    pairs = small_teacher[1]
    old = read_pairs(pairs, split="unlabeled")
    new = [
        {**row, "pair_id": f"new-{i}", "query": f"{row['query']} deluxe {i}"}
        for i, row in enumerate(old.slice(0, NEW_PAIRS).to_pylist())
    ]
    folder = tmp_path_factory.mktemp("weeks")
    pq.write_table(old, folder / "week1.parquet")
    pq.write_table(pa.concat_tables([old, pa.Table.from_pylist(new, schema=old.schema)]), folder / "week2.parquet")
    return folder / "week1.parquet", folder / "week2.parquet"


@pytest.fixture(scope="module")
def week1(small_teacher, weeks, tmp_path_factory):
    """Week 1 labelled into an empty cache: (its summary, the cache folder)."""
    folder = tmp_path_factory.mktemp("week1")
    paths = annotate(config(small_teacher[2], weeks[0], folder / "run", folder / "cache"))
    return json.loads(paths["summary"].read_text()), folder / "cache"


@pytest.mark.integration
def test_week_two_labels_only_its_new_pairs_and_writes_a_cacheless_runs_labels(small_teacher, weeks, week1, tmp_path):
    first, cache = week1
    assert (first["cache_hits"], first["cache_misses"]) == (0, first["distinct_pairs"])
    parts = cache_parts(cache)
    assert len(parts) == 2 and sum(pq.read_metadata(p).num_rows for p in parts) == first["distinct_pairs"]
    graded = []
    with pytest.MonkeyPatch.context() as patch:
        label = PairLabeler.label
        patch.setattr(PairLabeler, "label", lambda self, pairs: graded.extend(pairs) or label(self, pairs))
        second = annotate(config(small_teacher[2], weeks[1], tmp_path / "cached", cache))
    summary = json.loads(second["summary"].read_text())
    assert (summary["cache_hits"], summary["cache_misses"]) == (first["distinct_pairs"], NEW_PAIRS)
    assert sorted(p["pair_id"] for p in graded) == [f"new-{i}" for i in range(NEW_PAIRS)]
    report = json.loads(second["report"].read_text())
    assert report["counts"]["cache_hits"] == first["distinct_pairs"]
    assert summary["labels"] + summary["quarantined"] + summary["skipped_other_splits"] == summary["rows_in"]
    plain = annotate(config(small_teacher[2], weeks[1], tmp_path / "plain", cache, cache="false"))
    assert json.loads(plain["summary"].read_text())["cache_hits"] == 0
    for folder in ("labels", "review"):
        assert rows(tmp_path / "cached", folder) == rows(tmp_path / "plain", folder)
    assert len(cache_parts(cache)) == 4  # the new pairs' entries joined the cache; the cache-less run wrote none


@pytest.mark.integration
def test_another_teacher_prompt_or_voting_setting_gets_no_hit(small_teacher, weeks, week1, tmp_path):
    _, cache = week1
    teacher = Path(small_teacher[2])
    changed = tmp_path / "teacher"
    shutil.copytree(teacher, changed)
    (changed / "README.md").write_text("retrained\n")  # any file of the teacher's folder is in its digest
    same = ShardLabeler(config(teacher, weeks[0], tmp_path / "same", cache))
    partition_input(same.config)
    keys = shard_keys(shard_input(same.out, 0))
    assert len(same.cache.lookup(keys)) == len(keys)
    others = {
        "teacher": config(changed, weeks[0], tmp_path / "a", cache),
        "prompt": config(teacher, weeks[0], tmp_path / "b", cache, prompt_version="relevance-instruct-v1"),
        "votes": config(teacher, weeks[0], tmp_path / "c", cache, **{"voting.votes": 3}),
    }
    for what, other in others.items():
        labeler = ShardLabeler(other)
        assert labeler.cache.location != same.cache.location, what
        assert labeler.cache.lookup(keys) == {}, what
    summary = json.loads(annotate(others["teacher"])["summary"].read_text())
    assert summary["cache_hits"] == 0 and summary["cache_misses"] == summary["distinct_pairs"]


@pytest.mark.integration
def test_a_run_stopped_mid_shard_or_mid_publication_leaves_no_entry_and_counts_each_chunk_once(
    small_teacher, weeks, week1, labeling_dies_on_call, tmp_path
):
    first, _ = week1
    teacher, cache = small_teacher[2], tmp_path / "cache"
    one_shard = {"num_shards": 1}
    with labeling_dies_on_call(3), pytest.raises(KeyboardInterrupt):
        annotate(config(teacher, weeks[0], tmp_path / "run", cache, **one_shard))
    assert len(list((tmp_path / "run" / "work" / "00000").glob("chunk-*.done"))) == 2
    assert not cache.exists()  # committed chunks hold their entries; the cache gets them with the shard

    uploads, upload = [], label_cache.upload

    def dies_on_the_part(source, location):
        uploads.append(location.path)
        if Path(location.path).name.startswith("part-"):
            raise KeyboardInterrupt
        upload(source, location)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(label_cache, "upload", dies_on_the_part)
        with pytest.raises(KeyboardInterrupt):
            annotate(config(teacher, weeks[0], tmp_path / "run", cache, **one_shard))
    assert not [p for p in cache.rglob("*") if p.is_file()] and not (tmp_path / "run" / "shards").exists()

    paths = annotate(config(teacher, weeks[0], tmp_path / "run", cache, **one_shard))
    summary = json.loads(paths["summary"].read_text())
    assert (summary["cache_hits"], summary["cache_misses"]) == (0, first["distinct_pairs"])
    assert summary["labels"] + summary["quarantined"] + summary["skipped_other_splits"] == summary["rows_in"]
    (part,) = cache_parts(cache)
    assert pq.read_metadata(part).num_rows == first["distinct_pairs"]
    assert rows(tmp_path / "run", "labels") == rows(week1[1].parent / "run", "labels")


@pytest.mark.integration
def test_sigkill_mid_shard_leaves_no_cache_entry_and_the_rerun_counts_each_pair_once(
    small_teacher, weeks, week1, sigkilled_after_two_chunks, tmp_path
):
    first, _ = week1
    out, cache = tmp_path / "killed", tmp_path / "cache"
    values = {"teacher": small_teacher[2], "input.path": weeks[0], "out_dir": out, "cache_dir": cache, **SETTINGS}
    sets = [a for k, v in values.items() for a in ("--set", f"{k}={v}")]
    args = [sys.executable, "-m", "pipelines.cli", "annotate", *sets]
    env = sigkilled_after_two_chunks(args, out)
    assert cache_parts(cache) == [] and not (out / "summary.json").exists()
    rerun = subprocess.run(args, env=env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["cache_hits"], summary["cache_misses"]) == (0, first["distinct_pairs"])
    assert summary["labels"] + summary["quarantined"] + summary["skipped_other_splits"] == summary["rows_in"]
    assert sum(pq.read_metadata(p).num_rows for p in cache_parts(cache)) == first["distinct_pairs"]
    assert rows(out, "labels") == rows(week1[1].parent / "run", "labels")
