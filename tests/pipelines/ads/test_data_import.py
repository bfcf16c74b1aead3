"""``agpo data import``: ESCI-shaped examples + products (join, locale filter, the file's split column),
a Home-Depot-shaped latin-1 CSV (float relevance binned into grades), splits by query, the row accounting,
the pairs contract, and the CLI (``agpo data import`` is ``agpo data-import``)."""

import errno
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake.contracts import ContractError, labeled_splits, read_pairs
from pipelines.ads.intake.data_import import query_group, run
from pipelines.ads.intake.data_import_config import DataImportConfig, JoinConfig
from pipelines.ads.intake.ingest import InputConfig
from pipelines.cli import main
from pipelines.config import ConfigError, load_config
from pipelines.io import temp_path

ESCI_LABELS = {"E": 3, "S": 2, "C": 1, "I": 0}
REAL_ESCI = Path("/work/shared/data/esci_sample/esci_us_judgments_flat.tsv")
BRANDS = ("DEWALT", "Bosch", "Hamilton Beach", "Anker", "Nike")
QUERIES = (
    "cordless drill 20v",
    "drill",
    "usb c charger 65w",
    "blender",
    "running shoes men size 10",
    "4x8 plywood 3/4 in",
    "waterproof hiking boots women",
    "coffee maker 12 cup",
    "led bulbs 60 watt equivalent",
    "garden hose 50 ft",
)


def write_esci(tmp_path: Path) -> tuple[Path, Path]:
    """Examples (Parquet) and products (CSV): us and es locales, train/test splits, and bad rows."""
    examples, products = [], []
    for q in range(40):
        query = f"{QUERIES[q % len(QUERIES)]} {q}" if q >= len(QUERIES) else QUERIES[q]
        split = "test" if q % 4 == 0 else "train"
        for k, label in enumerate("ESCI"):
            pid = f"B{q:03d}{k}"
            brand = BRANDS[(q + k) % len(BRANDS)]
            title = f"{brand} {query.title()} - Model {q}{k}, 2-Pack, 12 oz (340 g), Black"
            products.append({"product_id": pid, "product_title": title, "product_brand": brand, "product_locale": "us"})
            examples.append({"example_id": len(examples), "query": query, "product_id": pid, "esci_label": label})
            examples[-1] |= {"product_locale": "us", "split": split}
    for k in range(6):  # another locale: filtered, not quarantined
        pid = f"ES{k}"
        products.append(
            {"product_id": pid, "product_title": f"Taladro {k}", "product_brand": "", "product_locale": "es"}
        )
        examples.append({"example_id": len(examples), "query": "taladro", "product_id": pid, "esci_label": "E"})
        examples[-1] |= {"product_locale": "es", "split": "train"}
    products.append(
        {"product_id": "BLONG", "product_title": "x" * 3000, "product_brand": "Acme", "product_locale": "us"}
    )
    bad = [
        {"query": "missing product", "product_id": "NOPE", "esci_label": "E"},  # join_miss
        {"query": None, "product_id": "B0000", "esci_label": "E"},  # missing_field
        {"query": "long title", "product_id": "BLONG", "esci_label": "S"},  # text_too_long
        {"query": "odd label", "product_id": "B0001", "esci_label": "X"},  # unknown_grade
    ]
    for row in bad:
        examples.append({"example_id": len(examples), **row, "product_locale": "us", "split": "train"})
    pq.write_table(pa.Table.from_pylist(examples), tmp_path / "examples.parquet")
    pyarrow.csv.write_csv(pa.Table.from_pylist(products), tmp_path / "products.csv")
    return tmp_path / "examples.parquet", tmp_path / "products.csv"


def esci_config(tmp_path: Path, **changes) -> DataImportConfig:
    examples, products = write_esci(tmp_path)
    config = DataImportConfig(
        input=InputConfig(
            path=str(examples),
            columns={"pair_id": "example_id", "ad_title": "product_title", "gold_grade": "esci_label"},
            label_map=ESCI_LABELS,
        ),
        join=JoinConfig(path=str(products), on=("product_id",)),
        locale="us",
        attributes=("product_brand",),
        split_map={"train": "train", "test": "test"},
        seed=3,
        out_dir=str(tmp_path / "out"),
    )
    return replace(config, **changes)


def queries_per_split(pairs: pa.Table) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for row in pairs.select(["query", "split"]).to_pylist():
        out.setdefault(row["split"], set()).add(query_group(row["query"]))
    return out


def assert_disjoint(pairs: pa.Table) -> None:
    groups = queries_per_split(pairs)
    for a in groups:
        for b in groups:
            assert a == b or not groups[a] & groups[b], (a, b, groups[a] & groups[b])


def test_esci_join_locale_split_column_and_accounting(tmp_path):
    paths = run(esci_config(tmp_path))
    pairs = read_pairs(paths["pairs"])  # the contract
    summary = json.loads(paths["summary"].read_text())
    quarantine = pq.read_table(paths["quarantine"]).to_pylist()
    rows = summary["rows"]
    assert rows["in"] == 40 * 4 + 6 + 4 == rows["pairs"] + rows["quarantined"] + rows["filtered"]
    assert summary["filtered_by_reason"] == {"locale": 6}
    reasons = {q["reason"]: q["detail"] for q in quarantine}
    assert summary["quarantined_by_reason"] == {r: 1 for r in reasons} and len(reasons) == 4
    assert "'NOPE'" in reasons["join_miss"] and "products.csv" in reasons["join_miss"]
    assert "query" in reasons["missing_field"]
    assert "ad_title has 3000 characters" in reasons["text_too_long"]
    assert "'X'" in reasons["unknown_grade"]
    # the join fills ad_title and ad_attributes from the products table; ids come from example_id
    first = pairs.filter(pa.compute.equal(pairs["pair_id"], "0")).to_pylist()[0]
    assert first["ad_title"].startswith("DEWALT Cordless Drill 20V") and json.loads(first["ad_attributes"]) == {
        "product_brand": "DEWALT"
    }
    assert "taladro" not in pairs["query"].to_pylist()
    # the file's split column: its test queries stay test; audit and unlabeled come out of train
    by_query = {r["query"]: r["split"] for r in pairs.to_pylist()}
    for q in range(40):
        query = f"{QUERIES[q % len(QUERIES)]} {q}" if q >= len(QUERIES) else QUERIES[q]
        assert (by_query[query] == "test") == (q % 4 == 0), query
    assert_disjoint(pairs)
    train_queries = 30  # the file's train queries, carved 0.7 : 0.1 : 0.1
    assert summary["queries_per_split"]["test"] == 10
    assert summary["queries_per_split"]["train"] == round(train_queries * 0.7 / 0.9)
    assert summary["queries_per_split"]["audit"] == round(train_queries * 0.8 / 0.9) - round(train_queries * 0.7 / 0.9)
    # unlabeled gold is hidden in pairs and kept in unlabeled_gold
    unlabeled = pairs.filter(pa.compute.equal(pairs["split"], "unlabeled"))
    assert unlabeled.num_rows and unlabeled["gold_grade"].null_count == unlabeled.num_rows
    gold = pq.read_table(paths["unlabeled_gold"])
    assert sorted(gold["pair_id"].to_pylist()) == sorted(unlabeled["pair_id"].to_pylist())
    assert Counter(gold["gold_grade"].to_pylist()) == Counter(
        {g: unlabeled.num_rows // 4 for g in (0, 1, 2, 3)}
    )  # every query has E, S, C, I
    train, audit = labeled_splits(pairs.to_pylist(), paths["pairs"], None, None)
    assert len(train) == summary["per_split"]["train"] and len(audit) == summary["per_split"]["audit"]
    assert summary["per_split_grade"]["test"] == {str(g): 10 for g in range(4)}


def test_carving_without_a_split_column_is_seeded_and_within_rounding(tmp_path):
    config = esci_config(tmp_path, split_map={}, fractions={"train": 0.6, "audit": 0.2, "test": 0.1, "unlabeled": 0.1})
    first = read_pairs(run(config)["pairs"])
    again = read_pairs(run(replace(config, out_dir=str(tmp_path / "again")))["pairs"])
    other = read_pairs(run(replace(config, seed=4, out_dir=str(tmp_path / "other")))["pairs"])
    assert first.equals(again) and not first.equals(other)
    assert_disjoint(first)
    groups = queries_per_split(first)
    total = sum(len(g) for g in groups.values())
    assert total == 40  # the queries of quarantined rows count nowhere
    for split, share in config.fractions.items():
        assert abs(len(groups[split]) - share * total) <= 1, (split, len(groups[split]))


def test_home_depot_latin1_csv_with_binned_float_relevance(tmp_path):
    lines = ["id,product_uid,product_title,search_term,relevance"]
    scores = ["3.0", "2.67", "2.33", "2.0", "1.67", "1.33", "1.0", "2.5", "1.5"]
    queries = ["angle bracet", "deckover", "toliet", "1/2 in. pvc pipe", "paint", "drill", "gril", "door", "sink"]
    for i, (score, query) in enumerate(zip(scores, queries, strict=True)):
        lines.append(
            f'{100001 + i},{1000 + i},"Simpson Strong-Tie 12-Gauge 90° Angle, 1½ in. x 1½ in. Caf\xe9",{query},{score}'
        )
    lines.append(f"{100099},1099,Some title,sink,not-a-number")
    path = tmp_path / "train.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    config = DataImportConfig(
        input=InputConfig(
            path=str(path),
            encoding="latin-1",
            columns={"pair_id": "id", "query": "search_term", "ad_title": "product_title", "gold_grade": "relevance"},
            grade_bins=(1.5, 2.0, 2.5),
        ),
        fractions={"train": 1.0},
        out_dir=str(tmp_path / "out"),
    )
    paths = run(config)
    pairs = {r["pair_id"]: r for r in read_pairs(paths["pairs"]).to_pylist()}
    grades = [pairs[str(100001 + i)]["gold_grade"] for i in range(len(scores))]
    assert grades == [3, 3, 2, 2, 1, 0, 0, 3, 1]
    assert "90° Angle, 1½ in." in pairs["100001"]["ad_title"] and pairs["100001"]["ad_title"].endswith("Café")
    [bad] = pq.read_table(paths["quarantine"]).to_pylist()
    assert bad["reason"] == "wrong_type" and "'not-a-number'" in bad["detail"]
    # the same bytes read as utf-8: every row quarantines (latin-1 bytes, or no number), so nothing is written
    with pytest.raises(ContractError, match=r"no pairs came out .* \{'undecodable_bytes': 9, 'wrong_type': 1\}"):
        run(replace(config, input=replace(config.input, encoding="utf-8"), out_dir=str(tmp_path / "utf8")))
    assert not (tmp_path / "utf8").exists()


def jsonl_import(tmp_path, rows, columns):
    """An import of ``rows`` written as JSONL, mapped by ``columns``, all into the train split."""
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return DataImportConfig(
        input=InputConfig(path=str(path), columns=columns), fractions={"train": 1.0}, out_dir=str(tmp_path / "out")
    )


def test_hashed_pair_ids_are_stable_and_duplicates_quarantine(tmp_path):
    rows = [
        {"query": "usb c cable", "title": "Anker USB-C Cable 6 ft", "grade": 3},
        {"query": "usb c cable", "title": "Anker USB-C Cable 6 ft", "grade": 2},
        {"query": "mug", "title": "Ceramic Mug 350 ml", "grade": 0},
    ]
    config = jsonl_import(tmp_path, rows, {"ad_title": "title", "gold_grade": "grade"})
    paths = run(config)
    ids = read_pairs(paths["pairs"])["pair_id"].to_pylist()
    assert len(ids) == 2 and all(i.startswith("imp-") for i in ids)
    assert read_pairs(run(replace(config, out_dir=str(tmp_path / "again")))["pairs"])["pair_id"].to_pylist() == ids
    [dup] = pq.read_table(paths["quarantine"]).to_pylist()
    assert dup["reason"] == "duplicate_pair_id" and "first seen at row 0" in dup["detail"]


def test_an_unlabeled_file_joins_the_unlabeled_split(tmp_path):
    config = esci_config(tmp_path)
    path = tmp_path / "unlabeled.csv"
    path.write_text("query,product_id\nfresh query,B0002\ndrill,B0003\n")  # "drill" is a labeled query
    paths = run(replace(config, unlabeled=InputConfig(path=str(path), columns={"ad_title": "product_title"})))
    pairs = read_pairs(paths["pairs"])
    fresh = pairs.filter(pa.compute.equal(pairs["query"], "fresh query")).to_pylist()
    assert [r["split"] for r in fresh] == ["unlabeled"] and fresh[0]["ad_title"].startswith("Hamilton Beach Cordless")
    summary = json.loads(paths["summary"].read_text())
    drill_split = {r["split"] for r in pairs.to_pylist() if r["query"] == "drill"}
    assert summary["filtered_by_reason"].get("query_in_labeled_split", 0) == (drill_split != {"unlabeled"})
    assert_disjoint(pairs)


def test_config_and_input_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="summing to 1"):
        DataImportConfig(fractions={"train": 0.5})
    with pytest.raises(ValueError, match="grade_bins needs 3 edges"):
        InputConfig(grade_bins=(1.5, 2.5))
    with pytest.raises(ValueError, match="either label_map or grade_bins"):
        InputConfig(grade_bins=(1.5, 2.0, 2.5), label_map={"a": 1})
    with pytest.raises(ConfigError, match="encoding"):
        load_config(DataImportConfig, overrides=["input.encoding=klingon"])
    config = esci_config(tmp_path)
    with pytest.raises(ContractError, match=r"no column.*'title'.*input\.columns"):
        run(replace(config, input=replace(config.input, columns={**config.input.columns, "ad_title": "title"})))


def test_agpo_data_import_alias_runs_the_stage(tmp_path, capsys):
    config = esci_config(tmp_path)
    overrides = [
        f"input.path={config.input.path}",
        "input.columns={pair_id: example_id, ad_title: product_title, gold_grade: esci_label}",
        "input.label_map={E: 3, S: 2, C: 1, I: 0}",
        f"join.path={config.join.path}",
        "locale=us",
        "split_map={train: train, test: test}",
        f"out_dir={tmp_path / 'cli'}",
    ]
    assert main(["data", "import", *[a for o in overrides for a in ("--set", o)]]) == 0
    assert "data import: 170 rows in -> 160 pairs" in capsys.readouterr().out
    for name in ("pairs.parquet", "unlabeled_gold.parquet", "quarantine.parquet", "data_summary.json"):
        assert (tmp_path / "cli" / name).is_file(), name
    assert main(["data", "import", "--set", f"input.path={tmp_path / 'none.parquet'}"]) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", r"empty\.csv is an empty file \(0 bytes\)"),
        ("query,ad_title\n", r"no pairs came out of .*empty\.csv: 0 rows in"),
        (
            "query,ad_title\nred shoes,nike red shoes\nblue hat,a blue hat\nphone case,iphone case\n",
            r"no column\(s\) \['gold_grade'\] in .*empty\.csv \(columns: \['ad_title', 'query'\]\); map them",
        ),
        ("query,ad_title,gold_grade\nred shoes,nike red shoes,x\n", r"no pairs came out of .* 1 quarantined"),
    ],
    ids=["zero-bytes", "header-only", "no-grade-column", "every-row-quarantined"],
)
def test_unusable_data_exits_1_with_what_is_wrong_and_writes_nothing(tmp_path, capsys, content, message):
    (tmp_path / "empty.csv").write_text(content)
    out = tmp_path / "out"
    assert main(["data", "import", "--set", f"input.path={tmp_path / 'empty.csv'}", "--set", f"out_dir={out}"]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.skipif(not REAL_ESCI.is_file(), reason="the ESCI sample is not on this machine")
def test_real_esci_judgments_rating_map_and_query_splits(tmp_path):
    """The sample has query, product_id and rating 100/10/1/0 but no product text: the product id stands in
    for the ad title, enough to check the rating map and the split by query on real queries."""
    config = DataImportConfig(
        input=InputConfig(
            path=str(REAL_ESCI),
            columns={"ad_title": "product_id", "gold_grade": "rating"},
            label_map={"100.0": 3, "10.0": 2, "1.0": 1, "0.0": 0},
        ),
        join=JoinConfig(on=("product_id",)),  # no join table: the key still enters the pair_id hash
        out_dir=str(tmp_path / "out"),
    )
    paths = run(config)
    pairs = read_pairs(paths["pairs"])
    summary = json.loads(paths["summary"].read_text())
    assert summary["rows"]["in"] == 6678 and summary["rows"]["pairs"] + summary["rows"]["quarantined"] == 6678
    assert_disjoint(pairs)
    labeled = [s for s in ("train", "audit", "test") for g in summary["per_split_grade"][s]]
    assert set(labeled) == {"train", "audit", "test"}
    gold = Counter(pq.read_table(paths["unlabeled_gold"])["gold_grade"].to_pylist())
    assert set(gold) <= {0, 1, 2, 3} and sum(summary["queries_per_split"].values()) == 150


@pytest.mark.integration
def test_agpo_data_import_command_in_a_subprocess(tmp_path):
    config = esci_config(tmp_path)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pipelines.cli", "data", "import"),
            *("--set", f"input.path={config.input.path}", "--set", f"join.path={config.join.path}"),
            *("--set", "input.columns={pair_id: example_id, ad_title: product_title, gold_grade: esci_label}"),
            *("--set", "input.label_map={E: 3, S: 2, C: 1, I: 0}", "--set", f"out_dir={tmp_path / 'cli'}"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "pairs: " in done.stdout and (tmp_path / "cli" / "pairs.parquet").is_file()


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too), by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_reimport_without_hidden_gold_removes_the_stale_unlabeled_gold(tmp_path):
    config = esci_config(tmp_path)
    out = Path(config.out_dir)
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # not an import output: left alone
    assert "unlabeled_gold" in run(config)
    paths = run(replace(config, fractions={"train": 0.8, "audit": 0.1, "test": 0.1}))  # no unlabeled split
    assert "unlabeled_gold" not in paths and not (out / "unlabeled_gold.parquet").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging folder left
    assert sorted(p.name for p in out.iterdir()) == [
        "data_summary.json",
        "notes.txt",
        "pairs.parquet",
        "quarantine.parquet",
    ]
    assert "unlabeled" not in json.loads((out / "data_summary.json").read_text())["per_split"]


@pytest.mark.parametrize("failing_write", [0, 1, 2, 3])
def test_a_disk_full_write_leaves_the_previous_outputs_and_no_temp_files(tmp_path, monkeypatch, failing_write):
    """The writes of a set are quarantine (streamed while the files are read), pairs, unlabeled gold, summary:
    the n-th (from 0) fails with ENOSPC, after leaving a partial temp file, as a full disk does."""
    import pipelines.ads.intake.contracts as contracts
    import pipelines.ads.intake.data_import as data_import

    config = esci_config(tmp_path)
    run(config)
    before = snapshot(tmp_path)
    calls = []

    def failing(real):
        def write(*args):
            path = next(Path(a) for a in args if isinstance(a, (str, Path)))
            if len(calls) == failing_write:
                temp_path(path).write_bytes(b"PAR1 half a file")
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            calls.append(path)
            return real(*args)

        return write

    for module, names in {contracts: ("write_table", "write_json_atomic"), data_import: ("write_tables",)}.items():
        for name in names:
            monkeypatch.setattr(module, name, failing(getattr(module, name)))
    with pytest.raises(OSError, match="No space left"):
        run(replace(config, seed=4))  # another carve: every output would change
    assert len(calls) == failing_write
    assert snapshot(tmp_path) == before  # the old set, byte for byte, and no temp file or staging folder


@pytest.mark.parametrize("first", ["[]", "utf-16"])
def test_a_malformed_first_row_is_quarantined_like_any_other(tmp_path, first):
    good = [json.dumps({"pair_id": f"p{i}", "query": f"query {i}", "ad_title": "lamp", "grade": 2}) for i in range(5)]
    path = tmp_path / "pairs.jsonl"
    if first == "[]":
        path.write_text("\n".join(["[]", *good]) + "\n")
        rows_in, pairs = 6, 5
    else:  # a UTF-16 export: JSONL splits lines as bytes, so it is refused before a row is read, saying how to fix
        path.write_bytes("\n".join(good).encode("utf-16"))
    config = DataImportConfig(
        input=InputConfig(path=str(path), columns={"gold_grade": "grade"}),
        fractions={"train": 1.0},
        out_dir=str(tmp_path / "out"),
    )
    if first == "utf-16":
        with pytest.raises(ContractError, match=r"is UTF-16 or UTF-32 .*Convert it to UTF-8 first, e.g. `iconv"):
            run(config)
        return
    paths = run(config)
    rows = json.loads(paths["summary"].read_text())["rows"]
    assert rows == {"in": rows_in, "pairs": pairs, "quarantined": rows_in - pairs, "filtered": 0}
    quarantine = pq.read_table(paths["quarantine"]).to_pylist()
    assert quarantine[0]["row_number"] == 0 and quarantine[0]["reason"] in ("malformed_record", "undecodable_bytes")
    assert read_pairs(paths["pairs"]).num_rows == pairs


def test_an_integer_and_a_text_pair_id_that_read_alike_are_reported_as_duplicates(tmp_path):
    rows = [
        {"id": 1, "query": "mug", "title": "Ceramic Mug", "gold_grade": 3},
        {"id": "1", "query": "cup", "title": "Paper Cup", "gold_grade": 3},  # the same id once read as text
        {"id": 1.0, "query": "jar", "title": "Glass Jar", "gold_grade": 3},  # a float is not an id
        {"id": "x" * 300, "query": "pan", "title": "Frying Pan", "gold_grade": 3},  # over 256 characters
        {"id": "a\u0000b", "query": "pot", "title": "Stock Pot", "gold_grade": 3},
    ]
    config = jsonl_import(tmp_path, rows, {"pair_id": "id", "ad_title": "title"})
    paths = run(config)
    assert read_pairs(paths["pairs"])["pair_id"].to_pylist() == ["1"]
    quarantine = {q["row_number"]: (q["reason"], q["detail"]) for q in pq.read_table(paths["quarantine"]).to_pylist()}
    assert quarantine == {
        1: ("duplicate_pair_id", "pair_id '1' first seen at row 0 of input"),
        2: ("wrong_type", "pair_id is float 1.0, not text or an integer"),
        3: ("text_too_long", "pair_id has 300 characters, limit 256"),
        4: ("nul_character", "pair_id holds a NUL character (\\x00) at position 1: 'a\\x00b'"),
    }


def test_the_finish_streams_the_pairs_in_batches_and_in_input_order(tmp_path, monkeypatch):
    """The staged pairs are split, counted and written FINISH_BATCH_ROWS at a time (a row group each), never held
    whole: with batches of 3 rows the outputs hold the same rows in the same (input) order, the summary is the
    same byte for byte (queries counted across batches), and the pairs file has a row group per batch."""
    import pipelines.ads.intake.data_import as data_import

    config = esci_config(tmp_path)
    unlabeled = tmp_path / "unlabeled.csv"
    lines = [f"fresh query {i % 7},B{i % 40:03d}{i % 4}" for i in range(60)] + ["drill,B0003", "Fresh  QUERY 1,B0010"]
    unlabeled.write_text("query,product_id\n" + "\n".join(lines) + "\n")
    config = replace(config, unlabeled=InputConfig(path=str(unlabeled), columns={"ad_title": "product_title"}))
    whole = run(replace(config, out_dir=str(tmp_path / "whole")))
    monkeypatch.setattr(data_import, "FINISH_BATCH_ROWS", 3)
    small = replace(config, input=replace(config.input, batch_rows=5), out_dir=str(tmp_path / "batched"))
    batched = run(replace(small, unlabeled=replace(small.unlabeled, batch_rows=5)))
    assert batched["summary"].read_bytes() == whole["summary"].read_bytes()
    summary = json.loads(batched["summary"].read_text())
    assert summary["queries_per_split"]["unlabeled"] >= 7 and summary["per_split_grade"]["unlabeled"]
    for name in ("pairs", "unlabeled_gold", "quarantine"):
        assert pq.read_table(batched[name]).equals(pq.read_table(whole[name])), name
    pairs = pq.ParquetFile(batched["pairs"])
    assert pairs.num_row_groups >= summary["rows"]["pairs"] // 3 > 1
    assert pq.ParquetFile(whole["pairs"]).num_row_groups == 1
    ids = read_pairs(batched["pairs"])["pair_id"].to_pylist()
    labeled = [int(i) for i in ids if i.isdigit()]
    assert labeled == sorted(labeled) and ids.index(str(labeled[-1])) < len(labeled)  # input rows first, in order
