"""Input validation: every bad row ends in quarantine with the right reason; nothing is lost silently."""

import json
import random
import string
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake import readers
from pipelines.ads.intake.contracts import PAIRS_SCHEMA, ContractError, read_pairs, write_table, write_tables
from pipelines.ads.intake.ingest import InputConfig, RawRow, validate
from pipelines.ads.intake.readers import read_raw

GOOD = {"pair_id": "p1", "query": "red shoes", "ad_title": "nike shoes, red", "gold_grade": 3, "split": "audit"}


def records_in(path):
    """The file's row count, counted without the reader: Parquet metadata, else lines (less a CSV header; a
    CSV record is one line, and each line of a broken one is a quarantine row)."""
    if path.suffix == ".parquet":
        return pq.read_metadata(path).num_rows
    lines = path.read_bytes().splitlines()
    return len(lines) - (path.suffix in (".csv", ".tsv"))


def run_validation(config):
    pairs, quarantined, skipped = [], [], 0
    for batch in read_raw(config):
        for row in batch:
            pair, problem = validate(row, config)
            if problem is not None:
                quarantined.append(problem)
            elif pair is None:
                skipped += 1
            else:
                pairs.append(pair)
    assert len(pairs) + len(quarantined) + skipped == records_in(Path(config.path))  # nothing lost silently
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


def details(quarantined):
    return {q["row_number"]: q["detail"] for q in quarantined}


def test_json_nested_thousands_deep_or_with_huge_integers_is_quarantined(tmp_path):
    lines = [
        b'{"pair_id": "p0", "query": ' + b"[" * 5000 + b"]" * 5000 + b', "ad_title": "x"}',  # RecursionError
        json.dumps({**GOOD, "pair_id": "p1", "query": json.loads("[" * 100 + "]" * 100)}).encode(),  # loads, too deep
        b'{"pair_id": "p2", "query": "q", "ad_title": "a", "gold_grade": ' + b"7" * 5000 + b"}",  # int too long
        b"-" + b"9" * 5000,  # a huge integer that is the whole line
        json.dumps({**GOOD, "pair_id": "p4"}).encode(),
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    pairs, quarantined = run_validation(InputConfig(path=str(path)))
    assert [p["pair_id"] for p in pairs] == ["p4"]
    assert reasons(quarantined) == {
        0: "malformed_record",
        1: "malformed_record",
        2: "wrong_type",
        3: "malformed_record",
    }
    assert "nested deeper than 64 levels" in details(quarantined)[0]
    assert "query is nested deeper than 64 levels" in details(quarantined)[1]
    assert "gold_grade holds an integer of 5,000 digits" in details(quarantined)[2]
    assert pa.Table.from_pylist(quarantined).num_rows == 4  # every quarantine row is writable


def test_csv_field_over_the_csv_module_limit_loads_and_meets_the_text_rules(tmp_path):
    long_title = "drill " * 30_000  # 180,000 characters: over csv's default 131,072 field limit
    path = tmp_path / "long.csv"
    path.write_text(f"pair_id,query,ad_title\np0,drill,{long_title}\np1,drill,bosch drill\n")
    pairs, quarantined = run_validation(InputConfig(path=str(path), max_text_chars=200_000))
    assert [len(p["ad_title"]) for p in pairs] == [len(long_title), len("bosch drill")] and not quarantined
    pairs, quarantined = run_validation(InputConfig(path=str(path)))
    assert [p["pair_id"] for p in pairs] == ["p1"] and reasons(quarantined) == {0: "text_too_long"}


def esci_lines(n):
    return [f"e{k},red shoes {k},nike shoes {k},E" for k in range(n)]


def test_an_unterminated_csv_quote_cannot_silently_swallow_the_rows_after_it(tmp_path):
    path = tmp_path / "quote.csv"
    config = InputConfig(path=str(path), columns={"pair_id": "id", "gold_grade": "label"}, label_map={"E": 3})
    rows = esci_lines(10)
    rows[2] = 'e2,red shoes 2,"nike shoes 2,E'  # the quote opens on line 4 and is never closed
    path.write_text("\n".join(["id,query,ad_title,label", *rows]) + "\n")
    pairs, quarantined = run_validation(config)
    assert [p["pair_id"] for p in pairs] == ["e0", "e1"]  # not three, e2's title holding e3..e9
    assert set(reasons(quarantined).values()) == {"malformed_record"} and len(quarantined) == 8
    assert "lines 4-11 do not parse as one record" in details(quarantined)[2]
    assert details(quarantined)[9] == "line 11 is part of the broken record of lines 4-11"

    rows[6] = 'e6,red shoes 6,"nike shoes, 6",E'  # a later quote closes it mid-field: lines 4-8 are broken
    path.write_text("\n".join(["id,query,ad_title,label", *rows]) + "\n")
    pairs, quarantined = run_validation(config)
    assert [p["pair_id"] for p in pairs] == ["e0", "e1", "e7", "e8", "e9"]
    assert sorted(reasons(quarantined)) == [2, 3, 4, 5, 6] and "lines 4-8" in details(quarantined)[2]


def test_a_quoted_line_break_is_quarantined_line_by_line_and_a_runaway_quote_costs_at_most_max_record_lines_rows(
    tmp_path,
):
    """A record is one line: a value spanning two (its tail ``size 9",E`` would read as two fields) is two
    malformed rows, never a pair and never a half record read as one."""
    path = tmp_path / "quote.csv"
    config = InputConfig(path=str(path), columns={"pair_id": "id", "gold_grade": "label"}, label_map={"E": 3})
    rows = ["e0,red shoes,nike shoes,E", 'e1,red shoes,"nike shoes,\nsize 9",E', 'e2,red shoes,"never closed,E']
    path.write_text("\n".join(["id,query,ad_title,label", *rows, *esci_lines(150)[3:]]) + "\n")
    limit = 100  # readers.MAX_RECORD_LINES
    pairs, quarantined = run_validation(config)
    assert [p["pair_id"] for p in pairs] == ["e0", *(f"e{k}" for k in range(limit + 2, 150))]
    assert details(quarantined)[1].startswith("lines 3-4 do not parse as one record (a quoted field runs over a line")
    assert details(quarantined)[2] == "line 4 is part of the broken record of lines 3-4"
    assert len(quarantined) == 2 + limit and f"a quoted field runs over {limit} lines" in details(quarantined)[3]


def test_an_over_long_line_is_quarantined_and_the_lines_after_it_still_load(tmp_path):
    jsonl = tmp_path / "long.jsonl"
    rows = [GOOD, {**GOOD, "pair_id": "p1", "ad_title": "x" * 500}, {**GOOD, "pair_id": "p2"}]
    jsonl.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    pairs, quarantined = run_validation(InputConfig(path=str(jsonl), max_line_bytes=200))
    assert [p["pair_id"] for p in pairs] == ["p1", "p2"] and reasons(quarantined) == {1: "text_too_long"}
    size = len(json.dumps(rows[1])) + 1  # the line break included
    assert details(quarantined)[1] == f"line 2 has {size} bytes, over input.max_line_bytes (200); skipped unread"

    csv_path = tmp_path / "long.csv"
    csv_path.write_text(f"pair_id,query,ad_title\np0,drill,bosch\np1,drill,{'y' * 500}\np2,drill,makita\n")
    pairs, quarantined = run_validation(InputConfig(path=str(csv_path), max_line_bytes=200))
    assert [p["pair_id"] for p in pairs] == ["p0", "p2"] and reasons(quarantined) == {1: "text_too_long"}
    assert "line 3 has 510 characters" in details(quarantined)[1]  # "p1,drill," + 500 + line break


def test_a_line_far_over_the_bound_is_never_read_into_memory_whole(tmp_path):
    path = tmp_path / "huge.jsonl"
    head = b'{"pair_id": "p0", "query": "q", "ad_title": "'
    with path.open("wb") as handle:  # a 50 MiB line, then a good one
        handle.write(head)
        for _ in range(50):
            handle.write(b"z" * 2**20)
        handle.write(b'"}\n' + json.dumps({**GOOD, "pair_id": "p1"}).encode() + b"\n")
    config = InputConfig(path=str(path), max_line_bytes=2**20)
    tracemalloc.start()
    try:
        batches = list(read_raw(config))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # a few 1 MiB reads, never the 50 MiB line
    assert [row.number for batch in batches for row in batch] == [0, 1]
    pairs, quarantined = run_validation(config)
    assert [p["pair_id"] for p in pairs] == ["p1"] and reasons(quarantined) == {0: "text_too_long"}
    assert f"line 1 has {len(head) + 50 * 2**20 + 3:,} bytes" in details(quarantined)[0]


def test_wide_files_keep_only_the_mapped_columns(tmp_path):
    columns = {"pair_id": "id", "ad_title": "title"}
    wide = {f"extra_{k}": f"value {k}" for k in range(3000)}
    rows = [{"id": "p0", "query": "sofa", "title": "grey sofa", **wide, "note": "caf\udcc3"}]
    # the unmapped "note" holds an undecodable byte: it is never read, so it cannot quarantine the row
    parquet, jsonl, csv_path = tmp_path / "wide.parquet", tmp_path / "wide.jsonl", tmp_path / "wide.csv"
    pq.write_table(pa.table({k: [v.encode("utf-8", "surrogateescape")] for k, v in rows[0].items()}), parquet)
    jsonl.write_text(json.dumps(rows[0]) + "\n")
    header, values = ",".join(rows[0]), ",".join(rows[0].values())
    csv_path.write_bytes(f"{header}\n{values}\n".encode("utf-8", "surrogateescape"))
    for path in (parquet, jsonl, csv_path):
        config = InputConfig(path=str(path), columns=columns)
        batch = next(read_raw(config))
        assert set(batch[0].values) == {"id", "query", "title"} and batch[0].problem is None, path
        assert validate(batch[0], config)[0]["ad_title"] == "grey sofa"


def test_invalid_utf8_in_a_parquet_string_column_quarantines_only_its_rows(tmp_path):
    titles = pa.array([b"grey sofa", b"caf\xe9 table", b"oak desk"]).view(pa.string())  # row 1 is latin-1
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"pair_id": ["p0", "p1", "p2"], "query": ["q"] * 3, "ad_title": titles}), path)
    pairs, quarantined = run_validation(InputConfig(path=str(path)))
    assert [p["pair_id"] for p in pairs] == ["p0", "p2"] and reasons(quarantined) == {1: "undecodable_bytes"}
    assert "caf\\xe9" in details(quarantined)[1]


@pytest.mark.parametrize("damage", ["empty", "random", "truncated"])
def test_an_empty_or_corrupt_parquet_file_is_a_contract_error_naming_it(tmp_path, damage):
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD] * 100), path)
    data = path.read_bytes()
    damaged = {"empty": b"", "random": bytes(range(256)) * 8, "truncated": data[: len(data) - 20]}[damage]
    path.write_bytes(damaged)
    problem = (
        "is an empty file \\(0 bytes\\)" if damage == "empty" else "is not a readable Parquet file .*Export it again"
    )
    with pytest.raises(ContractError, match=rf"{path} {problem}"):
        list(read_raw(InputConfig(path=str(path))))


def test_quarantine_rows_keep_bounded_row_and_detail(tmp_path):
    path = tmp_path / "big.jsonl"
    rows = [{**GOOD, "query": list(range(100_000))}, {**GOOD, "pair_id": "p" * 5000, "ad_title": "y" * 300_000}]
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    _, quarantined = run_validation(InputConfig(path=str(path)))
    assert [q["reason"] for q in quarantined] == ["wrong_type", "text_too_long"]
    for q in quarantined:
        assert len(q["row"]) < 4200 and len(q["detail"]) < 1100 and len(q["pair_id"]) < 1100
    assert quarantined[0]["detail"].endswith("chars]") and "[truncated, " in quarantined[0]["detail"]
    assert quarantined[1]["row"].endswith(f"... [truncated, {len(json.dumps(rows[1])):,} chars]")


def batch_bytes(batch):
    """The characters a batch's text values hold (the readers count as many: CSV those characters, Parquet
    their UTF-8 bytes, JSONL whole lines)."""
    return sum(len(v) for row in batch for v in row.values.values() if isinstance(v, str))


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".csv"])
def test_no_batch_goes_over_the_byte_cap(tmp_path, monkeypatch, suffix):
    cap = 2**20
    monkeypatch.setattr(readers, "MAX_BATCH_CHARS", cap)
    monkeypatch.setattr(readers, "PARQUET_READ_BYTES", cap // 4)
    rng = random.Random(0)
    sizes = (
        [rng.randrange(1, 300_000) for _ in range(60)] + [3 * cap // 2] + [rng.randrange(1, 5000) for _ in range(500)]
    )
    rows = [{"pair_id": f"p{i}", "query": "sofa", "ad_title": "x" * n} for i, n in enumerate(sizes)]
    path = tmp_path / f"pairs{suffix}"
    if suffix == ".parquet":
        write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    else:
        path.write_text("pair_id,query,ad_title\n" + "".join(f"{r['pair_id']},sofa,{r['ad_title']}\n" for r in rows))
    batches = list(read_raw(InputConfig(path=str(path), batch_rows=200)))
    assert [row.values["pair_id"] for batch in batches for row in batch] == [r["pair_id"] for r in rows]
    assert all(len(batch) <= 200 for batch in batches)
    over = [[row.values["pair_id"] for row in batch] for batch in batches if batch_bytes(batch) > cap]
    assert over == [["p60"]]  # only the row that is itself over the cap, alone in its batch


RSS_CHILD = """
import json, sys
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.intake.readers import read_raw


def peak_mib():  # VmHWM: this process's peak RSS (ru_maxrss would carry the forking pytest's over exec)
    status = open("/proc/self/status").read().split("VmHWM:")[1]
    return int(status.split()[0]) / 1024


base = peak_mib()
rows = 0
for batch in read_raw(InputConfig(path=sys.argv[1], max_text_chars=2**21)):
    rows += len(batch)
    del batch
print(json.dumps({"rows": rows, "base_mib": round(base), "read_mib": round(peak_mib() - base)}))
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc")
def test_reading_300_rows_of_1_mib_from_parquet_holds_a_few_batches_not_the_file(tmp_path):
    """Peak RSS of the read above the interpreter's, in a fresh process: ~910 MiB when the whole file was one
    batch (and one Parquet page), ~190 MiB with the byte cap and the writer's small pages (one 64 MiB batch of
    Python rows, one 8 MiB read, one page)."""
    path = tmp_path / "big.parquet"
    title = "sofa grey 3 seat linen oak legs " * 2**15  # 1 MiB; compresses, so the file is small to write
    tables = (  # streamed 16 rows at a time, so this process never holds the file either
        pa.table(
            {
                "pair_id": [f"p{i}" for i in range(k, k + 16)],
                "query": ["q"] * 16,
                "ad_title": [f"{i}{title}"[: 2**20] for i in range(k, k + 16)],
            }
        )
        for k in range(0, 304, 16)
    )
    write_tables(tables, pa.schema([(n, pa.string()) for n in ("pair_id", "query", "ad_title")]), path)
    done = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    print(f"read of 304 x 1 MiB Parquet rows: {measured}")
    assert measured["rows"] == 304
    assert measured["read_mib"] < 450, measured


def test_a_flipped_byte_in_a_parquet_page_is_an_error_naming_the_file(tmp_path):
    """The product's writer stores page checksums and its readers verify them: without, pyarrow decodes the
    damaged page into other text, silently."""
    rng = random.Random(0)
    rows = [
        {**GOOD, "pair_id": f"p{i}", "ad_title": "".join(rng.choices(string.ascii_lowercase, k=300))} for i in range(50)
    ]
    path = write_table(pa.Table.from_pylist(rows, schema=PAIRS_SCHEMA), tmp_path / "pairs.parquet")
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(PAIRS_SCHEMA.get_field_index("ad_title"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + chunk.total_compressed_size // 2] ^= 0x20  # inside the page holding the titles
    path.write_bytes(bytes(data))
    with pytest.raises(ContractError, match=rf"{path} is not a readable Parquet file .*CRC checksum"):
        list(read_raw(InputConfig(path=str(path))))
    with pytest.raises(ContractError, match=rf"pairs file {path} is not a readable Parquet file .*CRC checksum"):
        read_pairs(path)


def one(values, config=None):
    """validate() of one row: (pair, quarantine row)."""
    return validate(RawRow(0, values), config or InputConfig())


@pytest.mark.parametrize("field", ["pair_id", "query", "ad_title", "split"])
def test_a_nul_character_in_a_text_field_is_quarantined_naming_the_field(field):
    pair, problem = one({**GOOD, field: "red\x00shoes"})
    assert pair is None and problem["reason"] == "nul_character"
    assert problem["detail"] == f"{field} holds a NUL character (\\x00) at position 3: 'red\\x00shoes'"


def test_a_pair_id_over_256_characters_is_quarantined_naming_it():
    assert one({**GOOD, "pair_id": "p" * 256})[0]["pair_id"] == "p" * 256
    pair, problem = one({**GOOD, "pair_id": "p" * 2**20})
    assert pair is None and problem["reason"] == "text_too_long"
    assert problem["detail"] == "pair_id has 1,048,576 characters, limit 256"


def test_pair_ids_are_text_an_integer_its_digits_anything_else_wrong_type():
    assert one({**GOOD, "pair_id": 1})[0]["pair_id"] == one({**GOOD, "pair_id": "1"})[0]["pair_id"] == "1"
    for value in (1.0, True, [1], {"id": 1}):
        pair, problem = one({**GOOD, "pair_id": value})
        assert pair is None and problem["reason"] == "wrong_type", value
        assert (
            problem["detail"].startswith(f"pair_id is {type(value).__name__} ")
            and "not text or an integer" in problem["detail"]
        )


@pytest.mark.parametrize(
    ("value", "grade"),
    [
        (3, 3),
        ("3", 3),
        (" 2 ", 2),
        (3.0, 3),
        ("٣", None),
        ("1_0", None),
        ("+3", None),
        ("3.0", None),
        ("", "unlabeled"),
    ],
)
def test_a_gold_grade_written_as_text_is_ascii_digits_only(value, grade):
    pair, problem = one({**GOOD, "gold_grade": value}, InputConfig(grades=(0, 1, 2, 3, 10)))
    if grade is None:
        assert (
            pair is None
            and problem["reason"] == "wrong_type"
            and f"gold grade {value!r} is not an integer" == problem["detail"]
        )
    else:
        assert problem is None and pair["gold_grade"] == (None if grade == "unlabeled" else grade)


@pytest.mark.parametrize(
    ("value", "grade"),
    [("2.67", 3), (" 1.5", 1), (1, 0), ("1e0", 0), ("٢.٥", None), ("1_0", None), ("nan", None), (True, None)],
)
def test_a_binned_score_written_as_text_is_an_ascii_number_only(value, grade):
    pair, problem = one({**GOOD, "gold_grade": value}, InputConfig(grade_bins=(1.5, 2.0, 2.5)))
    if grade is None:
        assert pair is None and problem["reason"] == "wrong_type" and "is not a finite number" in problem["detail"]
    else:
        assert problem is None and pair["gold_grade"] == grade


def test_a_utf16_csv_is_refused_with_an_encoding_hint(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("pair_id,query,ad_title\np0,sofa,grey sofa\n", encoding="utf-16")
    with pytest.raises(ContractError, match=r"NUL characters: is the file UTF-16\? Set input.encoding"):
        list(read_raw(InputConfig(path=str(path))))
    config = InputConfig(path=str(path), encoding="utf-16")
    [[row]] = read_raw(config)
    assert validate(row, config)[0]["ad_title"] == "grey sofa"
