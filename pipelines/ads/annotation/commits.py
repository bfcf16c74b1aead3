"""A shard's commits: its work fingerprint, its chunks and its final files, each verified when resumed.

- **Fingerprint**: what produced a shard's labels (teacher weights, run id, prompt version, engine and its
  options, every voting setting, chunk size, the shard input's checksum), as flat keys. It is written into
  ``work/<k>/fingerprint.json`` when a shard starts, into every chunk marker and into the shard manifest; a
  run with other settings that finds them is refused with the differing keys (``FingerprintMismatch``),
  so a resume never mixes labels of two teachers or settings, and a rerun never answers with old labels.
- **Chunk**: ``chunk-000003.labels.parquet`` and ``.review.parquet`` (and ``.cache.parquet``, its new label-cache
  entries), then the ``.done`` marker (rows, checksums, fingerprint hash, counts such as cache hits): the chunk's
  commit point. On resume a marker is trusted only when its fingerprint, its row count against the chunk cut
  again from the input and its files' checksums agree.
- **Shard**: the shard's files are written under temp names beside their targets and counted; then, fenced
  by the shard's lease, each is linked into place under a name that carries its content's SHA-256
  (``labels/shard-00003-<sha>.parquet``), and the manifest ``shards/<k>.json``, naming those files, is
  created exclusively last. A file of a given name can only ever hold one content, so a worker that lost
  its lease and wakes mid-publish cannot change what a manifest describes; the manifest's exclusive create
  makes it the loser (``LeaseLost``), and the merge removes files no manifest names (``unreferenced``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from durable.fileio import fsync_dir, sha256_file
from durable.fingerprint import canonical_json, describe_differences
from pipelines.ads.annotation.shards import shard_name
from pipelines.ads.intake.contracts import ContractError, write_table, write_tables
from pipelines.io import remove_temps, temp_path, write_json_atomic
from pipelines.lease import Lease, LeaseLost

FINGERPRINT = "fingerprint.json"
OUTPUTS = ("labels", "review", "quarantine")  # a shard's files, one folder each


class FingerprintMismatch(ContractError):
    """Work on disk was produced with other settings than this run's."""


def flat(prefix: str, config: Any) -> dict[str, Any]:
    """A dataclass as ``prefix.field`` keys (the fingerprint names the exact setting that differs)."""
    return {f"{prefix}.{k}": v for k, v in dataclasses.asdict(config).items()}


def fingerprint_hash(fingerprint: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()[:16]


def check_fingerprint(written: dict[str, Any] | None, current: dict[str, Any], where: str, fix: str) -> None:
    """Refuse work of ``where`` produced with other settings, naming every differing key."""
    if written is None:
        raise FingerprintMismatch(f"{where} records no fingerprint (written by an older version); {fix}")
    details = describe_differences(written, current, limit=10)
    if details:
        raise FingerprintMismatch(f"{where} was produced with other settings (there -> now: {details}); {fix}")


def start_work(work: Path, fingerprint: dict[str, Any], fix: str) -> None:
    """Record the shard's fingerprint in a new work folder, or check the one an earlier run left."""
    path = work / FINGERPRINT
    if path.is_file():
        check_fingerprint(json.loads(path.read_text()), fingerprint, str(work), fix)
    else:
        write_json_atomic(path, fingerprint)


def chunk_path(work: Path, index: int, kind: str) -> Path:
    return work / f"chunk-{index:06d}.{kind}"


def committed_chunk(work: Path, index: int, pairs: int, fingerprint: dict[str, Any]) -> bool:
    """Whether chunk ``index`` (of ``pairs`` pairs) was committed by this same work; a marker that does
    not match its chunk or its files is an error that says how to relabel the chunk."""
    marker = chunk_path(work, index, "done")
    if not marker.is_file():
        return False
    record = json.loads(marker.read_text())
    fix = f"delete {marker} to relabel that chunk"
    if record.get("fingerprint") != fingerprint_hash(fingerprint):
        raise FingerprintMismatch(f"{marker} was committed with other settings than {work / FINGERPRINT}; {fix}")
    if record["pairs"] != pairs:
        raise ContractError(f"{marker} counts {record['pairs']} pairs but its chunk has {pairs}; {fix}")
    for kind, sha in record["sha256"].items():
        if sha256_file(chunk_path(work, index, kind)) != sha:
            raise ContractError(f"{chunk_path(work, index, kind)} changed after it was committed; {fix}")
    return True


def commit_chunk(
    work: Path,
    index: int,
    tables: dict[str, pa.Table],
    fingerprint: dict[str, Any],
    counts: dict[str, int] | None = None,
) -> None:
    """Write a chunk's tables (e.g. ``labels.parquet``, ``review.parquet``; the first holds one row per pair
    of the chunk), then its marker, with the chunk's ``counts`` (e.g. label-cache hits): the commit point."""
    shas = {kind: sha256_file(write_table(table, chunk_path(work, index, kind))) for kind, table in tables.items()}
    pairs = next(iter(tables.values())).num_rows
    record = {"pairs": pairs, "sha256": shas, "fingerprint": fingerprint_hash(fingerprint), "counts": counts or {}}
    write_json_atomic(chunk_path(work, index, "done"), record)


def chunk_counts(work: Path) -> dict[str, int]:
    """The ``counts`` of every committed chunk of a work folder, summed: each chunk once, however often resumed."""
    total: dict[str, int] = {}
    for marker in sorted(work.glob("chunk-*.done")):
        for name, count in json.loads(marker.read_text()).get("counts", {}).items():
            total[name] = total.get(name, 0) + count
    return total


def leased_shard(
    out: Path, shard: int, lease: Lease, fingerprint: dict[str, Any], work: Callable[[], Any], fix: str
) -> tuple[dict[str, Any], Any]:
    """Run ``work`` on a shard under its ``lease`` unless the shard is done (waiting while another worker
    holds it), then check the finished shard's fingerprint (``fix``: what to do on a mismatch); returns its
    manifest and what ``work`` returned (0 when another worker did the work)."""
    result = 0
    if shard_done(out, shard) is None and lease.acquire(done=lambda: shard_done(out, shard) is not None):
        try:
            if shard_done(out, shard) is None:  # the previous holder may have finished it
                result = work()
        finally:
            lease.release()
    manifest = shard_done(out, shard)
    check_fingerprint(
        manifest.get("fingerprint"), fingerprint, f"shard {shard} ({out / 'shards' / shard_name(shard)}.json)", fix
    )
    return manifest, result


def begin_shard(out: Path, shard: int, outputs: tuple[str, ...], fingerprint: dict[str, Any], fix: str) -> Path:
    """Take up a shard's work under its lease: clear the temp files killed writers left beside its outputs
    and its manifest (this worker owns them now), record or check the work's fingerprint (``fix``: what to
    do on a mismatch) and clear the work folder's temps; returns the work folder."""
    name = shard_name(shard)
    for folder in outputs:
        remove_temps(out / folder, f"shard-{name}.parquet")
    remove_temps(out / "shards", f"{name}.json")
    work = out / "work" / name
    start_work(work, fingerprint, fix)
    remove_temps(work)
    return work


def publish_shard(
    out: Path,
    shard: int,
    sources: dict[str, tuple[Any, pa.Schema]],
    record: dict[str, Any],
    counted: tuple[str, ...],
    lease: Lease,
) -> dict[str, Any]:
    """Stage each output's tables (``sources``: output -> (tables, schema)) as ``<output>/shard-<k>.parquet``,
    check that the rows of the ``counted`` outputs add up to ``record['rows_in']``, then, fenced by the
    lease, link them into place under content-addressed names and create the shard's manifest (``record``
    plus each output's file, rows and SHA-256) exclusively: the shard's commit point. The work folder goes
    last."""
    name = shard_name(shard)
    staged, manifest = {}, {"shard": shard, **record}
    for output, (tables, schema) in sources.items():
        tmp, rows, sha = stage(tables, schema, out / output / f"shard-{name}.parquet")
        staged[tmp] = out / output / f"shard-{name}-{sha[:16]}.parquet"
        manifest[output] = {"file": staged[tmp].name, "rows": rows, "sha256": sha}
    written = {output: manifest[output]["rows"] for output in counted}
    work = out / "work" / name
    if sum(written.values()) != record["rows_in"]:
        for tmp in staged:
            tmp.unlink()
        raise RuntimeError(f"shard {shard}: {record['rows_in']} rows in, {written} out; delete {work} and rerun")
    lease.check()
    publish(staged)
    try:
        write_json_atomic(out / "shards" / f"{name}.json", manifest, exclusive=True)
    except FileExistsError:
        raise LeaseLost(f"shard {shard}: another worker committed it first; its manifest stands") from None
    shutil.rmtree(work)
    with contextlib.suppress(OSError):  # other shards still at work
        work.parent.rmdir()
    return manifest


def verified_outputs(out: Path, shards: list[dict[str, Any]], outputs: tuple[str, ...]) -> dict[str, str]:
    """``{relative path: SHA-256}`` of every finished shard's output files, each checked against its
    manifest (a file changed after its shard was committed is an error naming it)."""
    files = {}
    for shard in shards:
        for output in outputs:
            path = shard_file(out, shard, output)
            if sha256_file(path) != shard[output]["sha256"]:
                raise ContractError(
                    f"{path} does not match its shard manifest (changed after the run); rerun the shard"
                )
            files[str(path.relative_to(out))] = shard[output]["sha256"]
    return files


def stage(tables: Any, schema: pa.Schema, target: Path) -> tuple[Path, int, str]:
    """Stream ``tables`` into a temp file beside ``target``: (its path, rows, SHA-256)."""
    staged = temp_path(target)
    rows = write_tables(tables, schema, staged)
    return staged, rows, sha256_file(staged)


def read_tables(paths: list[Path]) -> Any:
    return (pq.read_table(p) for p in paths)


def shard_file(out: Path, manifest: dict[str, Any], output: str) -> Path:
    """The file of ``output`` (labels, review, ...) that a shard's manifest names."""
    return out / output / manifest[output]["file"]


def unreferenced(out: Path, shards: list[dict[str, Any]], outputs: tuple[str, ...]) -> list[Path]:
    """Shard files in the ``outputs`` folders that no manifest names (a fenced-out worker's)."""
    named = {shard_file(out, shard, output) for shard in shards for output in outputs}
    return [p for output in outputs for p in sorted((out / output).glob("shard-*.parquet")) if p not in named]


def publish(staged: dict[Path, Path]) -> None:
    """Link staged files to their content-addressed targets (temp -> target; a target that exists already
    holds the same bytes), drop the temps, then make the links durable."""
    for tmp, target in staged.items():
        with contextlib.suppress(FileExistsError):
            os.link(tmp, target)
        tmp.unlink()
    for folder in {target.parent for target in staged.values()}:
        fsync_dir(folder)


def shard_done(out: Path, shard: int) -> dict[str, Any] | None:
    """The manifest of a finished shard (``shards/<k>.json``, its commit point), or None."""
    path = out / "shards" / f"{shard_name(shard)}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
