"""This week's data (pipelines/ads/intake/window.py): a window of a dt= dataset gives the validate step the
window's unlabeled pairs and every gold pair up to its end; a missed week is read by the next run's window."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.intake.contracts import ContractError, pairs_table, write_table
from pipelines.ads.intake.window import PairsWindow, dag_params, dag_window, interval_window, select_pairs
from pipelines.ads.pipeline_config import AdsPipelineConfig, pairs_path
from pipelines.config import ConfigError, load_config

DAYS = ("2026-11-23", "2026-11-30", "2026-12-07")  # three weekly partitions


def week_rows(day: str) -> list[dict]:
    """One week's pairs: 4 train, 2 audit, 2 test (gold) and 3 unlabeled, ids naming the day."""
    splits = ["train"] * 4 + ["audit"] * 2 + ["test"] * 2 + ["unlabeled"] * 3
    return [
        {
            "pair_id": f"{day}-{i}",
            "query": f"query {i} of {day}",
            "ad_title": f"ad {i}",
            "gold_grade": None if split == "unlabeled" else i % 4,
            "split": split,
        }
        for i, split in enumerate(splits)
    ]


@pytest.fixture
def dataset(tmp_path):
    root = tmp_path / "pairs"
    for day in DAYS:
        write_table(pairs_table(week_rows(day)), root / f"dt={day}" / "part-0.parquet")
    (root / "_SUCCESS").write_text("")  # not data
    return root


def ids(path, unlabeled: bool) -> set[str]:
    rows = pq.read_table(path).to_pylist()
    return {r["pair_id"] for r in rows if (r["split"] == "unlabeled") == unlabeled}


def gold_ids(*days: str) -> set[str]:
    return {r["pair_id"] for day in days for r in week_rows(day) if r["split"] != "unlabeled"}


def unlabeled_ids(*days: str) -> set[str]:
    return {r["pair_id"] for day in days for r in week_rows(day) if r["split"] == "unlabeled"}


def test_a_window_reads_its_unlabeled_pairs_and_all_gold_up_to_its_end(dataset, tmp_path):
    paths = select_pairs(str(dataset), PairsWindow("2026-11-30", "2026-12-07"), tmp_path / "run")
    assert ids(paths["pairs"], unlabeled=True) == unlabeled_ids("2026-11-30")
    assert ids(paths["pairs"], unlabeled=False) == gold_ids("2026-11-23", "2026-11-30")  # not 12-07's: after the end
    record = json.loads(paths["window"].read_text())
    assert record["window"] == {"start": "2026-11-30", "end": "2026-12-07"}
    assert record["unlabeled_partitions"] == ["2026-11-30"]
    assert record["gold_partitions"] == ["2026-11-23", "2026-11-30"]
    assert record["rows"] == {"unlabeled": 3, "all": 3 + 16}


def test_a_missed_week_is_read_by_the_next_run():
    """Week of 11-30 ran and succeeded; the run of 12-07 failed; the run of 12-14 starts at the last success's end."""
    week = {
        "data_interval_start": datetime(2026, 12, 14, tzinfo=UTC),
        "data_interval_end": datetime(2026, 12, 14, tzinfo=UTC),
    }
    after_a_miss = interval_window({**week, "prev_data_interval_end_success": datetime(2026, 11, 30, tzinfo=UTC)})
    assert after_a_miss == PairsWindow("2026-11-30", "2026-12-14")
    in_order = interval_window({**week, "prev_data_interval_end_success": datetime(2026, 12, 7, tzinfo=UTC)})
    assert in_order == PairsWindow("2026-12-07", "2026-12-14")  # starts where the last window ended: no overlap
    # an interval timetable: the run's own interval start when the last success ended later (a cleared old run)
    spans = {
        "data_interval_start": datetime(2026, 12, 7, tzinfo=UTC),
        "data_interval_end": datetime(2026, 12, 14, tzinfo=UTC),
    }
    assert interval_window(
        {**spans, "prev_data_interval_end_success": datetime(2026, 12, 21, tzinfo=UTC)}
    ) == PairsWindow("2026-12-07", "2026-12-14")
    assert interval_window({**week, "prev_data_interval_end_success": None}) == PairsWindow(None, "2026-12-14")
    assert interval_window({}) is None  # no interval: every partition


def test_the_next_window_picks_up_the_missed_weeks_partitions(dataset, tmp_path):
    context = {
        "data_interval_start": datetime(2026, 12, 8, 6, tzinfo=UTC),
        "data_interval_end": datetime(2026, 12, 8, 6, tzinfo=UTC),
        "prev_data_interval_end_success": datetime(2026, 11, 30, tzinfo=UTC),  # the run of 12-01 failed
    }
    params = dag_params({**context, "params": {"pairs": str(dataset), "partitions": "interval"}})
    assert params["pairs_window"] == {"start": "2026-11-30", "end": "2026-12-08"}
    paths = select_pairs(str(dataset), PairsWindow(**params["pairs_window"]), tmp_path / "run")
    assert ids(paths["pairs"], unlabeled=True) == unlabeled_ids("2026-11-30", "2026-12-07")
    assert ids(paths["pairs"], unlabeled=False) == gold_ids(*DAYS)


def test_the_partitions_param(dataset, tmp_path):
    context = {"data_interval_end": datetime(2026, 12, 1, tzinfo=UTC)}
    assert dag_window("all", str(dataset), context) is None
    assert dag_window("interval", None, context) is None  # the embedded set
    file = write_table(pairs_table(week_rows(DAYS[0])), tmp_path / "one.parquet")
    assert dag_window("interval", str(file), context) is None  # a file has no partitions: read whole
    assert dag_window({"from": "2026-11-24", "to": None}, str(dataset), context) == PairsWindow("2026-11-24", None)
    with pytest.raises(ValueError, match="needs pairs to be a dataset"):
        dag_window({"to": "2026-12-01"}, str(file), context)
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        dag_window({"from": "last week"}, str(dataset), context)
    with pytest.raises(ValueError, match="after its end"):
        PairsWindow("2026-12-02", "2026-12-01")


def test_validate_reads_the_window_into_the_run(dataset, tmp_path):
    config = load_config(
        AdsPipelineConfig,
        ["configs/pipeline/tiny-test.yaml"],
        [
            f"out_dir={tmp_path}/runs",
            "run_id=week",
            f"tracking.store_dir={tmp_path}/mlflow",
            "tracking.system_metrics_seconds=0",
            f"pairs={dataset}",
            'pairs_window={"start": "2026-11-30", "end": "2026-12-07"}',
        ],
    )
    assert pairs_path(config) == str(tmp_path / "runs" / "week" / "data" / "pairs.parquet")  # later steps read this
    outputs = ads_pipeline.validate(config)
    assert outputs["pairs"] == pairs_path(config)
    assert ids(outputs["pairs"], unlabeled=True) == unlabeled_ids("2026-11-30")
    assert json.loads(Path(outputs["window"]).read_text())["unlabeled_partitions"] == ["2026-11-30"]


def test_a_part_outside_a_dt_partition_is_refused(dataset, tmp_path):
    write_table(pairs_table(week_rows("loose")), dataset / "loose.parquet")
    with pytest.raises(ContractError, match="not in a dt=YYYY-MM-DD partition"):
        select_pairs(str(dataset), PairsWindow(None, "2026-12-01"), tmp_path / "run")


def test_a_window_needs_pairs():
    with pytest.raises(ConfigError, match="pairs_window is set but pairs is not"):
        load_config(AdsPipelineConfig, [], ['pairs_window={"end": "2026-12-01"}'])
