"""Stage ``agpo data import`` (also spelled ``agpo data-import``): bring your own labeled query-ad pairs.

Reads CSV / TSV / Parquet / JSONL with the column map, label map (or ``grade_bins``) and quarantine rules of
``agpo annotate`` (pipelines.ads.intake.ingest), only the columns it uses (``import_columns``), optionally joined
with a second table on a key, as ESCI ships it (examples: query, product_id, esci_label, product_locale, split;
products: product_id, product_title, ...), and writes the embedded set's outputs (``agpo data``) in ``out_dir``:

- ``pairs.parquet``: the pairs contract, splits train / audit / test / unlabeled (unlabeled gold hidden);
- ``unlabeled_gold.parquet``: the hidden gold of the unlabeled split (when it has any);
- ``quarantine.parquet``: every bad row with its ingest reason (plus ``join_miss``, ``unknown_split``, and
  ``missing_field`` for a labeled row without a grade) and ``source`` (input or unlabeled), streamed to the file
  ``QUARANTINE_BATCH_ROWS`` rows at a time while the files are read: memory does not grow with their count;
- ``data_summary.json``: rows per split and grade, queries per split, and the row accounting ``rows in = pairs +
  quarantined + filtered``, each counted by reason (filtered: rows of another locale, rows outside
  ``input.split``, unlabeled rows whose query is in a labeled split).

The outputs are one set (``contracts.FileSet``; the import owns these four names in ``out_dir``): staged beside
``out_dir`` and moved in once all are written, removing an earlier import's output it did not write (stale
``unlabeled_gold.parquet``); a failed write (disk full) or a refused import leaves the previous set.

Per row: locale filter -> join -> ``ingest.validate`` -> split value -> grade -> pair_id -> duplicate check.
pair_id: the mapped id column, else ``imp-`` + blake2b(query, ad text, join key). Streams, not whole loads: the
rows so staged (split not yet decided) go to a temp Parquet file in the staging folder; a second pass reads it
back ``FINISH_BATCH_ROWS`` rows at a time, in input order, and in Arrow (no Python row) gives each its query's
split, filters, counts, hides the unlabeled gold and writes the pairs, a row group per batch. Memory holds the
per-query and per-pair_id bookkeeping (``Importer.seen``, ``targets``, distinct queries per split), not rows.

Every row of ``input`` needs a gold grade unless its split column maps (``split_map``) to ``unlabeled``: one
without (null, empty or blank, with or without ``label_map`` / ``grade_bins``) is quarantined as ``missing_field``
naming the grade column (in the file or the joined table) and its value, so no train, audit or test pair lacks
gold. An unlabeled row (the ``unlabeled`` file's, or so marked) whose query lands in a labeled split is filtered.

Splits are carved by query (casefolded, whitespace collapsed), so no query is in two splits. Sorted queries are
shuffled with ``seed`` and cut by ``fractions`` (rounded to whole queries). With a ``split_map`` the file's own
split column decides: a query goes where its rows' values map (a query with rows in two splits goes to the first of
test, audit, unlabeled, train, and is counted); the queries mapped to train are then carved into train and every
split no value maps to, in the ratio of their fractions. ESCI ships train and test only: ``split_map: {train: train,
test: test}`` keeps its test split and carves audit and unlabeled out of its train queries.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.ads.intake.contracts import (
    PAIRS_SCHEMA,
    UNLABELED_GOLD_SCHEMA,
    ContractError,
    FileSet,
    write_tables,
)
from pipelines.ads.intake.data_import_config import SPLITS, DataImportConfig
from pipelines.ads.intake.import_join import JoinedTable, check_columns, import_columns, load_join, row_key
from pipelines.ads.intake.ingest import QUARANTINE_SCHEMA, InputConfig, RawRow, quarantine_row, validate
from pipelines.ads.intake.readers import read_raw, required_sources
from pipelines.io import print_summary
from pipelines.progress import progress_bar

if TYPE_CHECKING:
    from tqdm import tqdm

PRIORITY = ("test", "audit", "unlabeled", "train")  # a query with rows in two splits goes to the first
IMPORT_QUARANTINE_SCHEMA = QUARANTINE_SCHEMA.append(pa.field("source", pa.string(), nullable=False))
OUTPUTS = {k: f"{k}.parquet" for k in ("pairs", "unlabeled_gold", "quarantine")} | {"summary": "data_summary.json"}
QUARANTINE_BATCH_ROWS = 2048  # quarantine rows written at a time: at most ~5 KiB each, ~10 MiB a batch
FIRST_SHOWN = 3  # quarantine rows a refused import quotes
STAGED_SCHEMA = PAIRS_SCHEMA.append(pa.field("group", pa.string(), nullable=False)).append(
    pa.field("source", pa.string(), nullable=False)
)
SOURCES = ("input", "unlabeled")
# temp files in the FileSet's staging folder (removed with it, never committed): the staged pairs, split not yet
# decided, and the hidden unlabeled gold until it is copied into its output
STAGED_NAME, HIDDEN_NAME = ".staged_pairs.parquet", ".staged_unlabeled_gold.parquet"
FINISH_BATCH_ROWS = 16_384  # staged rows read back, split, counted and written at a time (~4 MiB of text)


class Importer:
    """Reads the files row by row into staged pairs (split not yet decided; streamed to ``staged`` a batch at a
    time), quarantine rows and counts."""

    def __init__(self, config: DataImportConfig, joined: JoinedTable | None, staged: pq.ParquetWriter) -> None:
        self.config, self.joined = config, joined
        self.staged = staged
        self.quarantine: list[dict[str, Any]] = []  # the rows not yet written (``quarantine_batches``)
        self.quarantined: Counter[str] = Counter()  # by reason
        self.first_quarantined: list[dict[str, Any]] = []  # the first FIRST_SHOWN, for a refusal to quote
        self.rows_in: Counter[str] = Counter()
        self.per_file: dict[str, Counter[str]] = {}  # source, or source:part of a dataset -> rows in, quarantined
        self.filtered: Counter[str] = Counter()
        self.targets: dict[str, set[str | None]] = {}  # query group -> the splits its input rows map to
        self.seen: dict[str, int] = {}  # pair_id -> its first row: row number * 2 + SOURCES.index(source)

    def quarantine_batches(self, bar: tqdm) -> Iterator[pa.Table]:
        """Read the input (and the unlabeled file), staging their pairs, and yield their quarantine rows as
        tables of QUARANTINE_BATCH_ROWS rows (the last one fewer), for ``write_tables`` to stream to disk."""
        for source, input_config in (("input", self.config.input), ("unlabeled", self.config.unlabeled)):
            if input_config is None:
                continue
            for _ in self.read(input_config, source, bar):
                if len(self.quarantine) >= QUARANTINE_BATCH_ROWS:
                    yield self._quarantine_table()
        if self.quarantine:
            yield self._quarantine_table()

    def _quarantine_table(self) -> pa.Table:
        table = pa.Table.from_pylist(self.quarantine, schema=IMPORT_QUARANTINE_SCHEMA)
        self.quarantine = []
        return table

    def read(self, input_config: InputConfig, source: str, bar: tqdm) -> Iterator[None]:
        """Read one file, a batch at a time (yields after each), into staged pairs, quarantine rows and counts."""
        if self.joined is None:
            required = required_sources(input_config)
        else:  # the ad text may come from the joined table: check_columns looks at both
            required = [input_config.source("query"), *self.config.join.on]
        if self.config.split_map and source == "input":
            required.append(input_config.source("split"))
        checked = False
        for batch in read_raw(input_config, required=required, columns=import_columns(self.config, input_config)):
            first = None if checked else next((row for row in batch if row.problem is None), None)
            if first is not None:
                check_columns(self._joined(first) or first, self.config, input_config, self.joined, source == "input")
                checked = True
            for row in batch:
                self.per_file.setdefault(file_key(source, row), Counter())["in"] += 1
            staged = [p for p in (self.accept(row, input_config, source) for row in batch) if p is not None]
            if staged:
                self.staged.write_table(pa.Table.from_pylist(staged, schema=STAGED_SCHEMA))
            self.rows_in[source] += len(batch)
            bar.update(len(batch))
            yield

    def _joined(self, row: RawRow) -> RawRow | None:
        if self.joined is None:
            return row
        key = row_key(row.values, self.config.join.on)
        if key is None or key not in self.joined.rows:
            return None
        product, problem = self.joined.rows[key]
        return RawRow(row.number, {**product, **row.values}, row.problem or problem, row.part)

    def accept(self, row: RawRow, input_config: InputConfig, source: str) -> dict[str, Any] | None:
        """The staged pair of one input row, or None (quarantined or filtered, and counted)."""
        config = self.config
        if config.locale is not None and row.values.get(config.locale_column, config.locale) != config.locale:
            self.filtered["locale"] += 1
            return None
        joined = self._joined(row)
        if joined is None:
            key = row_key(row.values, config.join.on)
            if key in self.joined.other_locale:
                self.filtered["locale"] += 1
                return None
            on = dict(zip(config.join.on, (row.values.get(c) for c in config.join.on), strict=True))
            return self._quarantine(row, source, "join_miss", f"{on} is not in {config.join.path}")
        pair, problem = validate(joined, input_config)
        if problem is not None:
            return self._add_quarantined({**problem, "source": source}, file_key(source, row))
        if pair is None:
            self.filtered["split_filter"] += 1  # input.split keeps one split only
            return None
        target: str | None = "unlabeled" if source == "unlabeled" else None
        if config.split_map and source == "input":
            value = joined.values.get(input_config.source("split"))
            if value is None or str(value) not in config.split_map:
                detail = (
                    f"split {value!r} ({input_config.source('split')}) is not in split_map {sorted(config.split_map)}"
                )
                return self._quarantine(joined, source, "unknown_split", detail)
            target = config.split_map[str(value)]
        if source == "input" and pair["gold_grade"] is None and target != "unlabeled":
            column = input_config.source("gold_grade")
            detail = (
                f"gold_grade ({column}) is {joined.values.get(column)!r} in a labeled row: grade it, or map its "
                "split value to unlabeled with split_map"
            )
            return self._quarantine(joined, source, "missing_field", detail)
        if "pair_id" not in input_config.columns and input_config.source("pair_id") not in joined.values:
            key = row_key(joined.values, config.join.on) if self.joined else ()
            text = "\x1f".join((pair["query"], pair["ad_title"], *(key or ())))
            pair["pair_id"] = (
                "imp-" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=10).hexdigest()
            )
        here = row.number * 2 + SOURCES.index(source)  # an int, not a tuple: ~60 bytes less per pair
        first = self.seen.setdefault(pair["pair_id"], here)
        if first != here:
            detail = f"pair_id {pair['pair_id']!r} first seen at row {first // 2} of {SOURCES[first % 2]}"
            return self._quarantine(joined, source, "duplicate_pair_id", detail)
        if config.attributes:
            found = {c: joined.values[c] for c in config.attributes if joined.values.get(c) not in (None, "")}
            pair["ad_attributes"] = json.dumps(found, ensure_ascii=False) if found else None
        group = query_group(pair["query"])
        if source == "input":
            self.targets.setdefault(group, set()).add(target)
        return {**pair, "split": target or "", "group": group, "source": source}

    def _quarantine(self, row: RawRow, source: str, reason: str, detail: str) -> None:
        return self._add_quarantined({**quarantine_row(row, reason, detail), "source": source}, file_key(source, row))

    def _add_quarantined(self, record: dict[str, Any], file: str) -> None:
        self.per_file[file]["quarantined"] += 1
        self.quarantine.append(record)
        self.quarantined[record["reason"]] += 1
        if len(self.first_quarantined) < FIRST_SHOWN:
            self.first_quarantined.append(record)


def file_key(source: str, row: RawRow) -> str:
    """Where a row came from, for the per-file row accounting: its source (input, unlabeled), and the part file
    of a dataset."""
    return f"{source}:{row.part}" if row.part else source


def query_group(query: str) -> str:
    """Queries that differ only in case or spacing are one query for the split."""
    return " ".join(query.casefold().split())


def assign_splits(targets: dict[str, set[str | None]], config: DataImportConfig) -> tuple[dict[str, str], int]:
    """Query group -> split, and how many groups the file put in two splits."""
    assigned: dict[str, str] = {}
    pool: list[str] = []
    conflicts = 0
    for group, wanted in targets.items():
        fixed = [s for s in PRIORITY if s in wanted]  # None (no split_map): the pool
        conflicts += len(fixed) > 1
        if not fixed or fixed[0] == "train":
            pool.append(group)
        else:
            assigned[group] = fixed[0]
    carved = ["train"] + [s for s in SPLITS if s != "train" and s not in config.split_map.values()]
    weights = [config.fractions.get(s, 0.0) for s in carved]
    pool.sort()
    random.Random(config.seed).shuffle(pool)
    start, cumulative = 0, 0.0
    for split, weight in zip(carved, weights, strict=True):
        cumulative += weight
        end = len(pool) if split == carved[-1] else round(len(pool) * cumulative / sum(weights))
        assigned.update((group, split) for group in pool[start:end])
        start = end
    return assigned, conflicts


class Distinct:
    """The distinct strings of many batches, held as Arrow arrays (the text and 8 bytes each, no Python object
    per value): each batch's unique values wait, and are merged into one unique array once they outgrow it."""

    def __init__(self) -> None:
        self.merged = pa.array([], pa.large_string())
        self.waiting: list[pa.Array] = []
        self.waiting_values = 0

    def add(self, values: pa.ChunkedArray | pa.Array) -> None:
        unique = pc.unique(values.cast(pa.large_string()))
        self.waiting.append(unique)
        self.waiting_values += len(unique)
        if self.waiting_values > max(len(self.merged), FINISH_BATCH_ROWS):
            self._merge()

    def _merge(self) -> None:
        if self.waiting:
            self.merged = pc.unique(pa.chunked_array([self.merged, *self.waiting], pa.large_string()))
            self.waiting, self.waiting_values = [], 0

    def __len__(self) -> int:
        self._merge()
        return len(self.merged)


class Finish:
    """The second pass over the staged pairs, FINISH_BATCH_ROWS at a time, in their input order: each row gets its
    query's split, an unlabeled row in a labeled split is filtered, the rows per split and grade and the queries
    per split are counted, the unlabeled gold is moved out (to ``hidden``), and the pairs are yielded."""

    def __init__(self, importer: Importer, config: DataImportConfig, staged: Path, hidden: Path) -> None:
        self.importer, self.staged, self.hidden = importer, staged, hidden
        assigned, self.conflicts = assign_splits(importer.targets, config)
        self.groups = pa.array(list(assigned), pa.string())
        self.splits = pa.array(list(assigned.values()), pa.string())
        self.pairs = 0
        self.hidden_rows = 0
        self.per_split_grade: Counter[tuple[str, int | None]] = Counter()
        self.queries: dict[str, Distinct] = {}  # split -> its query groups, splits in order of first appearance

    def pairs_batches(self) -> Iterator[pa.Table]:
        """The pairs tables (PAIRS_SCHEMA, unlabeled gold hidden), for ``write_tables`` to stream to disk."""
        with pq.ParquetWriter(self.hidden, UNLABELED_GOLD_SCHEMA) as hidden:
            for batch in pq.ParquetFile(self.staged).iter_batches(batch_size=FINISH_BATCH_ROWS):
                table = self._split(pa.Table.from_batches([batch]))
                if table.num_rows:
                    self._count(table)
                    pairs, gold = hide_gold(table)
                    if gold.num_rows:
                        hidden.write_table(gold)
                        self.hidden_rows += gold.num_rows
                    yield pairs

    def hidden_batches(self) -> Iterator[pa.Table]:
        """The hidden unlabeled gold, read back FINISH_BATCH_ROWS rows at a time."""
        for batch in pq.ParquetFile(self.hidden).iter_batches(batch_size=FINISH_BATCH_ROWS):
            yield pa.Table.from_batches([batch]).cast(UNLABELED_GOLD_SCHEMA)

    def _split(self, staged: pa.Table) -> pa.Table:
        """The staged rows with their split, less the unlabeled rows in a labeled split (counted as filtered)."""
        found = pc.take(self.splits, pc.index_in(staged["group"], value_set=self.groups))
        split = pc.fill_null(found, "unlabeled")  # a query only the unlabeled file has is unlabeled
        graded = pc.and_(pc.equal(staged["source"], "input"), pc.is_valid(staged["gold_grade"]))
        keep = pc.or_(graded, pc.equal(split, "unlabeled"))
        table = staged.set_column(staged.schema.get_field_index("split"), "split", split).filter(keep)
        self.importer.filtered["query_in_labeled_split"] += staged.num_rows - table.num_rows
        return table

    def _count(self, table: pa.Table) -> None:
        """Rows per split and grade (the unlabeled gold still in) and the query groups per split."""
        self.pairs += table.num_rows
        counts = table.group_by(["split", "gold_grade"], use_threads=False).aggregate([([], "count_all")])
        columns = (counts[name].to_pylist() for name in ("split", "gold_grade", "count_all"))
        for split, grade, n in zip(*columns, strict=True):
            self.per_split_grade[split, grade] += n
        for split in pc.unique(table["split"]).to_pylist():
            self.queries.setdefault(split, Distinct()).add(table.filter(pc.equal(table["split"], split))["group"])


def hide_gold(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """``contracts.hide_unlabeled_gold`` and ``contracts.pairs_table`` on a table: (the pairs with PAIRS_SCHEMA,
    the gold grade of every ``unlabeled`` row set to null, and that gold with UNLABELED_GOLD_SCHEMA, rows that
    had none not listed)."""
    unlabeled = pc.equal(table["split"], "unlabeled")
    gold = table.filter(pc.and_(unlabeled, pc.is_valid(table["gold_grade"]))).select(UNLABELED_GOLD_SCHEMA.names)
    grade = pc.if_else(unlabeled, pa.scalar(None, pa.int8()), table["gold_grade"])
    pairs = table.set_column(table.schema.get_field_index("gold_grade"), "gold_grade", grade)
    return pairs.select(PAIRS_SCHEMA.names).cast(PAIRS_SCHEMA), gold.cast(UNLABELED_GOLD_SCHEMA)


def run(config: DataImportConfig) -> dict[str, Path]:
    joined = load_join(config)
    with FileSet(config.out_dir, owned=OUTPUTS.values()) as outputs:
        staged, hidden = outputs.path(STAGED_NAME), outputs.path(HIDDEN_NAME)
        with pq.ParquetWriter(staged, STAGED_SCHEMA, compression="lz4") as writer:
            importer = Importer(config, joined, writer)
            with progress_bar(desc="data import", unit="row", mininterval=1.0) as bar:
                batches = importer.quarantine_batches(bar)
                write_tables(batches, IMPORT_QUARANTINE_SCHEMA, outputs.path(OUTPUTS["quarantine"]))
        finish = Finish(importer, config, staged, hidden)
        pairs = finish.pairs_batches()
        try:
            write_tables(pairs, PAIRS_SCHEMA, outputs.path(OUTPUTS["pairs"]))
        finally:
            pairs.close()
        staged.unlink()
        summary = make_summary(importer, finish, config, joined)
        check_usable(summary, config, importer.first_quarantined)
        if finish.hidden_rows:
            write_tables(finish.hidden_batches(), UNLABELED_GOLD_SCHEMA, outputs.path(OUTPUTS["unlabeled_gold"]))
        outputs.write(OUTPUTS["summary"], summary)
        written = outputs.commit(name for name in OUTPUTS.values() if outputs.path(name).exists())  # summary last
    paths = {key: written[name] for key, name in OUTPUTS.items() if name in written}
    counts = summary["rows"]
    print_summary(
        f"data import: {counts['in']:,} rows in -> {counts['pairs']:,} pairs {summary['per_split']}, "
        f"{counts['quarantined']:,} quarantined {summary['quarantined_by_reason']}, "
        f"{counts['filtered']:,} filtered {summary['filtered_by_reason']}",
        paths,
    )
    return paths


def check_usable(summary: dict[str, Any], config: DataImportConfig, first_quarantined: list[dict[str, Any]]) -> None:
    """Refuse, before the outputs are moved in, an import no stage can use: no pairs at all (the first
    quarantined rows say why). A labeled split's pairs all have a grade (module docstring)."""
    counts = summary["rows"]
    if not counts["pairs"]:
        first = "; ".join(f"row {q['row_number']} {q['reason']}: {q['detail']}" for q in first_quarantined)
        raise ContractError(
            f"no pairs came out of {config.input.path}: {counts['in']:,} rows in, {counts['quarantined']:,} "
            f"quarantined {summary['quarantined_by_reason']}, {counts['filtered']:,} filtered "
            f"{summary['filtered_by_reason']}" + (f" (first: {first})" if first else "") + "; nothing was written"
        )


def make_summary(
    importer: Importer,
    finish: Finish,
    config: DataImportConfig,
    joined: JoinedTable | None,
) -> dict[str, Any]:
    """Rows per split and grade (unlabeled: the hidden gold) and the row accounting, checked."""
    counts = {
        "in": sum(importer.rows_in.values()),
        "pairs": finish.pairs,
        "quarantined": sum(importer.quarantined.values()),
        "filtered": sum(importer.filtered.values()),
    }
    per_file = importer.per_file.values()
    if (
        sum(n["in"] for n in per_file) != counts["in"]
        or sum(n["quarantined"] for n in per_file) != counts["quarantined"]
    ):
        raise RuntimeError(f"row accounting per file failed: {dict(importer.per_file)} against {counts}")
    if counts["in"] != counts["pairs"] + counts["quarantined"] + counts["filtered"]:
        raise RuntimeError(f"row accounting failed: {counts}; pairs + quarantined + filtered must equal in")
    per_grade = {
        split: {
            "null" if g is None else str(g): n
            for g, n in sorted(((g, n) for (s, g), n in finish.per_split_grade.items() if s == split), key=_grade_order)
        }
        for split in SPLITS
    }
    return {
        "rows": counts,
        "rows_in_per_file": dict(importer.rows_in),
        # per file (a dataset's parts each): rows in = quarantined + kept (a pair, or filtered)
        "rows_per_file": {
            file: {"in": n["in"], "quarantined": n["quarantined"], "kept": n["in"] - n["quarantined"]}
            for file, n in importer.per_file.items()
        },
        "quarantined_by_reason": dict(importer.quarantined),
        "filtered_by_reason": {k: v for k, v in importer.filtered.items() if v},
        "per_split": {split: sum(per_grade[split].values()) for split in SPLITS if per_grade[split]},
        "per_split_grade": per_grade,
        "queries_per_split": {split: len(groups) for split, groups in finish.queries.items()},
        "queries_in_two_file_splits": finish.conflicts,
        "join_duplicate_keys": joined.duplicate_keys if joined else 0,
        "fractions": config.fractions,
        "split_map": config.split_map,
        "seed": config.seed,
    }


def _grade_order(item: tuple[int | None, int]) -> tuple[bool, int]:
    return item[0] is None, item[0] or 0
