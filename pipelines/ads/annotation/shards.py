"""Split validated input into shards by a stable hash, and keep manifests of what is done.

``partition`` streams the input once: each row is validated (pipelines.ads.intake.ingest); good pairs go to
``partition/input-00003.parquet`` by ``blake2b(key) mod num_shards``, bad rows to
``partition/quarantine.parquet``. The key (``by``) is the pair_id (``agpo score``) or the normalised text
the prompt renders (``text``, ``agpo annotate``: pipelines.ads.annotation.dedup.shard_text), so that
repeated (query, ad) pairs meet in one shard and are graded once. Everything is written into a temp folder
(a name unique across hosts) that is renamed into place only when complete, with
``partition/manifest.json`` (row counts, per-shard counts, SHA-256 of every file, the shard key and the
input's identity). One worker partitions at a time (the ``partition`` lease,
pipelines.lease): others wait and reuse its result; the holder clears the temp folders of
killed partitions. A rerun on the same input and key reuses it.

``carry``: source columns beyond the contract that a stage wants back beside its results (``agpo score``'s
carry_columns), kept in the shard inputs as text under ``carry:<column>`` (``carried_text``); the file must have them.

Duplicate pair_ids: the first row (input order) is kept, the rest quarantined (``duplicate_pair_id``).
Sharded by pair_id, duplicates meet in one shard, where ``DedupedChunks`` finds them (memory: one shard's
pair_ids); sharded by text, copies of a pair_id may carry other text and land elsewhere, so ``partition``
finds them itself (memory: every pair_id of the input, once, in the partitioning worker).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from durable.fileio import fsync_dir, fsync_file, sha256_file
from pipelines.ads.annotation.dedup import shard_text
from pipelines.ads.intake.contracts import PAIRS_SCHEMA, ContractError
from pipelines.ads.intake.ingest import (
    QUARANTINE_SCHEMA,
    InputConfig,
    RawRow,
    is_database,
    quarantine_row,
    validate,
)
from pipelines.ads.intake.readers import input_digest, read_raw, required_sources
from pipelines.io import remove_temps, temp_path, write_json_atomic
from pipelines.lease import Lease
from pipelines.storage import locate, redact

LEASES = "leases"  # the run folder's lease folder (one lease per shard, the partition and the merge)
SHARD_INPUT_SCHEMA = PAIRS_SCHEMA.append(pa.field("row_number", pa.int64(), nullable=False))
MANIFEST = "manifest.json"
SHARD_KEYS = {"pair_id": lambda pair: pair["pair_id"], "text": shard_text}  # partition's ``by``
CARRY_PREFIX = "carry:"  # a carried source column's name in a shard input (apart from the contract's and row_number)


def shard_of(key: str, num_shards: int) -> int:
    """Stable shard of a key: the same on every machine, Python version and run (no hash seed)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_shards


def shard_name(shard: int) -> str:
    return f"{shard:05d}"


def fsync_tree(folder: Path) -> None:
    for path in folder.iterdir():
        fsync_file(path)
    fsync_dir(folder)


def input_identity(config: InputConfig) -> dict[str, Any]:
    """What must match for an existing partition to be reused: the file's content and every mapping
    setting (a regenerated but identical file is the same input)."""
    settings = json.dumps({k: v for k, v in config.__dict__.items() if k != "batch_rows"}, sort_keys=True, default=list)
    local = not is_database(config.path) and locate(config.path).is_local
    return {
        "path": str(Path(config.path).absolute()) if local else redact(config.path),
        "sha256": input_digest(config),
        "settings": hashlib.sha256(settings.encode()).hexdigest()[:16],
    }


def shard_input_schema(carry: Sequence[str] = ()) -> pa.Schema:
    """A shard input's columns: the pairs contract, row_number, and each ``carry`` column as text."""
    return pa.schema([*SHARD_INPUT_SCHEMA, *(pa.field(CARRY_PREFIX + name, pa.string()) for name in carry)])


def carried_text(value: Any) -> str | None:
    """A carried value as text, whatever the format read it as: text as it is, null as null, a JSON value (a
    number, a bool, a list, an object) as JSON, anything else (a date, a decimal) as ``str`` writes it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float, list, dict)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def read_manifest(folder: Path) -> dict[str, Any] | None:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def partition(
    config: InputConfig,
    out_dir: str | Path,
    num_shards: int,
    lease_seconds: float = 600.0,
    attempt: int = 1,
    by: str = "pair_id",
    carry: Sequence[str] = (),
) -> dict[str, Any]:
    """Validate and shard the input by ``by`` (a ``SHARD_KEYS`` name) into ``out_dir/partition`` (reused when
    already done for this input, key and ``carry`` columns)."""
    final = Path(out_dir) / "partition"
    identity = input_identity(config)  # input_parts checks each file before it is hashed
    lease = Lease(Path(out_dir) / LEASES, "partition", lease_seconds, attempt)
    if read_manifest(final) is None and lease.acquire(done=lambda: read_manifest(final) is not None):
        try:
            remove_temps(final.parent, final.name)  # killed partitions' temp folders
            _write_partition(config, final, num_shards, identity, lease, by, list(carry))
        finally:
            lease.release()
    existing = read_manifest(final)
    asked = (identity, num_shards, by, list(carry))
    if (existing["input"], existing["num_shards"], existing.get("by", "pair_id"), existing.get("carry", [])) != asked:
        raise ContractError(
            f"{final} was partitioned from another input, shard count, shard key or carried columns; use a fresh "
            "out_dir or delete it"
        )
    return existing


def _write_partition(
    config: InputConfig, final: Path, num_shards: int, identity: dict[str, Any], lease: Lease, by: str, carry: list[str]
) -> None:
    key = SHARD_KEYS[by]
    first_rows: dict[str, int] | None = {} if by != "pair_id" else None  # pair_id -> its first row
    tmp = temp_path(final)
    tmp.mkdir(parents=True)
    schema = shard_input_schema(carry)
    writers = {k: pq.ParquetWriter(tmp / f"input-{shard_name(k)}.parquet", schema) for k in range(num_shards)}
    quarantine = pq.ParquetWriter(tmp / "quarantine.parquet", QUARANTINE_SCHEMA)
    counts = {"rows_in": 0, "valid": 0, "quarantined": 0, "skipped": 0}
    per_shard = [0] * num_shards
    try:
        read = {"required": [*required_sources(config), *carry], "columns": [*config.mapped_sources(), *carry]}
        for batch in read_raw(config, **read):
            buckets: list[list[dict[str, Any]]] = [[] for _ in range(num_shards)]
            bad = []
            for row in batch:
                pair, problem = validate(row, config)
                counts["rows_in"] += 1
                if problem is None and pair is not None and first_rows is not None:
                    first = first_rows.setdefault(pair["pair_id"], row.number)
                    problem = None if first == row.number else duplicate_row(row, pair["pair_id"], first)
                if problem is not None:
                    bad.append(problem)
                elif pair is None:
                    counts["skipped"] += 1
                else:
                    carried = {CARRY_PREFIX + name: carried_text(row.values.get(name)) for name in carry}
                    buckets[shard_of(key(pair), num_shards)].append({**pair, "row_number": row.number, **carried})
            for k, rows in enumerate(buckets):
                if rows:
                    writers[k].write_table(pa.Table.from_pylist(rows, schema=schema))
                    per_shard[k] += len(rows)
            if bad:
                quarantine.write_table(pa.Table.from_pylist(bad, schema=QUARANTINE_SCHEMA))
            counts["valid"] += sum(len(rows) for rows in buckets)
            counts["quarantined"] += len(bad)
    except BaseException:
        for writer in (*writers.values(), quarantine):
            writer.close()
        shutil.rmtree(tmp)
        raise
    for writer in (*writers.values(), quarantine):
        writer.close()
    manifest = {
        "input": identity,
        "num_shards": num_shards,
        "by": by,
        "carry": carry,
        **counts,
        "shard_rows": per_shard,
        "files": {p.name: sha256_file(p) for p in sorted(tmp.iterdir())},
    }
    write_json_atomic(tmp / MANIFEST, manifest)
    fsync_tree(tmp)
    lease.check()
    tmp.rename(final)
    fsync_dir(final.parent)


def shard_input(out_dir: str | Path, shard: int) -> Path:
    return Path(out_dir) / "partition" / f"input-{shard_name(shard)}.parquet"


class DedupedChunks:
    """A shard's input as chunks of ``size`` kept rows, streamed in input order (partition writes each
    shard in input order). A later copy of a pair_id becomes a ``duplicate_pair_id`` quarantine row in
    ``duplicates``. Memory: one read batch, one chunk and the shard's pair_id set, never the whole shard.
    Chunk boundaries depend only on the input, so a resumed run cuts the same chunks."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size
        self.rows_in = 0
        self.duplicates: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[tuple[int, list[dict[str, Any]]]]:
        seen: dict[str, int] = {}
        chunk: list[dict[str, Any]] = []
        index = 0
        for batch in pq.ParquetFile(self.path).iter_batches(batch_size=self.size):
            for row in batch.to_pylist():
                self.rows_in += 1
                first = seen.setdefault(row["pair_id"], row["row_number"])
                if first != row["row_number"]:
                    self._duplicate(row, first)
                    continue
                chunk.append(row)
                if len(chunk) == self.size:
                    yield index, chunk
                    chunk, index = [], index + 1
        if chunk:
            yield index, chunk

    def _duplicate(self, row: dict[str, Any], first: int) -> None:
        values = {k: v for k, v in row.items() if k != "row_number"}
        self.duplicates.append(duplicate_row(RawRow(row["row_number"], values), row["pair_id"], first))


def duplicate_row(row: RawRow, pair_id: str, first: int) -> dict[str, Any]:
    """The quarantine record of a later copy of ``pair_id`` (first kept at row ``first``)."""
    return quarantine_row(row, "duplicate_pair_id", f"pair_id {pair_id!r} first seen at row {first}")
