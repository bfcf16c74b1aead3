"""Arrow batches and decoded values as the raw rows intake validates, for every reader (files: readers; a query:
sql_source): the column check, a batch's rows and their sizes, undecodable text found row by row."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.ads.intake.contracts import ContractError


def check_file_columns(path: str, present: list[str], wanted: list[str], keep: set[str]) -> None:
    """The file's columns (``present``) must hold every ``wanted`` one, and name each ``keep`` one at most once
    (a CSV header or a Parquet schema may repeat a name, and a row would then keep its last value silently)."""
    shown = present if len(present) <= 50 else [*present[:50], f"... {len(present) - 50} more"]
    missing = [c for c in wanted if c not in present]
    if missing:
        raise ContractError(
            f"{path} has no column(s) {missing} (columns: {shown}); map them with input.columns, "
            "e.g. --set 'input.columns={ad_title: product_title}', or name only columns the file has where a stage "
            "asks for more (agpo score's carry_columns)"
        )
    counts = Counter(present)
    repeated = sorted(c for c in keep if counts[c] > 1)
    if repeated:
        raise ContractError(
            f"{path} names column(s) {repeated} more than once (columns: {shown}): which one holds the value is "
            "unclear; rename or drop the copies"
        )


_TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def row_bytes(batch: pa.RecordBatch) -> list[int]:
    """The bytes each row of ``batch`` holds: its text and binary values' lengths, plus an even share of its
    other columns (numbers, lists, ...)."""
    text = [c for c in batch.columns if _is_text(c.type)]
    other = sum(c.nbytes for c in batch.columns if not _is_text(c.type)) // max(batch.num_rows, 1)
    sizes = pa.array([other] * batch.num_rows, pa.int64())
    for column in text:
        sizes = pc.add(sizes, pc.fill_null(pc.binary_length(column), 0).cast(pa.int64()))
    return sizes.to_pylist()


def _is_text(kind: pa.DataType) -> bool:
    return any(test(kind) for test in _TEXT_TYPES)


def arrow_rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """The batch's rows; when a string column holds invalid UTF-8, its values come as bytes instead, for
    :func:`undecodable` to decode or quarantine row by row."""
    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        binary = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}
        columns = [column.view(binary.get(column.type, column.type)) for column in batch.columns]
        return pa.RecordBatch.from_arrays(columns, names=batch.schema.names).to_pylist()


def undecodable(values: dict[str, Any]) -> tuple[str, str] | None:
    """The first undecodable text in ``values`` as (reason, detail); bytes that decode become text."""
    for name, value in values.items():
        if isinstance(value, bytes):
            try:
                values[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                return "undecodable_bytes", f"{name}: {value[:40]!r}"
        elif isinstance(value, str) and not value.isascii() and any("\ud800" <= ch <= "\udfff" for ch in value):
            raw = value.encode("utf-8", "surrogateescape" if _escaped_bytes(value) else "backslashreplace")
            return "undecodable_bytes", f"{name}: {raw[:40]!r}"
    return None


def _escaped_bytes(text: str) -> bool:
    """True when every surrogate in ``text`` stands for an undecodable byte (surrogateescape's range)."""
    return all("\udc80" <= ch <= "\udcff" for ch in text if "\ud800" <= ch <= "\udfff")
