"""Inputs read exactly as written (issue 50, M3 and M4): a CSV row's field count is checked on every line, an
Excel CSV's byte-order mark is not part of its first column, every JSONL line must hold the keys the first one
has, a UTF-16 JSONL is refused saying how to convert it, a pair_id names one pair across every split, and a path
with ``#``, quotes or YAML syntax survives ``--set`` and DAG params.

Each test fails on the code before the change: with 8e8468c's readers.py, contracts.py, config.py and steps.py
swapped in, all seven failed."""

import json

import pytest

from pipelines.ads.intake.contracts import ContractError, pairs_table, read_pairs, write_table
from pipelines.ads.intake.ingest import InputConfig, validate
from pipelines.ads.intake.readers import read_raw


def read(path, **options):
    """(pairs, quarantine rows) of ``path`` through the readers and the row rules."""
    pairs, quarantined = [], []
    config = InputConfig(path=str(path), split=None, **options)
    for batch in read_raw(config):
        for row in batch:
            pair, problem = validate(row, config)
            (quarantined if problem else pairs).append(problem or pair)
    return pairs, quarantined


def test_a_csv_row_with_a_field_too_many_or_too_few_is_quarantined_naming_its_line(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("pair_id,query,ad_title\np1,red shoes,nike\np2,red shoes, nike,extra\np3,lamp\np4,sofa,couch\n")
    pairs, quarantined = read(path)
    assert [p["pair_id"] for p in pairs] == ["p1", "p4"]
    assert [(q["reason"], q["detail"][:62]) for q in quarantined] == [
        ("malformed_record", "line 3 does not parse as one record (4 fields where the header"),
        ("malformed_record", "line 4 does not parse as one record (2 fields where the header"),
    ]


def test_an_excel_csv_with_a_byte_order_mark_imports_as_typed(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffid,query,ad_title\nA-1,red shoes,nike\n".encode())
    pairs, quarantined = read(path, columns={"pair_id": "id"})
    assert quarantined == [] and [p["pair_id"] for p in pairs] == ["A-1"]


def test_every_jsonl_line_must_hold_the_keys_the_first_one_has(tmp_path):
    lines = [
        {"pair_id": "p1", "query": "red shoes", "ad_title": "nike"},
        {"pair_id": "p2", "query": "lamp", "ad_title": "desk lamp"},
        {"pairid": "p3", "query": "sofa", "ad_title": "couch"},  # misspelled: must not become row-2
        {"pair_id": "p4", "query": "sofa", "title": "couch"},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    pairs, quarantined = read(path)
    assert [p["pair_id"] for p in pairs] == ["p1", "p2"]
    assert [(q["reason"], q["detail"]) for q in quarantined] == [
        ("missing_field", "line 3 has no key(s) ['pair_id'], which the first line has"),
        ("missing_field", "line 4 has no key(s) ['ad_title'], which the first line has"),
    ]


def test_a_utf16_jsonl_is_refused_saying_how_to_convert_it(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(json.dumps({"pair_id": "p1", "query": "q", "ad_title": "t"}).encode("utf-16"))
    with pytest.raises(ContractError, match=r"is UTF-16 or UTF-32 .*iconv -f UTF-16 -t UTF-8"):
        read(path)


def test_a_pair_id_repeated_across_splits_is_refused_naming_it(tmp_path):
    rows = [
        {"pair_id": "a", "query": "q", "ad_title": "t", "split": "train", "gold_grade": 1},
        {"pair_id": "a", "query": "other", "ad_title": "text", "split": "test", "gold_grade": 2},
        {"pair_id": "b", "query": "q", "ad_title": "t", "split": "test", "gold_grade": 1},
    ]
    path = write_table(pairs_table(rows), tmp_path / "pairs.parquet")
    with pytest.raises(ContractError, match=r"repeats 1 pair_id\(s\): 'a' x2 \(.*train.*\)\. A pair_id must name one"):
        read_pairs(path, split="test")
    assert read_pairs(write_table(pairs_table([rows[0], rows[2]]), tmp_path / "ok.parquet")).num_rows == 2


AWKWARD = '/data/pairs #1 it\'s "v2": {a: b}.csv'  # a comment sign, quotes and YAML syntax in one path


def test_a_path_with_a_comment_sign_survives_the_cli(tmp_path, capsys):
    """YAML reads `` #`` as a comment: ``--set input.path=pairs #1.csv`` lost everything after it."""
    import yaml

    from pipelines.cli import main

    path = str(tmp_path / "pairs #1.csv")
    assert main(["data-import", "--set", f"input.path={path}", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["input"]["path"] == path


def test_a_dag_params_path_reaches_the_config_exactly():
    """DAG params were spliced into ``--set`` text unquoted: a comment sign, quotes or YAML syntax changed them."""
    from pipelines.ads.pipeline_config import AdsPipelineConfig
    from pipelines.config import literal_override, load_config
    from pipelines.steps import config_from_params

    params = {"pairs": AWKWARD, "run_name": "2026"}
    config = config_from_params(AdsPipelineConfig, params, "manual_1", {"pairs": "pairs"})
    assert config.pairs == AWKWARD and config.run_id == "2026"
    assert load_config(AdsPipelineConfig, [], [literal_override("pairs", AWKWARD)]).pairs == AWKWARD
