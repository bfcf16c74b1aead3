"""Read query-ad pair exports (Parquet, CSV/TSV, JSONL) as batches of raw rows for
:mod:`pipelines.ads.intake.ingest` to validate. A problem found while reading rides on the row (``RawRow.problem``:
reason, detail) and ``ingest.validate`` turns it into a quarantine row; a file that cannot be read at all
(an empty, truncated or non-Parquet ``.parquet``, an unreadable CSV header) stops the run with a
ContractError naming the file, what is wrong and the fix. Hostile input never crashes the read. What every
reader guarantees:

- Bounded reads: rows arrive in batches of ``batch_rows``, fewer where the next row would take the batch
  over ``MAX_BATCH_CHARS`` (its rows' lines, CSV records or Parquet values; only a batch of one row can be
  over it), so memory does not grow with the file. A CSV/TSV/JSONL line over ``max_line_bytes`` is skipped
  ``SKIP_CHUNK`` at a time, never held whole, and becomes a ``text_too_long`` row.
- Mapped columns only: only the mapped source columns are read (Parquet ``columns=``; CSV and JSONL keep
  those keys only, in pairs and in quarantine), so a very wide file costs what its mapped columns cost. A
  required source column absent from the file, or a kept one named twice, stops the run naming it.
- Encoding: text files are read with ``encoding`` (latin-1 exports load; under utf-8 an undecodable byte
  quarantines its row as ``undecodable_bytes``). UTF-8 is read as ``utf-8-sig``: the byte-order mark that Excel
  writes at the start of every CSV it saves is not part of the first column's name. JSONL is split into lines
  as bytes, which UTF-16 and UTF-32 cannot be: such a file (its byte-order mark, or ``encoding``) stops the run
  with a ContractError saying how to convert it.

The rules of each format (JSONL and CSV/TSV are read in :mod:`pipelines.ads.intake.text_readers`, Parquet here):

- JSONL: json.loads' RecursionError and a kept value nested deeper than ``MAX_JSON_DEPTH`` levels are
  ``malformed_record``; a huge integer (over ``MAX_INT_DIGITS`` digits) names its field (``wrong_type``); a key
  written twice in an object (JSON keeps one value silently) in a kept column is ``repeated_key`` naming it and
  its values. The first object's keys must hold the required columns (else a ContractError); every later line
  must hold them and the first line's pair_id key too (else ``missing_field`` naming the key).
- CSV/TSV, strict, a record per line (field limit: ``max_line_bytes``). A quoted field holds delimiters and
  doubled quotes, never a line break: a stray quote that a later one closes before a delimiter keeps the field
  count, like a multi-line value. A record that fails to parse, runs over a line break or has another field
  count than the header's is broken: each of its lines (to the closing quote, at most ``MAX_RECORD_LINES``) is
  a ``malformed_record`` row naming the line numbers. No two lines are read as one row; values with line
  breaks go through Parquet or JSONL.
- Parquet: a file pyarrow cannot open or decode, or a page whose CRC does not match, is a ContractError naming
  the file (and the row it stopped after); a string column with invalid UTF-8 is read as bytes for that batch,
  so only its bad rows are quarantined (``undecodable_bytes``). Column chunks stream through a
  ``PARQUET_BUFFER`` buffer and about ``PARQUET_READ_BYTES`` of rows decode at a time (by the footer's encoded
  sizes, which a repetitive dictionary column understates): peak memory is about one batch of Python rows,
  one read of Arrow data and the largest page.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.ads.intake.arrow_rows import arrow_rows, check_file_columns, row_bytes, undecodable
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.ingest import FORMATS, InputConfig, RawRow, is_database
from pipelines.ads.intake.sql_source import describe, read_sql
from pipelines.ads.intake.text_readers import read_delimited, read_jsonl
from pipelines.io import require_file
from pipelines.storage import Location, Part, digest, locate, missing, parts, redact

MAX_BATCH_CHARS = 64 * 2**20  # a batch ends before the row that would take its lines / values over this
PARQUET_READ_BYTES = 8 * 2**20  # Arrow decodes about this much of a Parquet file's rows at a time
PARQUET_BUFFER = 2**20  # Parquet column chunks are read through a buffer of this size


def resolve_format(config: InputConfig, name: str | None = None) -> str:
    """The format of the input file (or of its dataset's part ``name``): ``format``, else from the extension."""
    if config.format != "auto":
        return config.format
    name = config.path if name is None else name
    suffix = Path(name.partition("?")[0]).suffix.lower()
    formats = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
    if suffix not in formats:
        raise ContractError(
            f"cannot tell the format of {redact(name)} from {suffix!r}; set format to one of {FORMATS[1:]}"
        )
    return formats[suffix]


def input_parts(config: InputConfig) -> list[Part]:
    """The files ``input.path`` names: itself, or the part files of a folder or prefix (a dataset, its hive
    partitions kept by ``input.partitions``). A local file is checked with ``require_file`` first (a FIFO or a
    device is refused before anything opens it); an empty file is a ContractError."""
    if is_database(config.path):
        return []  # a query, not files: it is checked when it runs
    location = locate(config.path)
    if location.is_local and not Path(location.path).is_dir():
        path = require_file(location.path, "input file", "fix input.path", ContractError)
        found = [Part(location, {}, path.stat().st_size)]
    else:
        info = location.info()
        if info.type == pafs.FileType.NotFound:
            raise ContractError(f"input {missing(location)} (input.path)")
        file = info.type == pafs.FileType.File
        found = [Part(location, {}, info.size or 0, info.mtime_ns or 0)] if file else parts(location, config.partitions)
    empty = next((part for part in found if part.size == 0), None)
    if empty is not None:
        raise ContractError(f"{redact(empty.location.uri)} is an empty file (0 bytes): nothing to read; fix input.path")
    return found


def read_raw(
    config: InputConfig, required: Sequence[str] | None = None, columns: Iterable[str] | None = None
) -> Iterator[list[RawRow]]:
    """Batches of raw rows, in input order, whatever the format, a dataset's parts one after another (row
    numbers run on across them; ``RawRow.part`` names the part). ``required``: the source columns each file must
    have (default: the query and ad text, and pair_id when mapped); a joined file names its own. ``columns``: the
    source columns read into the rows (default: the mapped ones); the others never are. A part's partition values
    are columns of its rows too."""
    wanted = required_sources(config) if required is None else list(required)
    keep = set(config.mapped_sources() if columns is None else columns) | set(wanted)
    if is_database(config.path):
        rows = read_sql(config.path, str(config.query), config.batch_rows, wanted, keep)
    else:
        rows = _dataset_rows(config, input_parts(config), wanted, keep)
    yield from _batches(rows, config.batch_rows)


def input_digest(config: InputConfig) -> str:
    """What identifies the input's content (pipelines.storage.digest); a query's: its database and its text (a
    rerun into the same run folder reuses what the same query read, whatever the table holds now)."""
    if is_database(config.path):
        return hashlib.sha256(f"{describe(config.path)}\n{config.query}".encode()).hexdigest()
    return digest(input_parts(config))


def _dataset_rows(
    config: InputConfig, found: list[Part], wanted: list[str], keep: set[str]
) -> Iterator[tuple[RawRow, int]]:
    readers = {"parquet": _read_parquet, "jsonl": read_jsonl}
    number = 0
    for part in found:
        name = part.location.uri[len(config.path.rstrip("/")) + 1 :] if len(found) > 1 or part.partition else ""
        kind = resolve_format(config, part.location.uri)
        columns = {key: value for key, value in part.partition.items() if key in keep}
        in_file = [c for c in wanted if c not in part.partition]
        for row, size in readers.get(kind, read_delimited)(part.location, config, kind, in_file, keep):
            row.number, row.part = number, name
            row.values.update((key, value) for key, value in columns.items() if key not in row.values)
            number += 1
            yield row, size


def required_sources(config: InputConfig) -> list[str]:
    """The source columns an input file must have: query, ad text, and pair_id when mapped."""
    names = ["query", "ad_title"] + (["pair_id"] if "pair_id" in config.columns else [])
    return [config.source(name) for name in names]


def _batches(rows: Iterator[tuple[RawRow, int]], batch_rows: int) -> Iterator[list[RawRow]]:
    """(row, characters or bytes it holds) pairs grouped into batches of ``batch_rows``, or fewer: a batch
    ends before a row that would take it over MAX_BATCH_CHARS (a file of long rows must not fill memory a
    batch at a time), so only a batch of one row is ever over it."""
    batch: list[RawRow] = []
    held = 0
    for row, size in rows:
        if batch and held + size > MAX_BATCH_CHARS:
            yield batch
            batch, held = [], 0
        batch.append(row)
        held += size
        if len(batch) >= batch_rows:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def open_parquet(location: Location) -> pq.ParquetFile:
    """The file opened to stream (column chunks read through a PARQUET_BUFFER buffer, nothing read ahead)
    with its pages' CRC checksums verified where the file has them; a ContractError if it cannot be opened."""
    try:
        return pq.ParquetFile(
            location.open_random(), buffer_size=PARQUET_BUFFER, pre_buffer=False, page_checksum_verification=True
        )
    except (pa.ArrowException, OSError) as err:
        raise _unreadable_parquet(location.uri, err) from None


def _read_parquet(
    location: Location, config: InputConfig, _: str, wanted: list[str], keep: set[str]
) -> Iterator[tuple[RawRow, int]]:
    """(row, bytes its values hold) for each row, holding the ``keep`` columns only (the others are never
    read), decoded about PARQUET_READ_BYTES at a time."""
    path = redact(location.uri)
    handle = open_parquet(location)
    names = handle.schema_arrow.names
    check_file_columns(path, names, wanted, keep)
    reads = _parquet_reads(handle, [n for n in names if n in keep], config.batch_rows)
    number = 0
    while True:
        try:
            batch = next(reads, None)
            rows = None if batch is None else arrow_rows(batch)
            sizes = None if batch is None else row_bytes(batch)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            raise _unreadable_parquet(path, err, number) from None
        if rows is None or sizes is None:
            return
        for values, size in zip(rows, sizes, strict=True):
            yield RawRow(number, values, undecodable(values)), size
            number += 1


def _parquet_reads(handle: pq.ParquetFile, columns: list[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's ``columns``, row group by row group, in Arrow batches of as many rows (at most
    ``batch_rows``) as the group's footer says fit in PARQUET_READ_BYTES."""
    metadata = handle.metadata
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        leaves = (group.column(j) for j in range(group.num_columns))  # a nested column has several: a.list.element
        read = [c for c in leaves if any(f"{c.path_in_schema}.".startswith(f"{n}.") for n in columns)]
        size = sum(c.total_uncompressed_size for c in read)
        rows = max(1, min(batch_rows, group.num_rows * PARQUET_READ_BYTES // max(size, 1)))
        yield from handle.iter_batches(batch_size=rows, row_groups=[index], columns=columns)


def _unreadable_parquet(path: str, err: Exception, after_rows: int | None = None) -> ContractError:
    where = "" if after_rows is None else f" after row {after_rows}"
    return ContractError(
        f"{path} is not a readable Parquet file{where} ({type(err).__name__}: {err}); is it empty, truncated, "
        "corrupted or not Parquet? Export it again, or set input.format if it is CSV/TSV/JSONL"
    )
