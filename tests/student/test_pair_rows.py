"""PairRows reads an Arrow table as the list of dict rows it stands for: same rows, same order, one Arrow take per
DataLoader batch."""

import pyarrow as pa
import pytest
from torch.utils.data import DataLoader

from student.pair_rows import PairRows


def rows() -> list[dict]:
    return [
        {"pair_id": "a", "grade": 1, "votes": [0, 2], "source": "teacher"},
        {"pair_id": "b", "grade": None, "votes": [0, 0]},  # no source: read back as None
        {"pair_id": "c", "grade": 0, "votes": [3, 0], "source": "gold", "gold_grade": 0},
    ]


def test_rows_read_back_as_written_with_every_key_any_row_has():
    table = PairRows.of(rows())
    full = [{"source": None, "gold_grade": None} | r for r in rows()]
    assert len(table) == 3 and list(table) == full
    assert table[1] == full[1] and table[-1] == full[2]
    assert list(table[1:]) == full[1:] and list(table[::-1]) == full[::-1]
    assert table.__getitems__([2, 0, 2]) == [full[2], full[0], full[2]]
    assert table.column("grade") == [1, None, 0] and table.column("rationale") == [None, None, None]
    assert PairRows.of(table) is table and PairRows.of(table.table).table is table.table
    with pytest.raises(IndexError, match="row 3 of 3"):
        table[3]


def test_iteration_crosses_arrow_chunks_in_order():
    chunked = pa.concat_tables([pa.table({"i": list(range(k, k + 5))}) for k in range(0, 20, 5)])
    assert chunked["i"].num_chunks == 4
    assert [r["i"] for r in PairRows(chunked)] == list(range(20))


def test_a_dataloader_fetches_each_batch_in_one_take(monkeypatch):
    table = PairRows.of(rows())
    takes = []
    original = PairRows.__getitems__

    def counted(self, indices):
        takes.append(list(indices))
        return original(self, indices)

    monkeypatch.setattr(PairRows, "__getitems__", counted)
    loader = DataLoader(table, batch_sampler=[[2, 0], [1]], collate_fn=lambda batch: [r["pair_id"] for r in batch])
    assert list(loader) == [["c", "a"], ["b"]] and takes == [[2, 0], [1]]
