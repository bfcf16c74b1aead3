"""Read query-ad pairs from Parquet, CSV/TSV or JSONL exports, map their columns onto the pairs contract,
and split every row into a valid pair or a quarantine row with a reason code. Streaming: rows arrive in
batches of ``batch_rows``, so memory does not grow with the file.

Column mapping (config ``columns``: contract field -> source column) and label mapping (``label_map``:
source label -> grade), or binning of a float score (``grade_bins``: Home Depot's rater-averaged 1.0-3.0
relevance), let ESCI-, WANDS- or Home-Depot-shaped exports load without code. Text files are read with
``encoding`` (latin-1 exports load; under utf-8 an undecodable byte quarantines its row). A source column
named in the mapping but absent from the file stops the run with an error naming it; everything that is
wrong with a single row goes to quarantine instead:

==================  ===================================================================
reason              when
==================  ===================================================================
malformed_record    a JSONL line that is not a JSON object
undecodable_bytes   text that is not valid UTF-8 (the detail shows the bytes)
missing_field       a required field is absent or null
wrong_type          a text field holds a number/list/..., or a grade is not an integer
empty_text          query or ad text is empty or whitespace only
text_too_long       text over ``max_text_chars`` (with ``oversize: quarantine``)
unknown_grade       a gold label that is not in the label set / ``label_map``
duplicate_pair_id   a pair_id seen before (the first row is kept; found per shard)
join_miss           ``agpo data import``: the row's key is not in the joined table
unknown_split       ``agpo data import``: a split value that ``split_map`` does not map
==================  ===================================================================
"""

from __future__ import annotations

import bisect
import codecs
import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from agpo.checks import require_choice, require_int
from pipelines.ads.contracts import ContractError

REASONS = (
    "malformed_record",
    "undecodable_bytes",
    "missing_field",
    "wrong_type",
    "empty_text",
    "text_too_long",
    "unknown_grade",
    "duplicate_pair_id",
    "join_miss",
    "unknown_split",
)
FORMATS = ("auto", "parquet", "csv", "tsv", "jsonl")
OVERSIZE = ("quarantine", "truncate")
TEXT_FIELDS = ("query", "ad_title")
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("row_number", pa.int64(), nullable=False),
        pa.field("pair_id", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("row", pa.string(), nullable=False),  # the input row as it came, as JSON
    ]
)


@dataclass(frozen=True)
class InputConfig:
    """Where the pairs come from and how their columns and labels map onto the pairs contract."""

    path: str = field(default="work/data/pairs.parquet", metadata={"help": "input file (.parquet, .csv, .tsv, .jsonl)"})
    format: str = field(default="auto", metadata={"help": f"one of {list(FORMATS)}; auto: from the extension"})
    columns: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "contract field -> source column, e.g. {ad_title: product_title}; unmapped: same name"},
    )
    label_map: dict[str, int] = field(
        default_factory=dict, metadata={"help": "source gold label -> grade, e.g. {E: 3, S: 2, C: 1, I: 0}"}
    )
    grade_bins: tuple[float, ...] = field(
        default=(),
        metadata={
            "help": "bin edges for a numeric gold score instead of a label_map, one fewer than grades: score < "
            "edge[0] -> lowest grade, edge[i-1] <= score < edge[i] -> i-th grade; Home Depot's 1.0-3.0 rater "
            "mean: [1.5, 2.0, 2.5]; empty: gold must be an integer grade or go through label_map"
        },
    )
    grades: tuple[int, ...] = field(default=(0, 1, 2, 3), metadata={"help": "the label set"})
    split: str | None = field(default=None, metadata={"help": "keep rows of this split only (null: all rows)"})
    max_text_chars: int = field(default=1000, metadata={"help": "longest query or ad text, in characters"})
    oversize: str = field(default="quarantine", metadata={"help": f"longer text: one of {list(OVERSIZE)}"})
    batch_rows: int = field(default=4096, metadata={"help": "rows read per batch"})
    encoding: str = field(
        default="utf-8",
        metadata={"help": "text encoding of CSV/TSV/JSONL files, e.g. latin-1 (Parquet is always UTF-8)"},
    )

    def __post_init__(self) -> None:
        require_choice("format", self.format, FORMATS)
        require_choice("oversize", self.oversize, OVERSIZE)
        require_int("max_text_chars", self.max_text_chars, 1)
        require_int("batch_rows", self.batch_rows, 1)
        unknown = sorted(set(self.columns) - {"pair_id", "query", "ad_title", "gold_grade", "split"})
        if unknown:
            raise ValueError(f"columns maps unknown contract field(s) {unknown}")
        bad = {k: v for k, v in self.label_map.items() if v not in self.grades}
        if bad:
            raise ValueError(f"label_map sends labels to grades outside {list(self.grades)}: {bad}")
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ValueError(f"encoding {self.encoding!r} is unknown; use e.g. utf-8 or latin-1") from None
        if self.grade_bins:
            if self.label_map:
                raise ValueError("set either label_map or grade_bins, not both")
            if len(self.grade_bins) != len(self.grades) - 1:
                raise ValueError(
                    f"grade_bins needs {len(self.grades) - 1} edges for grades {list(self.grades)}, "
                    f"got {list(self.grade_bins)}"
                )
            if any(a >= b for a, b in zip(self.grade_bins, self.grade_bins[1:], strict=False)):
                raise ValueError(f"grade_bins must increase strictly, got {list(self.grade_bins)}")

    def source(self, name: str) -> str:
        return self.columns.get(name, name)


@dataclass
class RawRow:
    number: int  # 0-based position in the input
    values: dict[str, Any]
    problem: tuple[str, str] | None = None  # (reason, detail) found while reading


def resolve_format(config: InputConfig) -> str:
    if config.format != "auto":
        return config.format
    suffix = Path(config.path).suffix.lower()
    formats = {".parquet": "parquet", ".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
    if suffix not in formats:
        raise ContractError(
            f"cannot tell the format of {config.path} from {suffix!r}; set format to one of {FORMATS[1:]}"
        )
    return formats[suffix]


def read_raw(config: InputConfig, required: Sequence[str] | None = None) -> Iterator[list[RawRow]]:
    """Batches of raw rows, in input order, whatever the format. ``required``: the source columns the file
    must have (default: the query and ad text, and pair_id when mapped); a joined file names its own."""
    path = Path(config.path)
    if not path.is_file():
        raise ContractError(f"input file {path} does not exist; fix input.path")
    kind = resolve_format(config)
    readers = {"parquet": _read_parquet, "csv": _read_delimited, "tsv": _read_delimited, "jsonl": _read_jsonl}
    wanted = required_sources(config) if required is None else list(required)
    yield from readers[kind](path, config, kind, wanted)


def required_sources(config: InputConfig) -> list[str]:
    """The source columns an input file must have: query, ad text, and pair_id when mapped."""
    names = ["query", "ad_title"] + (["pair_id"] if "pair_id" in config.columns else [])
    return [config.source(name) for name in names]


def _check_columns(path: Path, present: list[str], wanted: list[str]) -> None:
    missing = [c for c in wanted if c not in present]
    if missing:
        raise ContractError(
            f"{path} has no column(s) {missing} (columns: {present}); map them with input.columns, "
            "e.g. --set 'input.columns={ad_title: product_title}'"
        )


def _read_parquet(path: Path, config: InputConfig, _: str, wanted: list[str]) -> Iterator[list[RawRow]]:
    handle = pq.ParquetFile(path)
    _check_columns(path, handle.schema_arrow.names, wanted)
    number = 0
    for batch in handle.iter_batches(batch_size=config.batch_rows):
        rows = []
        for values in batch.to_pylist():
            rows.append(RawRow(number, values, undecodable(values)))
            number += 1
        yield rows


def _read_delimited(path: Path, config: InputConfig, kind: str, wanted: list[str]) -> Iterator[list[RawRow]]:
    # surrogateescape keeps undecodable bytes as lone surrogates, so one bad row cannot stop the file
    with path.open(encoding=config.encoding, errors="surrogateescape", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t" if kind == "tsv" else ",")
        _check_columns(path, list(reader.fieldnames or []), wanted)
        rows: list[RawRow] = []
        for number, values in enumerate(reader):
            values.pop(None, None)  # extra cells beyond the header
            rows.append(RawRow(number, values, undecodable(values)))
            if len(rows) == config.batch_rows:
                yield rows
                rows = []
        if rows:
            yield rows


def _read_jsonl(path: Path, config: InputConfig, _: str, wanted: list[str]) -> Iterator[list[RawRow]]:
    checked = False
    with path.open("rb") as handle:
        rows: list[RawRow] = []
        for number, line in enumerate(handle):
            row = _parse_json_line(number, line, config.encoding)
            if not checked and row.problem is None:
                _check_columns(path, list(row.values), wanted)
                checked = True
            rows.append(row)
            if len(rows) == config.batch_rows:
                yield rows
                rows = []
        if rows:
            yield rows


def _parse_json_line(number: int, line: bytes, encoding: str = "utf-8") -> RawRow:
    try:
        text = line.decode(encoding)
    except UnicodeDecodeError as err:
        bad = line[max(0, err.start - 8) : err.end + 8]
        return RawRow(number, {"line": line.decode("utf-8", "replace")}, ("undecodable_bytes", f"line: {bad!r}"))
    try:
        values = json.loads(text)
    except json.JSONDecodeError as err:
        return RawRow(number, {"line": text.rstrip("\n")}, ("malformed_record", f"not JSON: {err.msg} at {err.pos}"))
    if not isinstance(values, dict):
        return RawRow(
            number, {"line": text.rstrip("\n")}, ("malformed_record", f"not a JSON object: {type(values).__name__}")
        )
    return RawRow(number, values, undecodable(values))


def undecodable(values: dict[str, Any]) -> tuple[str, str] | None:
    """The first undecodable text in ``values`` as (reason, detail); bytes that decode become text."""
    for name, value in values.items():
        if isinstance(value, bytes):
            try:
                values[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                return "undecodable_bytes", f"{name}: {value[:40]!r}"
        elif isinstance(value, str) and any("\ud800" <= ch <= "\udfff" for ch in value):
            raw = value.encode("utf-8", "surrogateescape" if _escaped_bytes(value) else "backslashreplace")
            return "undecodable_bytes", f"{name}: {raw[:40]!r}"
    return None


def _escaped_bytes(text: str) -> bool:
    """True when every surrogate in ``text`` stands for an undecodable byte (surrogateescape's range)."""
    return all("\udc80" <= ch <= "\udcff" for ch in text if "\ud800" <= ch <= "\udfff")


def validate(row: RawRow, config: InputConfig) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(pair, None) for a good row, (None, quarantine row) for a bad one."""
    values = row.values
    pair_id = values.get(config.source("pair_id"))
    if row.problem is not None:
        return None, quarantine_row(row, *row.problem)
    pair: dict[str, Any] = {"pair_id": None if pair_id is None else str(pair_id)}
    if pair["pair_id"] is None or not pair["pair_id"].strip():
        if "pair_id" in config.columns or config.source("pair_id") in values:
            return None, quarantine_row(row, "missing_field", f"pair_id is {pair_id!r}")
        pair["pair_id"] = f"row-{row.number}"  # exports without ids: the row number is stable for a file
    for name in TEXT_FIELDS:
        value = values.get(config.source(name))
        if value is None:
            return None, quarantine_row(row, "missing_field", f"{name} ({config.source(name)}) is null")
        if not isinstance(value, str):
            return None, quarantine_row(row, "wrong_type", f"{name} is {type(value).__name__} {value!r}, not text")
        if not value.strip():
            return None, quarantine_row(row, "empty_text", f"{name} is {value!r}")
        if len(value) > config.max_text_chars:
            if config.oversize == "quarantine":
                return None, quarantine_row(
                    row, "text_too_long", f"{name} has {len(value)} characters, limit {config.max_text_chars}"
                )
            value = value[: config.max_text_chars]
        pair[name] = value
    grade, problem = _gold_grade(values.get(config.source("gold_grade")), config)
    if problem is not None:
        return None, quarantine_row(row, *problem)
    pair["gold_grade"] = grade
    split = values.get(config.source("split"))
    pair["split"] = str(split) if split is not None else "unlabeled"
    if config.split is not None and pair["split"] != config.split:
        return None, None  # not asked for: neither labeled nor quarantined (counted as skipped)
    return pair, None


def _gold_grade(value: Any, config: InputConfig) -> tuple[int | None, tuple[str, str] | None]:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None, None  # unlabeled
    if config.grade_bins:
        return _binned_grade(value, config)
    if config.label_map:
        key = str(value).strip()
        if key not in config.label_map:
            return None, ("unknown_grade", f"gold label {value!r} is not in label_map {sorted(config.label_map)}")
        return config.label_map[key], None
    try:
        grade = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        grade = None
    if grade is None or isinstance(value, bool):
        return None, ("wrong_type", f"gold grade {value!r} is not an integer")
    if grade not in config.grades:
        return None, ("unknown_grade", f"gold grade {grade} is not in {list(config.grades)}")
    return grade, None


def _binned_grade(value: Any, config: InputConfig) -> tuple[int | None, tuple[str, str] | None]:
    try:
        score = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        score = math.nan
    if not math.isfinite(score):
        return None, ("wrong_type", f"gold score {value!r} is not a finite number (grade_bins needs one)")
    return sorted(config.grades)[bisect.bisect_right(config.grade_bins, score)], None


def quarantine_row(row: RawRow, reason: str, detail: str) -> dict[str, Any]:
    if reason not in REASONS:
        raise ValueError(f"unknown quarantine reason {reason!r}")
    pair_id = row.values.get("pair_id")
    return {
        "row_number": row.number,
        "pair_id": None if pair_id is None else _printable(str(pair_id)),
        "reason": reason,
        "detail": _printable(detail),
        "row": _printable(json.dumps(row.values, ensure_ascii=False, default=repr, sort_keys=True)),
    }


def _printable(text: str) -> str:
    """``text`` as valid UTF-8: lone surrogates (undecodable bytes) are written as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
