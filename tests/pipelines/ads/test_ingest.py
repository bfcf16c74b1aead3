"""Input validation: every bad row ends in quarantine with the right reason; nothing is lost silently."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.contracts import ContractError
from pipelines.ads.ingest import InputConfig, read_raw, validate

GOOD = {"pair_id": "p1", "query": "red shoes", "ad_title": "nike shoes, red", "gold_grade": 3, "split": "audit"}


def run_validation(config):
    pairs, quarantined, skipped, rows_in = [], [], 0, 0
    for batch in read_raw(config):
        for row in batch:
            rows_in += 1
            pair, problem = validate(row, config)
            if problem is not None:
                quarantined.append(problem)
            elif pair is None:
                skipped += 1
            else:
                pairs.append(pair)
    assert rows_in == len(pairs) + len(quarantined) + skipped  # nothing lost silently
    return pairs, quarantined


def reasons(quarantined):
    return {q["row_number"]: q["reason"] for q in quarantined}


def test_jsonl_bad_input_corpus_gets_a_reason_for_every_row(tmp_path):
    lines = [
        json.dumps(GOOD).encode(),  # 0 good
        b"{not json",  # 1
        b"[1, 2]",  # 2 not an object
        json.dumps({**GOOD, "pair_id": "p3", "query": None}).encode(),  # 3
        json.dumps({**GOOD, "pair_id": "p4", "ad_title": "   "}).encode(),  # 4
        json.dumps({**GOOD, "pair_id": "p5", "ad_title": "x" * 50}).encode(),  # 5 too long (limit 40)
        json.dumps({**GOOD, "pair_id": "p6", "gold_grade": 7}).encode(),  # 6
        json.dumps({**GOOD, "pair_id": "p7", "gold_grade": "high"}).encode(),  # 7
        json.dumps({**GOOD, "pair_id": "p8", "query": 42}).encode(),  # 8 wrong type
        b'{"pair_id": "p9", "query": "caf\xe9", "ad_title": "x"}',  # 9 latin-1 byte in UTF-8 file
        json.dumps({**GOOD, "pair_id": "p10", "gold_grade": None}).encode(),  # 10 good, unlabeled
        json.dumps({**GOOD, "pair_id": "p11", "query": "\ud800 lone"}).encode(),  # 11 escaped lone surrogate
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    pairs, quarantined = run_validation(InputConfig(path=str(path), max_text_chars=40, batch_rows=5))
    assert [p["pair_id"] for p in pairs] == ["p1", "p10"]
    assert pairs[1]["gold_grade"] is None
    assert reasons(quarantined) == {
        1: "malformed_record",
        2: "malformed_record",
        3: "missing_field",
        4: "empty_text",
        5: "text_too_long",
        6: "unknown_grade",
        7: "wrong_type",
        8: "wrong_type",
        9: "undecodable_bytes",
        11: "undecodable_bytes",
    }
    details = {q["row_number"]: q["detail"] for q in quarantined}
    assert "query (query) is null" in details[3] and "50 characters, limit 40" in details[5]
    assert "caf\\xe9" in details[9]  # the bytes, shown
    table = pa.Table.from_pylist(quarantined)  # every quarantine row is writable (valid UTF-8)
    assert table.num_rows == 10


def test_csv_with_column_and_label_mapping_and_undecodable_bytes(tmp_path):
    path = tmp_path / "esci.csv"
    rows = [
        b"example_id,query,product_title,esci_label",
        b"e1,red shoes,nike shoes red,E",
        b"e2,red shoes,adidas shoes blue,S",
        b'e3,red shoes,"shoe polish, black",C',
        b"e4,red shoes,cat food,I",
        b"e5,red shoes,caf\xe9 table,I",
        b"e6,red shoes,lamp,X",
        b"e7,,lamp,I",
    ]
    path.write_bytes(b"\n".join(rows) + b"\n")
    config = InputConfig(
        path=str(path),
        columns={"pair_id": "example_id", "ad_title": "product_title", "gold_grade": "esci_label"},
        label_map={"E": 3, "S": 2, "C": 1, "I": 0},
    )
    pairs, quarantined = run_validation(config)
    assert [(p["pair_id"], p["ad_title"], p["gold_grade"]) for p in pairs] == [
        ("e1", "nike shoes red", 3),
        ("e2", "adidas shoes blue", 2),
        ("e3", "shoe polish, black", 1),
        ("e4", "cat food", 0),
    ]
    assert reasons(quarantined) == {4: "undecodable_bytes", 5: "unknown_grade", 6: "empty_text"}


def test_parquet_with_oversize_truncated_and_split_filter(tmp_path):
    path = tmp_path / "pairs.parquet"
    rows = [GOOD, {**GOOD, "pair_id": "p2", "ad_title": "y" * 30, "split": "unlabeled"}, {**GOOD, "pair_id": "p3"}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    pairs, quarantined = run_validation(InputConfig(path=str(path), max_text_chars=10, oversize="truncate"))
    assert [p["ad_title"] for p in pairs] == ["nike shoes", "y" * 10, "nike shoes"] and not quarantined
    pairs, _ = run_validation(InputConfig(path=str(path), split="unlabeled"))
    assert [p["pair_id"] for p in pairs] == ["p2"]


def test_missing_column_stops_with_a_mapping_hint(tmp_path):
    path = tmp_path / "wands.tsv"
    path.write_text("query_id\tquery\tquery_class\n1\tsofa\tSofas\n")
    with pytest.raises(ContractError, match=r"no column\(s\) \['ad_title'\].*input.columns"):
        list(read_raw(InputConfig(path=str(path))))
    with pytest.raises(ContractError, match="does not exist"):
        list(read_raw(InputConfig(path=str(tmp_path / "nope.parquet"))))
    with pytest.raises(ContractError, match="cannot tell the format"):
        list(read_raw(InputConfig(path=str(path.with_suffix(".xlsx").write_text("x") and path.with_suffix(".xlsx")))))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"columns": {"title": "x"}}, r"unknown contract field\(s\) \['title'\]"),
        ({"label_map": {"E": 5}}, "outside"),
        ({"oversize": "drop"}, "oversize must be one of"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        InputConfig(**kwargs)
