"""The line-based formats of :mod:`pipelines.ads.intake.readers`: JSONL and CSV/TSV, read a bounded line at a
time (a line over ``max_line_bytes`` is skipped ``SKIP_CHUNK`` at a time and becomes a ``text_too_long`` row),
each row's problem riding on it for ``ingest.validate`` to quarantine. The rules of each format (malformed
records, repeated JSON keys, huge integers, deep nesting, CSV records that run over a line break, encodings) are
in the readers module's docstring; ``read_jsonl`` and ``read_delimited`` are its readers for them.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import reprlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, AnyStr

from pipelines.ads.intake.arrow_rows import check_file_columns, undecodable
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.ingest import MAX_ROW_CHARS, InputConfig, RawRow
from pipelines.storage import Location, redact

MAX_JSON_DEPTH = 64  # levels of nested lists/objects in a kept JSON value
MAX_SHOWN_VALUES = 5  # values of a repeated JSON key that its quarantine row shows
MAX_INT_DIGITS = 4300  # Python's default limit on int <-> str conversion (sys.get_int_max_str_digits)
MAX_RECORD_LINES = 100  # physical lines a broken CSV record's open quote may take before it is cut off
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


def read_jsonl(
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


def read_delimited(
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
