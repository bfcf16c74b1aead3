"""The real-text study's mechanics at tiny size on real rows of ../shared/data (its figures come from `make
study-real-text`, docs/evidence/): whole queries carved into nested exports with fixed test and audit pairs,
imported with the Home Depot recipe, every model scored on the same pairs, the champion rule's pick recorded,
and a rerun read back."""

import json

import pytest

from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.studies.real_text import carve, read_source, run
from pipelines.ads.studies.real_text_config import RealTextConfig
from pipelines.config import load_config

pytestmark = pytest.mark.integration


def test_exports_are_whole_queries_nested_by_size_with_the_same_held_out_pairs():
    by_query = {f"q{i}": [{"search_term": f"Q{i}", "id": f"{i}-{j}"} for j in range(1 + i % 3)] for i in range(40)}
    exports = carve(by_query, sample=1, sizes=(10, 4), test_pairs=5, audit_pairs=5)
    assert list(exports) == [4, 10]
    small, large = ({r["id"]: r["split"] for r in rows} for rows in exports.values())
    assert {i: s for i, s in large.items() if s != "train"} == {i: s for i, s in small.items() if s != "train"}
    assert {i for i, s in small.items() if s == "train"} < {i for i, s in large.items() if s == "train"}
    assert sum(s == "train" for s in large.values()) >= 10 and sum(s == "test" for s in small.values()) >= 5
    for rows in exports.values():  # a query is in one split only
        splits = {}
        for row in rows:
            assert splits.setdefault(row["search_term"], row["split"]) == row["split"]
    assert carve(by_query, 1, (10,), 5, 5)[10] == exports[10]  # the sample seed fixes the draw
    with pytest.raises(ValueError, match="too few queries for train split"):
        carve(by_query, 1, (1000,), 5, 5)


def test_the_study_runs_on_real_rows_and_reads_a_finished_export_back(home_depot_csv, tmp_path):
    sets = [f"source={home_depot_csv}", "sizes=[40]", "samples=[0]", "test_pairs=40", "audit_pairs=30", "kinds=[cross]"]
    sets += ["distil.student.backbone=tiny", f"out_dir={tmp_path}", "evaluate.bootstrap.samples=50"]
    config = load_config(RealTextConfig, [], sets)
    paths = run(config)
    [export] = json.loads(paths["results"].read_text())["exports"]
    pairs = read_pairs(tmp_path / "s0-n40" / "data" / "pairs.parquet").to_pylist()
    columns, _ = read_source(home_depot_csv)
    assert sum(r["split"] == "train" for r in pairs) == export["train_pairs"] >= 40
    assert export["test_pairs"] == sum(r["split"] == "test" for r in pairs) >= 40
    assert set(export["models"]) == {"cross (default)", "zero_shot", "lexical"}  # tiny backbone: auto is cross
    assert export["shipped"] in ("student", "zero_shot", "lexical") and export["shipped_reason"]
    assert {"difference", "low", "high"} <= set(export["default_vs_zero_shot"]["roc_auc_relevant"])
    table = paths["table"].read_text()
    assert "| lexical | 40 |" in table and "the champion rule (ROC-AUC) ships s0:" in table
    assert paths["plot"].stat().st_size > 0 and "search_term" in columns
    before = paths["results"].stat().st_mtime_ns
    again = run(config)  # a finished export is read back, not trained again
    assert json.loads(again["results"].read_text())["exports"] == [export]
    assert (tmp_path / "s0-n40" / "result.json").stat().st_mtime_ns < before
