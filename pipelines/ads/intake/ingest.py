"""Map query-ad pair exports onto the pairs contract and split every row into a valid pair or a quarantine
row with a reason code. The rows come from :mod:`pipelines.ads.intake.readers` (Parquet, CSV/TSV or JSONL,
streamed in batches); this module holds what they are read with (``InputConfig``), the rules a row must
pass (``validate``) and the record a failing row becomes (``quarantine_row``).

Column mapping (config ``columns``: contract field -> source column) and label mapping (``label_map``:
source label -> grade), or binning of a float score (``grade_bins``: Home Depot's rater-averaged 1.0-3.0
relevance), let ESCI-, WANDS- or Home-Depot-shaped exports load without code. A source column named in the
mapping but absent from the file stops the run with an error naming it; everything that is wrong with a
single row goes to quarantine instead (``MAX_JSON_DEPTH``, ``MAX_INT_DIGITS``: pipelines.ads.intake.readers):

==================  ===================================================================
reason              when
==================  ===================================================================
malformed_record    a JSONL line that is not a JSON object, or nests deeper than ``MAX_JSON_DEPTH``;
                    each line of a CSV record that does not parse or runs over a line break (readers)
repeated_key        a JSONL object in a column that is read writes a key twice (detail: key, values)
undecodable_bytes   text that is not valid UTF-8 (the detail shows the bytes)
missing_field       a required field is absent or null (``agpo data import``: also the grade of a labeled
                    row, pipelines.ads.intake.data_import)
wrong_type          a text field holds a number/list/..., a pair_id is neither text nor an integer, a
                    grade is not an integer, or a JSON integer has more than ``MAX_INT_DIGITS`` digits
                    (Python will not convert it)
empty_text          query or ad text is empty or whitespace only
nul_character       pair_id, query, ad text or split holds a NUL character (``\\x00``), which C strings,
                    tokenizers and Postgres text cannot carry
text_too_long       text over ``max_text_chars`` (with ``oversize: quarantine``), a pair_id over
                    ``MAX_PAIR_ID_CHARS``, or a line over ``max_line_bytes``, which is skipped in chunks
                    and never held whole
unknown_grade       a gold label that is not in the label set / ``label_map``
duplicate_pair_id   a pair_id seen before (the first row is kept; found per shard, or by the partition
                    when it shards by text: pipelines.ads.annotation.shards)
join_miss           ``agpo data import``: the row's key is not in the joined table
unknown_split       ``agpo data import``: a split value that ``split_map`` does not map
==================  ===================================================================

pair_id is text (``1`` and ``"1"`` are one id; a float, bool or list is ``wrong_type``); a gold grade written as
text is ASCII digits (``-?[0-9]{1,18}``: Python's ``int`` would take ``"٣"`` and ``"1_0"``), a ``grade_bins`` score an
ASCII decimal. Quarantine rows are bounded (``MAX_ROW_CHARS``, ``MAX_DETAIL_CHARS``, cut visibly).
"""

from __future__ import annotations

import bisect
import codecs
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from agpo.checks import require_choice, require_int
from pipelines.runs import run_path_field

REASONS = (
    "malformed_record",
    "repeated_key",
    "undecodable_bytes",
    "missing_field",
    "wrong_type",
    "empty_text",
    "nul_character",
    "text_too_long",
    "unknown_grade",
    "duplicate_pair_id",
    "join_miss",
    "unknown_split",
)
FORMATS = ("auto", "parquet", "csv", "tsv", "jsonl")
OVERSIZE = ("quarantine", "truncate")
CONTRACT_FIELDS = ("pair_id", "query", "ad_title", "gold_grade", "split")
TEXT_FIELDS = ("query", "ad_title")
MAX_ROW_CHARS = 4096  # a quarantine row's ``row`` (the input row as JSON)
MAX_DETAIL_CHARS = 1024  # a quarantine row's ``detail`` and ``pair_id``
MAX_PAIR_ID_CHARS = 256  # a longer pair_id is quarantined (text_too_long)
ASCII_INTEGER = re.compile(r"-?[0-9]{1,18}")  # a grade written as text (int() takes "٣" and "1_0" too)
ASCII_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")  # a score written as text
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("row_number", pa.int64(), nullable=False),
        pa.field("pair_id", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
        pa.field("row", pa.string(), nullable=False),  # the input row as it came (mapped columns), as JSON
    ]
)


DATABASE_SCHEMES = ("postgresql://", "postgres://")  # an input.path read with input.query (intake.sql_source)


def is_database(path: str) -> bool:
    return str(path).startswith(DATABASE_SCHEMES)


@dataclass(frozen=True)
class InputConfig:
    """Where the pairs come from and how their columns and labels map onto the pairs contract."""

    path: str = run_path_field(
        "data/pairs.parquet",
        "input file (.parquet, .csv, .tsv, .jsonl), or a folder of them (a dataset); a local path or a URI "
        "(s3://bucket/prefix/, gs://, hdfs://)",
    )
    query: str | None = field(
        default=None,
        metadata={
            "help": "the SQL that reads the pairs when path is a database URL (postgresql://user@host:5432/db; the "
            "password from PGPASSWORD, ~/.pgpass or AGPO_SQL_PASSWORD_FILE), run read-only and streamed"
        },
    )
    partitions: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "help": "a dataset's hive partitions to read (folders key=value), key -> a,b,c or first..last "
            "(inclusive, as text), e.g. {dt: 2026-12-01..2026-12-07}; empty: every part"
        },
    )
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
    max_line_bytes: int = field(
        default=16 * 2**20,
        metadata={
            "help": "longest line of a CSV/TSV/JSONL file, in bytes (CSV/TSV: characters); a longer line is "
            "quarantined (text_too_long) without being read into memory; also the CSV field size limit"
        },
    )
    batch_rows: int = field(default=4096, metadata={"help": "rows read per batch"})
    encoding: str = field(
        default="utf-8",
        metadata={"help": "text encoding of CSV/TSV/JSONL files, e.g. latin-1 (Parquet is always UTF-8)"},
    )

    def __post_init__(self) -> None:
        require_choice("format", self.format, FORMATS)
        require_choice("oversize", self.oversize, OVERSIZE)
        require_int("max_text_chars", self.max_text_chars, 1)
        require_int("max_line_bytes", self.max_line_bytes, 1)
        require_int("batch_rows", self.batch_rows, 1)
        if is_database(self.path) != (self.query is not None):
            raise ValueError(
                "input.query goes with a database URL in input.path (postgresql://user@host:5432/db) and only with "
                f"one; got path {self.path.split('@')[-1]!r} and {'a' if self.query else 'no'} query"
            )
        unknown = sorted(set(self.columns) - set(CONTRACT_FIELDS))
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

    def mapped_sources(self) -> list[str]:
        """The source columns of the contract fields: all that ingest reads of a file."""
        return [self.source(name) for name in CONTRACT_FIELDS]


@dataclass
class RawRow:
    number: int  # 0-based position in the input (a dataset's parts one after another)
    values: dict[str, Any]
    problem: tuple[str, str] | None = None  # (reason, detail) found while reading
    part: str = ""  # the dataset part file it came from, relative to the dataset ("": the input is one file)


def validate(row: RawRow, config: InputConfig) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(pair, None) for a good row, (None, quarantine row) for a bad one."""
    values = row.values
    if row.problem is not None:
        return None, quarantine_row(row, *row.problem)
    pair_id, problem = _pair_id(values.get(config.source("pair_id")))
    if problem is not None:
        return None, quarantine_row(row, *problem)
    pair: dict[str, Any] = {"pair_id": pair_id}
    if pair_id is None:
        if "pair_id" in config.columns or config.source("pair_id") in values:
            return None, quarantine_row(row, "missing_field", f"pair_id is {values.get(config.source('pair_id'))!r}")
        pair["pair_id"] = f"row-{row.number}"  # exports without ids: the row number is stable for a file
    for name in TEXT_FIELDS:
        value = values.get(config.source(name))
        if value is None:
            return None, quarantine_row(row, "missing_field", f"{name} ({config.source(name)}) is null")
        if not isinstance(value, str):
            return None, quarantine_row(row, "wrong_type", f"{name} is {type(value).__name__} {value!r}, not text")
        if not value.strip():
            return None, quarantine_row(row, "empty_text", f"{name} is {value!r}")
        if "\x00" in value:
            return None, quarantine_row(row, "nul_character", _nul_detail(name, value))
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
    if "\x00" in pair["split"]:
        return None, quarantine_row(row, "nul_character", _nul_detail("split", pair["split"]))
    if config.split is not None and pair["split"] != config.split:
        return None, None  # not asked for: neither labeled nor quarantined (counted as skipped)
    return pair, None


def _pair_id(value: Any) -> tuple[str | None, tuple[str, str] | None]:
    """(the pair_id as text, None), (None, None) when it is absent or blank, or (None, problem)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None, ("wrong_type", f"pair_id is {type(value).__name__} {value!r}, not text or an integer")
    text = value if isinstance(value, str) else str(value)  # 1 and "1" are one id
    if not text.strip():
        return None, None
    if len(text) > MAX_PAIR_ID_CHARS:
        return None, ("text_too_long", f"pair_id has {len(text):,} characters, limit {MAX_PAIR_ID_CHARS}")
    if "\x00" in text:
        return None, ("nul_character", _nul_detail("pair_id", text))
    return text, None


def _nul_detail(name: str, value: str) -> str:
    return f"{name} holds a NUL character (\\x00) at position {value.index(chr(0))}: {value!r}"


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
    if isinstance(value, str):
        grade = int(value.strip()) if ASCII_INTEGER.fullmatch(value.strip()) else None
    elif isinstance(value, float):
        grade = int(value) if value.is_integer() else None
    else:
        grade = value if isinstance(value, int) and not isinstance(value, bool) else None
    if grade is None:
        return None, ("wrong_type", f"gold grade {value!r} is not an integer")
    if grade not in config.grades:
        return None, ("unknown_grade", f"gold grade {grade} is not in {list(config.grades)}")
    return grade, None


def _binned_grade(value: Any, config: InputConfig) -> tuple[int | None, tuple[str, str] | None]:
    if isinstance(value, str):  # float() would also take "٣", "1_0" and "nan"
        score = float(value.strip()) if ASCII_NUMBER.fullmatch(value.strip()) else math.nan
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        score = float(value)
    else:
        score = math.nan
    if not math.isfinite(score):
        return None, ("wrong_type", f"gold score {value!r} is not a finite number (grade_bins needs one)")
    return sorted(config.grades)[bisect.bisect_right(config.grade_bins, score)], None


def quarantine_row(row: RawRow, reason: str, detail: str) -> dict[str, Any]:
    """The quarantine record of ``row``: every text valid UTF-8, ``detail`` and ``pair_id`` at most
    MAX_DETAIL_CHARS and ``row`` at most MAX_ROW_CHARS characters (then marked as truncated)."""
    if reason not in REASONS:
        raise ValueError(f"unknown quarantine reason {reason!r}")
    pair_id = row.values.get("pair_id")
    return {
        "row_number": row.number,
        "pair_id": None if pair_id is None else _bounded(str(pair_id), MAX_DETAIL_CHARS),
        "reason": reason,
        "detail": _bounded(f"{row.part}: {detail}" if row.part else detail, MAX_DETAIL_CHARS),
        "row": _bounded(json.dumps(row.values, ensure_ascii=False, default=repr, sort_keys=True), MAX_ROW_CHARS),
    }


def _bounded(text: str, limit: int) -> str:
    """``text`` as valid UTF-8 (lone surrogates, i.e. undecodable bytes, written as backslash escapes), cut to
    ``limit`` characters with a marker giving its full length."""
    printable = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return printable if len(printable) <= limit else f"{printable[:limit]}... [truncated, {len(text):,} chars]"
