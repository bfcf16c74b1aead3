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

The rules of each format:

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

import codecs
import csv
import hashlib
import io
import json
import reprlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, AnyStr

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.ads.intake.arrow_rows import arrow_rows, check_file_columns, row_bytes, undecodable
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.ingest import FORMATS, MAX_ROW_CHARS, InputConfig, RawRow, is_database
from pipelines.ads.intake.sql_source import describe, read_sql
from pipelines.io import require_file
from pipelines.storage import Location, Part, digest, locate, missing, parts, redact

MAX_JSON_DEPTH = 64  # levels of nested lists/objects in a kept JSON value
MAX_SHOWN_VALUES = 5  # values of a repeated JSON key that its quarantine row shows
MAX_INT_DIGITS = 4300  # Python's default limit on int <-> str conversion (sys.get_int_max_str_digits)
MAX_RECORD_LINES = 100  # physical lines a broken CSV record's open quote may take before it is cut off
MAX_BATCH_CHARS = 64 * 2**20  # a batch ends before the row that would take its lines / values over this
PARQUET_READ_BYTES = 8 * 2**20  # Arrow decodes about this much of a Parquet file's rows at a time
PARQUET_BUFFER = 2**20  # Parquet column chunks are read through a buffer of this size
SKIP_CHUNK = 2**20  # an over-long line is skipped this much at a time


@dataclass(frozen=True)
class LongInteger:
    """A JSON integer of more than MAX_INT_DIGITS digits, which Python will not convert: only its length."""

    digits: int


@dataclass(frozen=True, repr=False)
class RepeatedKey:
    """The value of a key written more than once in one JSON object: every value it was given, in order."""

    key: str
    values: tuple[Any, ...]

    def given(self) -> str:
        """Its first MAX_SHOWN_VALUES values as text, each cut by reprlib (a bounded depth and length)."""
        shown = [reprlib.repr(v) for v in self.values[:MAX_SHOWN_VALUES]]
        more = len(self.values) - len(shown)
        return ", ".join(shown) + (f", ... {more:,} more" if more else "")

    def __repr__(self) -> str:  # what a quarantine row shows
        return f"RepeatedKey({self.key!r}: {self.given()})"


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
    readers = {"parquet": _read_parquet, "jsonl": _read_jsonl}
    number = 0
    for part in found:
        name = part.location.uri[len(config.path.rstrip("/")) + 1 :] if len(found) > 1 or part.partition else ""
        kind = resolve_format(config, part.location.uri)
        columns = {key: value for key, value in part.partition.items() if key in keep}
        in_file = [c for c in wanted if c not in part.partition]
        for row, size in readers.get(kind, _read_delimited)(part.location, config, kind, in_file, keep):
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


def _bounded_lines(handle: IO[AnyStr], limit: int) -> Iterator[tuple[AnyStr, int | None]]:
    """(line, None) for each line of ``handle`` of at most ``limit`` bytes (text: characters) before its
    line break; (its first MAX_ROW_CHARS, its length with the line break) for a longer one, whose rest is
    skipped SKIP_CHUNK at a time, never held whole."""
    while line := handle.readline(limit + 1):
        if len(line) <= limit or _ends_line(line):
            yield line, None
            continue
        head, size = line[:MAX_ROW_CHARS], len(line)
        while not _ends_line(line) and (line := handle.readline(SKIP_CHUNK)):
            size += len(line)
        yield head, size


def _ends_line(line: str | bytes) -> bool:
    return line.endswith(("\n", "\r")) if isinstance(line, str) else line.endswith(b"\n")


def _too_long(line_number: int, size: int, limit: int, unit: str) -> tuple[str, str]:
    detail = f"line {line_number} has {size:,} {unit}, over input.max_line_bytes ({limit:,}); skipped unread"
    return "text_too_long", detail


def text_encoding(encoding: str) -> str:
    """The codec a text file is read with: ``utf-8-sig`` for UTF-8 (a leading byte-order mark is dropped)."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


def _require_byte_lines(location: Location, encoding: str) -> None:
    """JSONL lines are split on the byte ``\n``: refuse UTF-16/32 (by ``encoding`` or by the file's BOM)."""
    path = redact(location.uri)
    with location.open_binary() as handle:
        start = handle.read(4)
    wide = codecs.lookup(encoding).name.startswith(("utf-16", "utf-32"))
    if wide or start.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise ContractError(
            f"{path} is UTF-16 or UTF-32 (encoding {encoding}, first bytes {start!r}); JSONL is read line by line "
            "as bytes. Convert it to UTF-8 first, e.g. `iconv -f UTF-16 -t UTF-8 in.jsonl > out.jsonl`"
        )


def _read_jsonl(
    location: Location, config: InputConfig, _: str, wanted: list[str], keep: set[str]
) -> Iterator[tuple[RawRow, int]]:
    """(row, its line's length) for each line: one JSON object per line, only the ``keep`` keys kept; every
    line must hold ``wanted`` and, when the first line has it, the pair_id key (module docstring)."""
    _require_byte_lines(location, config.encoding)
    path, encoding, expected = redact(location.uri), text_encoding(config.encoding), None
    with location.open_binary() as handle:
        for number, (line, size) in enumerate(_bounded_lines(handle, config.max_line_bytes)):
            if size is not None:
                problem = _too_long(number + 1, size, config.max_line_bytes, "bytes")
                yield RawRow(number, {"line": line.decode(config.encoding, "replace")}, problem), len(line)
                continue
            row = _parse_json_line(number, line, encoding)
            if row.problem is None:
                if expected is None:
                    check_file_columns(path, list(row.values), wanted, keep)
                    expected = [
                        *wanted,
                        *(k for k in [config.source("pair_id")] if k in row.values and k not in wanted),
                    ]
                missing = [key for key in expected if key not in row.values]
                row.values = {k: v for k, v in row.values.items() if k in keep}
                row.problem = (
                    ("missing_field", f"line {number + 1} has no key(s) {missing}, which the first line has")
                    if missing
                    else _json_value_problem(row.values) or undecodable(row.values)
                )
            yield row, len(line)


def _parse_json_line(number: int, line: bytes, encoding: str = "utf-8") -> RawRow:
    try:
        text = line.decode(encoding)
    except UnicodeDecodeError as err:
        bad = line[max(0, err.start - 8) : err.end + 8]
        return RawRow(number, {"line": line.decode("utf-8", "replace")}, ("undecodable_bytes", f"line: {bad!r}"))
    try:
        values = _JSON.decode(text)
    except json.JSONDecodeError as err:
        return RawRow(number, {"line": text.rstrip("\n")}, ("malformed_record", f"not JSON: {err.msg} at {err.pos}"))
    except RecursionError:
        return RawRow(number, {"line": text.rstrip("\n")}, ("malformed_record", _too_deep("the line")))
    if not isinstance(values, dict):
        return RawRow(
            number, {"line": text.rstrip("\n")}, ("malformed_record", f"not a JSON object: {type(values).__name__}")
        )
    return RawRow(number, values)


def _json_int(digits: str) -> int | LongInteger:
    """The JSON decoder's integer parser: int(digits), or a LongInteger where int() would raise."""
    length = len(digits.lstrip("-"))
    return int(digits) if length <= MAX_INT_DIGITS else LongInteger(length)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The JSON decoder's object builder: a dict of ``pairs``, where a key given twice holds a RepeatedKey."""
    values = dict(pairs)
    if len(values) == len(pairs):
        return values
    given: dict[str, list[Any]] = {}
    for key, value in pairs:
        given.setdefault(key, []).append(value)
    return {key: found[0] if len(found) == 1 else RepeatedKey(key, tuple(found)) for key, found in given.items()}


_JSON = json.JSONDecoder(parse_int=_json_int, object_pairs_hook=_json_object)


def _too_deep(where: str) -> str:
    return f"{where} is nested deeper than {MAX_JSON_DEPTH} levels"


def _json_value_problem(values: dict[str, Any]) -> tuple[str, str] | None:
    """A kept JSON value holding a LongInteger (wrong_type), a RepeatedKey (repeated_key) or nested deeper than
    MAX_JSON_DEPTH levels (malformed_record; the value is replaced by a note, so writing the quarantine row
    cannot recurse as deep). The walk keeps its own stack, so no depth can crash it."""
    walked = (dict, list, LongInteger, RepeatedKey)
    stack = [(name, value, 1) for name, value in values.items() if isinstance(value, walked)]
    while stack:
        name, value, depth = stack.pop()
        if isinstance(value, LongInteger):
            return "wrong_type", f"{name} holds an integer of {value.digits:,} digits (over {MAX_INT_DIGITS:,})"
        if depth > MAX_JSON_DEPTH:
            values[name] = f"[{_too_deep('value')}]"
            return "malformed_record", _too_deep(name)
        if isinstance(value, RepeatedKey):
            times = f"the key {value.key!r} is written {len(value.values)} times ({value.given()})"
            return "repeated_key", f"{name}: {times}; JSON keeps one silently"
        children = value.values() if isinstance(value, dict) else value
        stack.extend((name, child, depth + 1) for child in children if isinstance(child, walked))
    return None


class _CsvLines:
    """The physical lines csv.reader parses, at most ``limit`` characters each; a longer one reaches csv as
    an empty line. ``taken``: (line number, first MAX_ROW_CHARS characters, length of a skipped line or
    None) of each line the current record consumed. A record may consume MAX_RECORD_LINES lines."""

    def __init__(self, handle: IO[str], limit: int) -> None:
        self.lines = _bounded_lines(handle, limit)
        self.count = 0
        self.taken: list[tuple[int, str, int | None]] = []

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        if len(self.taken) == MAX_RECORD_LINES:
            raise csv.Error(f"a quoted field runs over {MAX_RECORD_LINES} lines")
        line, skipped = next(self.lines)
        self.count += 1
        self.taken.append((self.count, line[:MAX_ROW_CHARS], skipped))
        return "\n" if skipped is not None else line


def _read_delimited(
    location: Location, config: InputConfig, kind: str, wanted: list[str], keep: set[str]
) -> Iterator[tuple[RawRow, int]]:
    """(row, characters it holds) for each CSV/TSV record, only the ``keep`` columns kept; a broken record
    (module docstring: one that runs over a line break too) gives one malformed_record row per line."""
    csv.field_size_limit(max(csv.field_size_limit(), config.max_line_bytes))  # process-wide; only ever raised
    # surrogateescape keeps undecodable bytes as lone surrogates, so one bad row cannot stop the file
    path, binary = redact(location.uri), location.open_binary()
    with io.TextIOWrapper(
        binary, encoding=text_encoding(config.encoding), errors="surrogateescape", newline=""
    ) as handle:
        lines = _CsvLines(handle, config.max_line_bytes)
        reader = csv.reader(lines, delimiter="\t" if kind == "tsv" else ",", strict=True)
        header = _csv_header(path, reader, lines)
        check_file_columns(path, header, wanted, keep)
        columns = [(i, name) for i, name in enumerate(header) if name in keep]
        number = 0
        while True:
            lines.taken = []
            try:
                fields, problem = next(reader), None
            except StopIteration:
                return
            except csv.Error as err:
                fields, problem = [], str(err)
            if problem is None and len(lines.taken) > 1:
                problem = "a quoted field runs over a line break, and a record is one line"
            if problem is None and fields and len(fields) != len(header):
                problem = f"{len(fields)} fields where the header has {len(header)}"
            for row in _csv_rows(number, fields, problem, lines.taken, columns, config.max_line_bytes):
                yield row
                number += 1


def _csv_header(path: str, reader: Iterator[list[str]], lines: _CsvLines) -> list[str]:
    try:
        header = next(reader, [])
    except csv.Error as err:
        raise ContractError(f"cannot read the header line of {path} ({err}); fix the file's first line") from None
    if any(skipped is not None for _, _, skipped in lines.taken):
        raise ContractError(f"the header line of {path} is over input.max_line_bytes; is it a CSV/TSV file?")
    if any("\x00" in name for name in header):
        raise ContractError(
            f"the header line of {path} holds NUL characters: is the file UTF-16? Set input.encoding (e.g. "
            "utf-16) or export it as UTF-8"
        )
    return header


def _csv_rows(
    number: int,
    fields: list[str],
    problem: str | None,
    taken: list[tuple[int, str, int | None]],
    columns: list[tuple[int, str]],
    limit: int,
) -> list[tuple[RawRow, int]]:
    """(row, characters it holds) of one CSV record: none for a blank line, one per line for a broken one."""
    if problem is not None:
        span = f"lines {taken[0][0]}-{taken[-1][0]}" if len(taken) > 1 else f"line {taken[0][0]}"
        verb = "do" if len(taken) > 1 else "does"
        fix = (
            'close a quote left open or double a literal one (""); quote a field that holds the delimiter; '
            "export values with line breaks as Parquet or JSONL"
        )
        first = f"{span} {verb} not parse as one record ({problem}); {fix}"
        details = [first] + [f"line {n} is part of the broken record of {span}" for n, _, _ in taken[1:]]
        return [
            (RawRow(number + i, {"line": head}, ("malformed_record", detail)), 0)
            for i, ((_, head, _), detail) in enumerate(zip(taken, details, strict=True))
        ]
    skipped = [(n, size) for n, _, size in taken if size is not None]
    if skipped:
        return [(RawRow(number, {"line": taken[0][1]}, _too_long(*skipped[0], limit, "characters")), 0)]
    if not fields:
        return []  # a blank line
    values = {name: fields[i] if i < len(fields) else None for i, name in columns}
    return [(RawRow(number, values, undecodable(values)), sum(len(v) for v in values.values() if v))]
