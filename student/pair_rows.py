"""Labelled pairs held as Arrow columns and read as dict rows, a batch at a time.

A Python dict row of a labelled pair costs about 1.2 KB; the same pair in Arrow columns costs its bytes (about
200 for a query, an ad title and four votes). The distillation keeps its pairs as ``PairRows``, so a run over
millions of teacher labels holds them columnar, and only the batch being read becomes Python rows. A
``PairRows`` is a read-only sequence of dicts, the rows of ``to_pylist``, so code written for a list of rows
reads it unchanged; ``__getitems__`` lets a DataLoader fetch a whole batch in one Arrow ``take``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import pyarrow as pa

READ_BATCH_ROWS = 8192  # rows made into Python dicts at a time while iterating


class PairRows(Sequence[dict[str, Any]]):
    """The rows of an Arrow table as a sequence of dicts (module docstring)."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table

    @classmethod
    def of(cls, rows: PairRows | pa.Table | Sequence[dict[str, Any]]) -> PairRows:
        """``rows`` as a ``PairRows``: a table is wrapped; a list of dicts becomes columns, one per key that any
        row has (a row without a key reads it back as None)."""
        if isinstance(rows, PairRows):
            return rows
        if isinstance(rows, pa.Table):
            return cls(rows)
        names = dict.fromkeys(key for row in rows for key in row)
        return cls(pa.table({name: [row.get(name) for row in rows] for name in names}))

    def __len__(self) -> int:
        return self.table.num_rows

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> PairRows: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | PairRows:
        if isinstance(index, slice):
            return PairRows(self.table.take(list(range(len(self)))[index]))
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        return self.table.slice(index % len(self), 1).to_pylist()[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices``, in their order (a DataLoader's batched fetch)."""
        return self.table.take(list(indices)).to_pylist()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.table.to_batches(max_chunksize=READ_BATCH_ROWS):
            yield from batch.to_pylist()

    def column(self, name: str) -> list[Any]:
        """One column's values, in row order (None where the column is absent)."""
        if name not in self.table.column_names:
            return [None] * len(self)
        return self.table[name].to_pylist()
