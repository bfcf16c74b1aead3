"""The merge's copy of the input's quarantine (pipelines.ads.intake.contracts.copy_table) holds a batch, not the file:
the peak of Arrow's memory pool during the copy, in a fresh process, for a quarantine of 40,000 rows of 4 KiB (160 MiB
of text), measured beside the whole-file read the merge used to do. (The pool, not RSS: Arrow's allocator keeps
per-thread arenas, which add ~80 MiB of RSS to any read here, streamed or not.)"""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.ads.intake.contracts import write_tables

CHILD = """
import sys, json
import pyarrow.parquet as pq
from pipelines.ads.intake.contracts import copy_table, write_table

import pyarrow as pa

source, target, how = sys.argv[1:]
if how == "batches":
    copy_table(source, target)
else:  # what the merge did before
    write_table(pq.read_table(source), target)
print(json.dumps({"copy_mib": round(pa.default_memory_pool().max_memory() / 2**20)}))
"""
ROWS, ROW_BYTES = 40_000, 4096


def copied_with(how: str, source: Path, target: Path) -> int:
    command = [sys.executable, "-c", CHILD, str(source), str(target), how]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["copy_mib"]


def test_the_merge_copies_a_large_quarantine_a_batch_at_a_time(tmp_path):
    source = tmp_path / "quarantine.parquet"
    schema = pa.schema([("line", pa.int64()), ("field", pa.string()), ("row", pa.string())])
    filler = "x" * ROW_BYTES
    tables = (  # written 1,000 rows at a time: this process never holds the file either
        pa.table(
            {
                "line": list(range(k, k + 1000)),
                "field": ["query"] * 1000,
                "row": [f"{i}{filler}"[:ROW_BYTES] for i in range(k, k + 1000)],
            },
            schema=schema,
        )
        for k in range(0, ROWS, 1000)
    )
    write_tables(tables, schema, source)
    whole = copied_with("whole", source, tmp_path / "whole.parquet")
    batched = copied_with("batches", source, tmp_path / "copy.parquet")
    print(f"copy of {ROWS:,} quarantine rows of {ROW_BYTES} bytes: whole file {whole} MiB, batches {batched} MiB")
    copy = pq.ParquetFile(tmp_path / "copy.parquet")
    assert copy.metadata.num_rows == ROWS and copy.schema_arrow == schema
    tail = copy.read_row_group(copy.num_row_groups - 1)
    last = tail.slice(tail.num_rows - 1).to_pylist()[0]
    assert last == {"line": ROWS - 1, "field": "query", "row": f"{ROWS - 1}{filler}"[:ROW_BYTES]}
    assert whole > 150  # the file's 160 MiB of text, at least
    assert batched < 48, batched
