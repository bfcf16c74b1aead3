"""The end of an annotation run: once every shard is done, one merger (the ``merge`` lease) clears what
killed workers left, checks that every shard was labelled by the same teacher and settings and that its
files match its manifest, checks the row accounting (input rows = labels + quarantine + rows of other
splits; label-cache hits + misses = graded pairs), and writes the quality report and ``summary.json`` with
every output's SHA-256. ``agpo distil`` reads labels only through ``verified_labels``, which checks those
checksums.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from durable.fileio import sha256_file
from pipelines.ads.annotation.commits import OUTPUTS, check_fingerprint, shard_done, unreferenced, verified_outputs
from pipelines.ads.annotation.report import quality_report
from pipelines.ads.annotation.shards import LEASES, read_manifest, shard_name
from pipelines.ads.intake.contracts import ContractError, copy_table
from pipelines.io import print_summary, remove_temps, write_json_atomic
from pipelines.lease import Lease, remove_leases
from pipelines.storage import locate, publish, redact

T = TypeVar("T")


def merge(config: Any, throughput: dict[str, Any] | None = None, attempt: int = 1) -> dict[str, Path]:
    """Check the row accounting over all shards, then write summary.json and the quality report (one
    merger at a time: the ``merge`` lease; a second one waits, then merges again to the same files)."""
    return under_merge_lease(
        Path(config.out_dir), config.lease_seconds, attempt, lambda lease: _merge_held(config, throughput or {}, lease)
    )


def under_merge_lease(out: Path, seconds: float, attempt: int, work: Callable[[Lease], T]) -> T:
    """Run a run's last step, ``work(lease)``, under its ``merge`` lease (a second merger waits, then does it
    again to the same files); then clear the run's lease folder: every shard is done, no lease is needed."""
    lease = Lease(out / LEASES, "merge", seconds, attempt)
    lease.acquire(done=lambda: False)
    try:
        result = work(lease)
    finally:
        lease.release()
    remove_leases(out / LEASES)
    return result


def _merge_held(config: Any, throughput: dict[str, Any], lease: Lease) -> dict[str, Path]:
    out = Path(config.out_dir)
    partition_manifest, shards, files = finished_shards(out, config.num_shards, OUTPUTS, "annotate")
    counts = {
        **row_counts(partition_manifest, shards, "labels", "labels"),
        "review_queue": sum(s["review"]["rows"] for s in shards),
        "distinct_pairs": sum(s["distinct_pairs"] for s in shards),
        "duplicate_rows": sum(s["duplicate_rows"] for s in shards),
        "cache_hits": sum(s["cache_hits"] for s in shards),  # graded pairs read from the label cache
        "cache_misses": sum(s["cache_misses"] for s in shards),  # graded pairs the teacher labelled
    }
    if counts["cache_hits"] + counts["cache_misses"] != counts["distinct_pairs"]:
        raise ContractError(f"label-cache accounting failed: {counts}; cache hits + misses must equal distinct_pairs")
    paths = quality_report(config, counts, throughput, out)
    summary = {
        **counts,
        "mode": config.voting.mode,
        "teacher_run_ids": sorted({s["teacher_run_id"] for s in shards}),
        "prompt_version": ", ".join(sorted({s["prompt_version"] for s in shards})),
        "throughput": throughput,
        "files": files,  # SHA-256 of every output file: distil checks them before it reads
    }
    lease.check()
    paths = {
        "labels": out / "labels",
        "review_queue": out / "review",
        "quarantine": out / "quarantine",
        **paths,
        "summary": write_json_atomic(out / "summary.json", summary),
        **published(out, files, config.publish, counts),
    }
    report = json.loads(paths["report"].read_text())
    agreement = report.get("gold_agreement") or {}
    print_summary(
        f"annotate: {counts['rows_in']:,} rows in -> {counts['labels']:,} labels, {counts['quarantined']:,} "
        f"quarantined, {counts['skipped_other_splits']:,} other splits; {counts['review_queue']:,} to review; "
        f"label cache {counts['cache_hits']:,} hits, {counts['cache_misses']:,} labelled by the teacher; "
        + (f"gold accuracy {agreement['accuracy']:.3f} on {agreement['pairs']:,} pairs; " if agreement else "")
        + (f"{report['throughput']['pairs_per_s']:.1f} pairs/s" if report["throughput"].get("pairs") else "merged")
        + (f" on {report['throughput']['threads']} threads" if report["throughput"].get("threads") else ""),
        paths,
    )
    return paths


def published(out: Path, files: dict[str, str], uri: str | None, counts: dict[str, Any]) -> dict[str, str]:
    """A finished run's output files (labels or scores, review queue, quarantine) published under ``uri`` (a
    folder or an object-store prefix) exactly once, with a ``_manifest.json`` of its row counts written last
    (pipelines.storage.publish); ``{}`` when the run publishes nowhere."""
    if uri is None:
        return {}
    return {"published": redact(publish(out, sorted(files), locate(uri), {"rows": counts}).uri)}


def verified_labels(labels_dir: str | Path) -> list[Path]:
    """The label files of a merged annotation run, each checked against the SHA-256 that its merge recorded
    in ``summary.json`` (beside ``labels/``): a missing or changed file is an error naming it. Files the
    merge did not record (a fenced-out worker's late write) are never read."""
    folder = Path(labels_dir)
    summary_path = folder.parent / "summary.json"
    if not summary_path.is_file():
        raise ContractError(
            f"{folder} has no merge summary ({summary_path}); finish the annotation run with `agpo annotate` "
            "(its merge checks every shard) before distilling from it"
        )
    recorded = {
        folder.parent / name: sha
        for name, sha in json.loads(summary_path.read_text()).get("files", {}).items()
        if Path(name).parent.name == folder.name
    }
    missing = sorted(p.name for p in recorded if not p.is_file())
    if not recorded or missing:
        raise ContractError(
            f"{folder} does not hold the files its merge recorded in {summary_path} (missing: {missing}); rerun "
            "`agpo annotate` into a fresh out_dir"
        )
    for path, sha in sorted(recorded.items()):
        if sha256_file(path) != sha:
            raise ContractError(f"{path} changed after its annotation run was merged (checksum differs); rerun it")
    return sorted(recorded)


def finished_shards(
    out: Path, num_shards: int, outputs: tuple[str, ...], command: str
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """Under the merge lease, once every shard of a run is done: clear what killed workers left (``sweep``),
    check that all shards did the same work and that their files match their manifests, and gather the
    input's bad rows into ``quarantine/input.parquet`` beside the shards' duplicates. Returns the partition
    manifest, the shard manifests and ``{relative path: SHA-256}`` of every output file."""
    partition_manifest = read_manifest(out / "partition")
    shards = [shard_done(out, k) for k in range(num_shards)]
    if partition_manifest is None or any(s is None for s in shards):
        raise ContractError(f"{out} is not finished yet; run `agpo {command}` on the missing shards first")
    sweep(out, outputs, shards)
    check_same_work(out, shards)
    files = verified_outputs(out, shards, outputs)
    bad_rows = copy_table(out / "partition" / "quarantine.parquet", out / "quarantine" / "input.parquet")
    files["quarantine/input.parquet"] = sha256_file(bad_rows)
    return partition_manifest, shards, files


def row_counts(
    partition_manifest: dict[str, Any], shards: list[dict[str, Any]], output: str, kept: str
) -> dict[str, int]:
    """rows_in, ``kept`` (the rows of the shards' ``output``), quarantined and skipped (other splits),
    checked to add up."""
    counts = {
        "rows_in": partition_manifest["rows_in"],
        kept: sum(s[output]["rows"] for s in shards),
        "quarantined": partition_manifest["quarantined"] + sum(s["quarantine"]["rows"] for s in shards),
        "skipped_other_splits": partition_manifest["skipped"],
    }
    if counts[kept] + counts["quarantined"] + counts["skipped_other_splits"] != counts["rows_in"]:
        raise ContractError(f"row accounting failed: {counts}; {kept} + quarantined + skipped must equal rows_in")
    return counts


def sweep(out: Path, outputs: tuple[str, ...], shards: list[dict[str, Any]]) -> None:
    """Clear what killed or fenced-out workers left once every shard is done: work folders, temp files
    beside the run's files and the shards' ``outputs``, shard files no manifest names, partition temp
    folders and leases other than the merge's."""
    shutil.rmtree(out / "work", ignore_errors=True)
    for path in unreferenced(out, shards, outputs):
        path.unlink(missing_ok=True)
    for folder in (out, *(out / name for name in outputs), out / "shards"):
        remove_temps(folder)
    for lease in (out / LEASES).glob("*"):
        if lease.name != "merge":
            shutil.rmtree(lease, ignore_errors=True)


def check_same_work(out: Path, shards: list[dict[str, Any]]) -> None:
    """Every shard labelled by the same teacher and settings (only their inputs differ)."""
    first = {k: v for k, v in shards[0]["fingerprint"].items() if k != "shard_input_sha256"}
    for shard in shards[1:]:
        check_fingerprint(
            {k: v for k, v in shard["fingerprint"].items() if k != "shard_input_sha256"},
            first,
            f"shard {shard['shard']} ({out / 'shards' / shard_name(shard['shard'])}.json), against shard 0,",
            "relabel the shards that differ with one teacher and one set of settings",
        )
