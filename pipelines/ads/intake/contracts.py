"""The Parquet data contracts of docs/design.md, as pyarrow schemas, with readers that check them.

pairs:  pair_id (string, unique), query, ad_title, optional ad_attributes (JSON string), gold_grade
        (int8, nullable), split, optional rationale (a short reason, used by the SFT warm start).

Every file ``write_tables`` writes stores a CRC checksum per page and pages of about 1 MiB (a page is
checked after every ``WRITE_BATCH_ROWS`` values, so one of long texts cannot grow to the whole row group's
size and a streaming reader holds one small page at a time); ``read_pairs`` verifies the checksums, so a
flipped byte is an error naming the file, not a silently different value.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from durable.fileio import fsync_dir, fsync_file
from pipelines.errors import StageFailed
from pipelines.io import remove_temps, require_file, temp_path, write_json_atomic
from pipelines.storage import locate, redact, remove, upload

PAIRS_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("ad_title", pa.string(), nullable=False),
        pa.field("ad_attributes", pa.string()),
        pa.field("gold_grade", pa.int8()),
        pa.field("split", pa.string(), nullable=False),
        pa.field("rationale", pa.string()),
    ]
)
# the gold grades hidden from the unlabeled split, kept to measure annotation quality later
UNLABELED_GOLD_SCHEMA = pa.schema([pa.field("pair_id", pa.string(), nullable=False), pa.field("gold_grade", pa.int8())])
REQUIRED_PAIR_COLUMNS = ("pair_id", "query", "ad_title", "gold_grade", "split")
WRITE_BATCH_ROWS = 16  # values written between two checks of a Parquet page's size (pyarrow's default: 1024)


class ContractError(StageFailed, ValueError):
    """A file does not follow its data contract; the message names the file, column and value."""


COPY_BATCH_ROWS = 2048  # rows per batch of copy_table: quarantine rows of up to ~5 KiB make batches of ~10 MiB


def write_table(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` as Parquet atomically (temp file, fsync, rename)."""
    write_tables([table], table.schema, path)
    return Path(path)


def write_tables(tables: Iterable[pa.Table], schema: pa.Schema, path: str | Path) -> int:
    """Stream ``tables`` into one Parquet file atomically (temp file, fsync, rename; a failed write removes its
    temp file) with page checksums; returns the row count. Memory holds one table at a time."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    rows = 0
    try:
        with pq.ParquetWriter(
            tmp, schema, compression="zstd", write_page_checksum=True, write_batch_size=WRITE_BATCH_ROWS
        ) as writer:
            for table in tables:
                writer.write_table(table)
                rows += table.num_rows
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return rows


def copy_table(source: str | Path, path: str | Path, batch_rows: int = COPY_BATCH_ROWS) -> Path:
    """Parquet file ``source`` written again to ``path`` (``write_tables``) ``batch_rows`` rows at a time, so
    memory holds one batch, never the file (a quarantine can hold millions of rows of up to 4 KiB)."""
    handle = pq.ParquetFile(source)
    schema = handle.schema_arrow
    batches = handle.iter_batches(batch_size=batch_rows)
    write_tables((pa.Table.from_batches([batch], schema) for batch in batches), schema, path)
    return Path(path)


class FileSet:
    """Files that replace the ``owned`` names of folder ``out`` as one set (other files in ``out`` are left
    alone). Inside ``with FileSet(out, owned) as files:`` each file is written (and synced) into a staging folder
    beside ``out``, by ``write`` (a table as Parquet, a dict as JSON) or by the caller at ``path(name)`` (a file
    streamed there, e.g. with ``write_tables``); ``commit`` then moves them in by rename, in the order given (put
    a summary last), and removes every owned name it was not given. Leaving the block without ``commit`` (a
    failed write such as a full disk, a refused input) leaves ``out`` as it was; the staging folder is removed
    either way. What a killed writer left (staging folders of ``out``, temp files of the owned names) is cleared
    by the next set, so one writer at a time per ``out``. The move is renames only, no new bytes: a kill in its
    middle can leave a mix, which the next set replaces.

    ``out`` may be a URI (pipelines.storage): the set is staged in a local temp folder and ``commit`` uploads each
    file whole (an object store shows an object complete or not at all), in the order given, after removing the
    owned names it was not given; a reader that waits for the last file (the summary) sees one set."""

    def __init__(self, out: str | Path, owned: Iterable[str]) -> None:
        self.location = locate(out)
        self.out = Path(out) if self.location.is_local else Path()
        self.owned = tuple(owned)
        self.stage = Path()

    def __enter__(self) -> FileSet:
        if not self.location.is_local:
            self.stage = Path(tempfile.mkdtemp(prefix="agpo-fileset-"))
            return self
        real = self.out.resolve()  # stage beside the real folder (same file system), also for "." or a symlink
        real.parent.mkdir(parents=True, exist_ok=True)
        remove_temps(real.parent, real.name)
        self.stage = temp_path(real)
        self.stage.mkdir()
        return self

    def __exit__(self, *_: object) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)

    def path(self, name: str) -> Path:
        """Where the set's file ``name`` is staged."""
        return self.stage / name

    def write(self, name: str, content: pa.Table | dict[str, Any]) -> Path:
        if isinstance(content, pa.Table):
            return write_table(content, self.path(name))
        return write_json_atomic(self.path(name), content)

    def commit(self, names: Iterable[str]) -> dict[str, Path | str]:
        """Move the staged files ``names`` into ``out`` in this order; returns name -> where it is in ``out``."""
        names = list(names)
        if not self.location.is_local:
            for name in self.owned:
                if name not in names:
                    remove(self.location.child(name))
            for name in names:
                upload(self.path(name), self.location.child(name))
            return {name: redact(self.location.child(name).uri) for name in names}
        self.out.mkdir(parents=True, exist_ok=True)
        for name in self.owned:
            remove_temps(self.out, name)
            if name not in names:
                (self.out / name).unlink(missing_ok=True)
        for name in names:
            os.replace(self.path(name), self.out / name)
        fsync_dir(self.out)
        return {name: self.out / name for name in names}


def hide_unlabeled_gold(rows: list[dict[str, object]]) -> pa.Table:
    """Move the gold grade of every ``unlabeled`` row out of ``rows`` (set to null in place) into an
    ``unlabeled_gold`` table (UNLABELED_GOLD_SCHEMA; rows that had no gold are not listed)."""
    hidden = []
    for row in rows:
        if row["split"] == "unlabeled":
            if row["gold_grade"] is not None:
                hidden.append({"pair_id": row["pair_id"], "gold_grade": row["gold_grade"]})
            row["gold_grade"] = None
    return pa.Table.from_pylist(hidden, schema=UNLABELED_GOLD_SCHEMA)


def pairs_table(rows: list[dict[str, object]]) -> pa.Table:
    """Rows (dicts with the pairs columns) as a table with PAIRS_SCHEMA."""
    return pa.Table.from_pylist(
        [{name: row.get(name) for name in PAIRS_SCHEMA.names} for row in rows], schema=PAIRS_SCHEMA
    )


def read_pairs(path: str | Path, split: str | None = None) -> pa.Table:
    """Read a pairs file (a local path or a URI: pipelines.storage; a folder or prefix of Parquet parts is one
    table), check its columns and types, optionally keep one split."""
    location = locate(path)
    if location.is_local and not Path(location.path).is_dir():
        require_file(location.path, "pairs file", "run `agpo data` first or fix the path", ContractError)
    elif not location.exists():
        raise ContractError(f"pairs {redact(location.uri)} does not exist; run `agpo data` first or fix the path")
    path = redact(location.uri)
    try:
        table = pq.read_table(location.path, filesystem=location.filesystem, page_checksum_verification=True)
    except (pa.ArrowException, OSError) as err:
        raise ContractError(
            f"pairs file {path} is not a readable Parquet file ({type(err).__name__}: {err}); is it truncated or "
            "corrupted? Write it again (`agpo data`, `agpo data import`)"
        ) from None
    missing = [c for c in REQUIRED_PAIR_COLUMNS if c not in table.column_names]
    if missing:
        raise ContractError(f"pairs file {path} lacks column(s) {missing}; it has {table.column_names}")
    try:
        table = table.select([n for n in PAIRS_SCHEMA.names if n in table.column_names]).cast(
            pa.schema([PAIRS_SCHEMA.field(n) for n in PAIRS_SCHEMA.names if n in table.column_names])
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ContractError(f"pairs file {path} has a column of the wrong type: {err}") from None
    _require_unique_ids(path, table)
    if split is not None:
        table = table.filter(pa.compute.equal(table["split"], split))
    return table


def _require_unique_ids(path: Path, table: pa.Table) -> None:
    """A pair_id names one pair in the whole file, across splits: two rows with one id would collapse into one
    wherever pairs are keyed by id (a teacher label of an unlabeled pair training on a test pair's text)."""
    if pa.compute.count_distinct(table["pair_id"], mode="all").as_py() == table.num_rows:
        return
    counts = table.group_by("pair_id").aggregate([("split", "distinct"), ("pair_id", "count")])
    repeated = counts.filter(pa.compute.greater(counts["pair_id_count"], 1))
    shown = [
        f"{r['pair_id']!r} x{r['pair_id_count']} ({', '.join(map(str, r['split_distinct']))})"
        for r in repeated.slice(0, 5).to_pylist()
    ]
    more = f" and {repeated.num_rows - 5} more" if repeated.num_rows > 5 else ""
    raise ContractError(
        f"pairs file {path} repeats {repeated.num_rows} pair_id(s): {'; '.join(shown)}{more}. A pair_id must name "
        "one pair across all splits; give each pair its own id (`agpo data import` quarantines repeats as "
        "duplicate_pair_id)"
    )


def read_gold_pairs(path: str | Path) -> list[dict[str, object]]:
    """The gold-graded rows of a pairs file (checked as ``read_pairs`` checks it) as Python rows, in file order;
    the unlabeled pairs, most of a production file, stay columnar and never become rows."""
    return gold_rows(read_pairs(path))


def gold_rows(pairs: pa.Table) -> list[dict[str, object]]:
    """The gold-graded rows of a pairs table as Python rows, in table order (a few per cent of a production
    file: the rest stays columnar)."""
    return pairs.filter(pc.is_valid(pairs["gold_grade"])).to_pylist()


def tokenizer_pairs(pairs: pa.Table) -> pa.Table:
    """The pairs a tiny model's tokenizer may learn from: every split but test, whose text stays unseen until
    evaluation."""
    return pairs.filter(pc.not_equal(pairs["split"], "test"))


def labeled_splits(
    pairs: list[dict[str, object]], source: str | Path, train_limit: int | None, audit_limit: int | None
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The first ``train_limit`` / ``audit_limit`` gold-labeled train and audit rows (None: all of them)."""

    def labeled(split: str, limit: int | None) -> list[dict[str, object]]:
        rows = [r for r in pairs if r["split"] == split and r["gold_grade"] is not None]
        return rows[:limit] if limit is not None else rows

    train, audit = labeled("train", train_limit), labeled("audit", audit_limit)
    if not train or not audit:
        raise ContractError(f"{source} needs labeled train and audit rows, got {len(train)} and {len(audit)}")
    return train, audit


TEACHER_PARTS = ("sft", "rl")


def teacher_part(rows: list[dict[str, object]], rl_share: float, part: str) -> list[dict[str, object]]:
    """The gold train rows the teacher's SFT (``part="sft"``) or its RL (``"rl"``) trains on, in their order.

    A query goes wholly to RL when ``blake2b(query) / 2**64 < rl_share``, so RL trains on queries SFT has not
    fitted, the split is the same in every stage and run, and ``rl_share: 0`` gives SFT every row (and RL too:
    without a split both train on all of them)."""
    if not 0.0 <= rl_share < 1.0:
        raise ValueError(f"rl_share must be in [0, 1), got {rl_share!r}")
    if part not in TEACHER_PARTS:
        raise ValueError(f"part must be one of {list(TEACHER_PARTS)}, got {part!r}")
    if rl_share == 0.0:
        return list(rows)

    def to_rl(query: object) -> bool:
        digest = hashlib.blake2b(str(query).encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < rl_share

    return [r for r in rows if to_rl(r["query"]) == (part == "rl")]
