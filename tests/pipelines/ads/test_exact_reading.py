"""Inputs read exactly as written.

Round one (issue 50, M3 and M4): a CSV row's field count is checked on every line, an Excel CSV's byte-order mark
is not part of its first column, every JSONL line must hold the keys the first one has, a UTF-16 JSONL is refused
saying how to convert it, a pair_id names one pair across every split, and a path with ``#``, quotes or YAML
syntax survives ``--set`` and DAG params; each failed with 8e8468c's readers.py, contracts.py, config.py and
steps.py swapped in.

Round two (issue 58, item 6): a JSONL key written twice is quarantined naming it (and a column named twice in a
CSV header or Parquet schema is refused), a labeled row without a grade never becomes a gold-less train pair, a
stray CSV quote never merges rows, and ``agpo data import`` streams its quarantine to disk, so its memory does not
grow with the quarantined rows; each fails on 98f4e83's intake code (the last value kept; a train pair with a
null grade; q1 read with q3's grade; the Python and Arrow peak growing by the quarantine's size)."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake.contracts import ContractError, pairs_table, read_pairs, write_table
from pipelines.ads.intake.data_import import run
from pipelines.ads.intake.data_import_config import DataImportConfig
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


def test_a_jsonl_key_written_twice_is_quarantined_naming_the_key(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        '{"pair_id": "p1", "query": "red shoes", "ad_title": "nike"}\n'
        '{"pair_id": "p2", "query": "lamp", "ad_title": "desk lamp", "query": "sofa"}\n'
        '{"pair_id": "p3", "query": "mug", "ad_title": {"en": "cup", "en": "glass"}}\n'
        '{"pair_id": "p4", "query": "hat", "ad_title": "cap", "note": 1, "note": 2}\n'  # a column not read
    )
    pairs, quarantined = read(path)
    assert [p["pair_id"] for p in pairs] == ["p1", "p4"]
    assert [(q["row_number"], q["reason"], q["detail"]) for q in quarantined] == [
        (1, "repeated_key", "query: the key 'query' is written 2 times ('lamp', 'sofa'); JSON keeps one silently"),
        (2, "repeated_key", "ad_title: the key 'en' is written 2 times ('cup', 'glass'); JSON keeps one silently"),
    ]
    assert "'lamp', 'sofa'" in quarantined[0]["row"]  # the quarantine row shows every value


def test_a_column_named_twice_in_a_csv_header_or_a_parquet_schema_is_refused_naming_it(tmp_path):
    """The same silent last value as a JSONL key written twice, for a whole file: refused before a row is read."""
    path = tmp_path / "pairs.csv"
    path.write_text("pair_id,query,ad_title,query,notes,notes\np1,red shoes,nike,blue hat,a,b\n")
    with pytest.raises(ContractError, match=r"pairs\.csv names column\(s\) \['query'\] more than once .* rename"):
        read(path)
    path.write_text("pair_id,query,ad_title,notes,notes\np1,red shoes,nike,a,b\n")  # a column not read: no matter
    assert [p["query"] for p in read(path)[0]] == ["red shoes"]
    table = pa.Table.from_arrays(
        [pa.array(["p1"]), pa.array(["red shoes"]), pa.array(["nike"]), pa.array(["hat"])],
        names=["pair_id", "query", "ad_title", "query"],
    )
    pq.write_table(table, tmp_path / "pairs.parquet")
    with pytest.raises(ContractError, match=r"names column\(s\) \['query'\] more than once"):
        read(tmp_path / "pairs.parquet")


def import_csv(tmp_path: Path, text: str, **changes) -> dict:
    path = tmp_path / "labeled.csv"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    config = DataImportConfig(
        input=InputConfig(path=str(path), columns={"gold_grade": "grade"}),
        fractions={"train": 1.0, "audit": 0.0, "test": 0.0, "unlabeled": 0.0},
        out_dir=str(tmp_path / "out"),
        **changes,
    )
    paths = run(config)
    return {
        "pairs": read_pairs(paths["pairs"]).to_pylist(),
        "quarantine": pq.read_table(paths["quarantine"]).to_pylist(),
        "summary": json.loads(paths["summary"].read_text()),
    }


LABELED = """query,ad_title,grade,split
red shoes,nike red shoes,3,train
red shoes,adidas sandals,,train
lamp,desk lamp,2,train
sofa,leather couch,,pool
mug,coffee cup,1,test
mug,glass jar,,pool
"""


def test_a_labeled_row_with_an_empty_grade_is_quarantined_never_a_train_pair_without_gold(tmp_path):
    """Without a split_map every row of the input is labeled: an empty grade is a missing field."""
    out = import_csv(tmp_path, LABELED)
    assert all(p["gold_grade"] is not None for p in out["pairs"] if p["split"] != "unlabeled"), out["pairs"]
    missing = [(q["row_number"], q["reason"], q["detail"]) for q in out["quarantine"]]
    assert missing == [
        (
            r,
            "missing_field",
            "gold_grade (grade) is '' in a labeled row: grade it, or map its split value to unlabeled with split_map",
        )
        for r in (1, 3, 5)
    ]
    rows = out["summary"]["rows"]
    assert rows == {"in": 6, "pairs": 3, "quarantined": 3, "filtered": 0}


def test_a_row_the_file_marks_unlabeled_is_an_unlabeled_pair_and_never_lands_in_a_labeled_split(tmp_path):
    """The file says a row is unlabeled when split_map maps its split value to unlabeled: sofa's row is an
    unlabeled pair; mug's gradeless row follows its query to test, where a pair needs gold: it is filtered."""
    out = import_csv(tmp_path / "mapped", LABELED, split_map={"train": "train", "test": "test", "pool": "unlabeled"})
    by_title = {p["ad_title"]: (p["split"], p["gold_grade"]) for p in out["pairs"]}
    assert by_title == {
        "nike red shoes": ("train", 3),
        "desk lamp": ("train", 2),
        "leather couch": ("unlabeled", None),
        "coffee cup": ("test", 1),
    }
    assert [(q["row_number"], q["reason"]) for q in out["quarantine"]] == [(1, "missing_field")]
    assert out["summary"]["filtered_by_reason"] == {"query_in_labeled_split": 1}
    assert out["summary"]["rows"] == {"in": 6, "pairs": 4, "quarantined": 1, "filtered": 1}


def test_a_stray_quote_never_merges_rows_and_quoted_commas_and_quotes_still_read(tmp_path):
    """The review's case: q1's quote is left open and q3's stray quote closes it right before a delimiter,
    leaving the header's four fields; q1 read as one record with q3's grade. A record is one line now."""
    path = tmp_path / "stray.csv"
    path.write_text(
        "pair_id,query,ad_title,gold_grade\n"
        'p1,"q1 red shoes,nike,3\n'
        "p2,q2 lamp,desk lamp,2\n"
        'p3,q3 sofa",couch,1\n'
        'p4,q4 mug,"cup, 12 oz, ""large""",2\n'
    )
    pairs, quarantined = read(path)
    assert pairs == [
        {"pair_id": "p4", "query": "q4 mug", "ad_title": 'cup, 12 oz, "large"', "gold_grade": 2, "split": "unlabeled"}
    ]
    assert [(q["row_number"], q["reason"]) for q in quarantined] == [(k, "malformed_record") for k in range(3)]
    assert quarantined[0]["detail"].startswith("lines 2-4 do not parse as one record (a quoted field runs over")
    lines = [json.loads(q["row"])["line"] for q in quarantined]
    assert lines == ['p1,"q1 red shoes,nike,3\n', "p2,q2 lamp,desk lamp,2\n", 'p3,q3 sofa",couch,1\n']


CHILD = """
import json, sys, tracemalloc
import pyarrow as pa
from pipelines.ads.intake.data_import import run
from pipelines.ads.intake.data_import_config import DataImportConfig
from pipelines.ads.intake.ingest import InputConfig

config = DataImportConfig(
    input=InputConfig(path=sys.argv[1], columns={"gold_grade": "grade"}, batch_rows=256),
    fractions={"train": 1.0, "audit": 0.0, "test": 0.0, "unlabeled": 0.0},
    out_dir=sys.argv[2],
)
tracemalloc.start()
paths = run(config)
python = tracemalloc.get_traced_memory()[1]
arrow = pa.default_memory_pool().max_memory()
print(json.dumps({"peak_mib": (python + arrow) / 2**20, "summary": json.loads(paths["summary"].read_text())}))
"""
GOOD_ROWS, ROW_CHARS = 200, 3000


def import_peak(tmp_path: Path, quarantined: int) -> tuple[float, dict]:
    """Python plus Arrow peak of ``agpo data import`` in a fresh process, on 200 good pairs and ``quarantined``
    rows of about 3 KB (an ad text over max_text_chars), read 256 rows at a time."""
    path = tmp_path / f"pairs-{quarantined}.jsonl"
    with path.open("w") as handle:
        for i in range(GOOD_ROWS + quarantined):
            title = f"ad {i}" if i < GOOD_ROWS else f"{i} " + "x" * ROW_CHARS
            handle.write(json.dumps({"query": f"query {i % 50}", "ad_title": title, "grade": i % 4}) + "\n")
    command = [sys.executable, "-c", CHILD, str(path), str(tmp_path / f"out-{quarantined}")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result["peak_mib"], result["summary"]


def test_data_import_streams_its_quarantine_so_memory_is_flat_in_the_quarantined_rows(tmp_path):
    """3,000 and 12,000 quarantined rows of 3 KB (both over the 2,048 rows written at a time), each import in a
    fresh process: holding them all (Python dicts, then one Arrow table) cost about 7 KB a row (98f4e83: 47.6 and
    113.9 MiB); streamed, the peak is the same (43.8 and 44.2 MiB)."""
    small, small_summary = import_peak(tmp_path, 3_000)
    large, large_summary = import_peak(tmp_path, 12_000)
    print(f"data import Python + Arrow peak: {small:.1f} MiB (3,000 quarantined), {large:.1f} MiB (12,000)")
    assert small_summary["rows"] == {"in": 3_200, "pairs": 200, "quarantined": 3_000, "filtered": 0}
    assert large_summary["quarantined_by_reason"] == {"text_too_long": 12_000}
    rows = pq.read_table(tmp_path / "out-12000" / "quarantine.parquet")
    assert rows.num_rows == 12_000 and rows["row_number"].to_pylist() == list(range(GOOD_ROWS, GOOD_ROWS + 12_000))
    assert large - small < 8, (small, large)
