"""Stage ``agpo score``: a trained student grades a file of query-ad pairs, in resumable shards.

The annotation machinery, with the student in the teacher's place:

1. ``partition`` (pipelines.ads.annotation.shards): the same ingest as ``agpo annotate`` (Parquet / CSV /
   TSV / JSONL, column and label maps, bad rows to quarantine), split by a stable hash of pair_id into
   ``num_shards`` shard inputs.
2. ``ShardScorer.score_shard`` for each shard, under its lease: duplicate pair_ids to quarantine, then
   chunks of ``chunk_pairs`` pairs through the student's ``predict_proba`` (``batch_size`` pairs at a
   time, on the ``backend``: torch, onnxruntime or OpenVINO, ``auto`` resolved by evaluation.backend_choice), each
   committed as files then a ``.done`` marker
   (pipelines.ads.annotation.commits), so a killed run resumes at its first uncommitted chunk and only
   into the same work: the fingerprint holds the model's identity, backend, max_length, batch size,
   chunk size and the shard input's checksum. A finished shard is renamed into ``scores/`` and
   ``quarantine/`` after its row count checks out; its manifest ``shards/<k>.json`` is created last.
3. ``finish`` once every shard is done (the ``merge`` lease): checks rows_in = scored + quarantined +
   skipped (other splits), writes ``summary.json`` with the counts, pairs/s, the model version and every
   output's SHA-256.

A score row: pair_id, the ``carry_columns`` (the validated query, ad_title, gold_grade or split, or other input
columns as text, which partition keeps in the shard inputs) so a team joins nothing back, ``grade`` = argmax p
(int8, ties to the lower grade), ``probabilities`` p (float32 per grade), ``confidence`` = max p and
``model_version``: ``folder:<sha12 of model.safetensors>``
for a student folder, ``<name>/<version>`` for a ``models:/name@alias`` URI resolved in the registry
(pipelines.ads.serving.student_model), downloaded, verified and loaded in a private folder (``load_student``).
Scores are deterministic, so a rerun or a resume writes the same rows.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from durable.fileio import sha256_file
from evaluation.baseline_registry import saved_baseline
from evaluation.predictors import Predictor, backend_of, load_predictor
from pipelines.ads.annotation.commits import (
    begin_shard,
    commit_chunk,
    committed_chunk,
    leased_shard,
    publish_shard,
    read_tables,
)
from pipelines.ads.annotation.merge import finished_shards, published, row_counts, under_merge_lease
from pipelines.ads.annotation.shards import (
    CARRY_PREFIX,
    LEASES,
    DedupedChunks,
    partition,
    read_manifest,
    shard_input,
    shard_name,
)
from pipelines.ads.intake.contracts import PAIRS_SCHEMA
from pipelines.ads.intake.ingest import QUARANTINE_SCHEMA
from pipelines.ads.intake.readers import input_parts
from pipelines.ads.serving.private_folder import private_folder
from pipelines.ads.serving.score_config import CARRIED_FIELDS, REGISTRY_PREFIX, ScoreConfig
from pipelines.devices import use_device
from pipelines.io import print_summary, require_file, write_json_atomic
from pipelines.lease import Lease
from pipelines.progress import progress_bar
from pipelines.threads import use_threads

if TYPE_CHECKING:
    from tqdm import tqdm

OUTPUTS = ("scores", "quarantine")  # a shard's files, one folder each
CHUNK_TABLE = "scores.parquet"  # a chunk's scores, one row per pair
SCORES_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("grade", pa.int8(), nullable=False),
        pa.field("probabilities", pa.list_(pa.float32()), nullable=False),
        pa.field("confidence", pa.float32(), nullable=False),
        pa.field("model_version", pa.string(), nullable=False),
    ]
)


def folder_version(folder: Path) -> str:
    """``folder:<first 12 hex of model.safetensors' SHA-256>``: the identity of a student folder's weights
    (of a bi or hybrid student: of the SHA-256s of model.safetensors and ordinal_head.safetensors; of a
    baseline saved as its own kind: of its ``state_file``, e.g. a lexical matcher's lexical.json)."""
    fix = "point model at a student folder (agpo distil's model)"
    baseline = saved_baseline(folder)
    if baseline is not None:  # a baseline saved as its own kind: its whole state is one file
        return f"folder:{sha256_file(folder / baseline.state_file)[:12]}"
    weights = require_file(folder / "model.safetensors", "student weights", fix, FileNotFoundError)
    from student.model import HEAD_FILE

    head = folder / HEAD_FILE
    if not head.is_file():
        return f"folder:{sha256_file(weights)[:12]}"
    digest = hashlib.sha256((sha256_file(weights) + sha256_file(head)).encode("ascii")).hexdigest()
    return f"folder:{digest[:12]}"


def resolve_model(config: ScoreConfig, into: Path | None = None) -> tuple[Path, str]:
    """The local student folder and its version: a folder as it is; a ``models:/`` URI resolved in the
    registry to ``<name>/<version>`` once, and that version (never the alias again: it may have moved)
    downloaded into ``into`` and verified there (``pipelines.ads.serving.student_model``, imported only for such a
    URI: it imports mlflow). ``into`` must be a folder no other user can write (``private_folder``), since the
    caller loads what was verified from it; ``load_student`` does all of this. So the version every score row
    records is the one whose weights scored it."""
    if not config.model.startswith(REGISTRY_PREFIX):
        folder = Path(config.model)
        return folder, folder_version(folder)
    if into is None:
        raise ValueError("a registered model is downloaded into a private folder: pass into (load_student does)")
    from pipelines.ads.serving import student_model

    version = student_model.registered_version(config.model, config.tracking_uri)
    pinned = f"{REGISTRY_PREFIX}{version}"
    folder = student_model.load_registered_student(pinned, config.tracking_uri, into / "model")
    return Path(folder), version


def load_student(config: ScoreConfig, threads: int, placement: Any) -> tuple[Predictor, str]:
    """The student ``config.model`` names, loaded, and its version. A registered version is downloaded into a
    private folder (0700, under a parent no other user can rename it from: pipelines.ads.serving.private_folder),
    verified there and loaded from there, then the folder is removed: the bytes checked are the bytes loaded, where
    before the version was checked in ``out_dir`` (group-writable on the distributed stack) and read again by path."""
    if not config.model.startswith(REGISTRY_PREFIX):
        folder, version = resolve_model(config)
        return load_predictor(folder, config.backend, config.max_length, threads, placement), version
    with private_folder("agpo-score-") as private:
        folder, version = resolve_model(config, private)
        return load_predictor(folder, config.backend, config.max_length, threads, placement), version


def scores_schema(carry: tuple[str, ...] = ()) -> pa.Schema:
    """``SCORES_SCHEMA`` with the ``carry`` columns after pair_id: a pairs field with its contract type, any other
    input column as text."""
    carried = [PAIRS_SCHEMA.field(name) if name in CARRIED_FIELDS else pa.field(name, pa.string()) for name in carry]
    return pa.schema([SCORES_SCHEMA.field("pair_id"), *carried, *list(SCORES_SCHEMA)[1:]])


def input_columns(carry: tuple[str, ...]) -> list[str]:
    """The carried columns that are not pairs fields: the input columns partition keeps as text."""
    return [name for name in carry if name not in CARRIED_FIELDS]


def score_rows(probs: np.ndarray, rows: list[dict[str, Any]], version: str, carry: tuple[str, ...] = ()) -> pa.Table:
    """Score rows of ``probs`` [N, grades] for the shard input ``rows``: pair_id, the ``carry`` columns, argmax
    grade (ties to the lower), probabilities, max p."""
    probs = probs.astype(np.float32)
    carried = {name: [r[name if name in CARRIED_FIELDS else CARRY_PREFIX + name] for r in rows] for name in carry}
    columns = {
        "pair_id": [r["pair_id"] for r in rows],
        **carried,
        "grade": probs.argmax(1).astype(np.int8),
        "probabilities": list(probs),
        "confidence": probs.max(1),
        "model_version": [version] * len(rows),
    }
    return pa.table(columns, schema=scores_schema(carry))


class ShardScorer:
    """Scores the shards of one partitioned run with one loaded student, one writer per shard (its lease)."""

    def __init__(self, config: ScoreConfig, attempt: int = 1) -> None:
        self.config, self.out, self.attempt = config, Path(config.out_dir), attempt
        self.threads = use_threads(config.threads)
        self.device = use_device(config)
        self.student, self.version = load_student(config, self.threads.threads, self.device.placement())
        self.backend = backend_of(self.student)  # what ran: backend auto resolved, a baseline's own
        self.scored = 0  # pairs scored by this process (a resumed run skips committed chunks)

    def fingerprint(self, shard: int) -> dict[str, Any]:
        """What this run's scores of ``shard`` depend on (pipelines.ads.annotation.commits)."""
        config = self.config
        return {
            "model_version": self.version,
            "backend": self.backend,
            "max_length": config.max_length,
            "batch_size": config.batch_size,
            "chunk_pairs": config.chunk_pairs,
            "carry_columns": list(config.carry_columns),
            "shard_input_sha256": read_manifest(self.out / "partition")["files"][shard_input(self.out, shard).name],
        }

    def score_shard(self, shard: int, progress: tqdm | None = None) -> dict[str, Any]:
        """Score one shard under its lease (resuming at its first uncommitted chunk, or waiting for the worker
        that holds it); returns its manifest."""
        lease = Lease(self.out / LEASES, f"shard-{shard_name(shard)}", self.config.lease_seconds, self.attempt)
        fix = "score with the model and settings it was scored with, or into a fresh out_dir"
        manifest, _ = leased_shard(
            self.out, shard, lease, self.fingerprint(shard), lambda: self._score_held(shard, lease, progress), fix
        )
        return manifest

    def _score_held(self, shard: int, lease: Lease, progress: tqdm | None) -> None:
        work = self.out / "work" / shard_name(shard)
        fingerprint = self.fingerprint(shard)
        begin_shard(
            self.out,
            shard,
            OUTPUTS,
            fingerprint,
            f"score with the model and settings it was begun with, or delete {work}",
        )
        chunks = DedupedChunks(shard_input(self.out, shard), self.config.chunk_pairs)
        for index, chunk in chunks:
            if not committed_chunk(work, index, len(chunk), fingerprint):
                probs = self.student.predict_proba(
                    [r["query"] for r in chunk], [r["ad_title"] for r in chunk], self.config.batch_size
                )
                table = score_rows(probs, chunk, self.version, self.config.carry_columns)
                lease.check()
                commit_chunk(work, index, {CHUNK_TABLE: table}, fingerprint)
                self.scored += len(chunk)
            if progress is not None:
                progress.update(len(chunk))
        scores = read_tables(sorted(work.glob(f"chunk-*.{CHUNK_TABLE}")))
        duplicates = [pa.Table.from_pylist(chunks.duplicates, schema=QUARANTINE_SCHEMA)]
        schema = scores_schema(self.config.carry_columns)
        sources = {"scores": (scores, schema), "quarantine": (duplicates, QUARANTINE_SCHEMA)}
        record = {"rows_in": chunks.rows_in, "model_version": self.version, "fingerprint": fingerprint}
        publish_shard(self.out, shard, sources, record, OUTPUTS, lease)


def finish(config: ScoreConfig, throughput: dict[str, Any]) -> dict[str, Path]:
    """Once every shard is done (one finisher at a time: the ``merge`` lease): check the row accounting and
    write summary.json (counts, throughput, model version, every output's SHA-256)."""
    out = Path(config.out_dir)

    def finish_held(lease: Lease) -> tuple[dict[str, Path], dict[str, Any]]:
        partition_manifest, shards, files = finished_shards(out, config.num_shards, OUTPUTS, "score")
        previous = out / "summary.json"
        counts = row_counts(partition_manifest, shards, "scores", "scored")
        summary = {
            **counts,
            "model": config.model,
            "model_version": shards[0]["model_version"],
            "backend": shards[0]["fingerprint"]["backend"],  # what scored: auto resolved, a baseline's own
            "carry_columns": list(config.carry_columns),
            # a rerun of a finished run keeps its throughput
            "throughput": json.loads(previous.read_text()).get("throughput", throughput)
            if throughput["pairs"] == 0 and previous.is_file()
            else throughput,
            "files": files,
        }
        lease.check()
        paths = {"scores": out / "scores", "quarantine": out / "quarantine"}
        written = write_json_atomic(previous, summary)
        return {**paths, "summary": written, **published(out, files, config.publish, counts)}, summary

    paths, summary = under_merge_lease(out, config.lease_seconds, 1, finish_held)
    print_summary(
        f"score: {summary['rows_in']:,} rows in -> {summary['scored']:,} scored, {summary['quarantined']:,} "
        f"quarantined, {summary['skipped_other_splits']:,} other splits; model {summary['model_version']} "
        f"({summary['backend']}); {summary['throughput']['pairs_per_s']:.1f} pairs/s"
        + (f" on {summary['throughput']['threads']} threads" if summary["throughput"].get("threads") else ""),
        paths,
    )
    return paths


def run(config: ScoreConfig) -> dict[str, Path]:
    # the input and the model first: a missing file or a registry URI that resolves to nothing fails before any write
    input_parts(config.input)
    scorer = ShardScorer(config)
    out, carry = Path(config.out_dir), input_columns(config.carry_columns)
    manifest = partition(config.input, out, config.num_shards, config.lease_seconds, carry=carry)
    started = time.perf_counter()
    with progress_bar(total=manifest["valid"], desc="score", unit="pair", mininterval=1.0) as bar:
        for shard in range(config.num_shards):
            scorer.score_shard(shard, bar)
    seconds = time.perf_counter() - started
    throughput = {
        "pairs": scorer.scored,  # scored by this run (a resumed run skips committed chunks)
        "seconds": round(seconds, 2),
        "pairs_per_s": round(scorer.scored / seconds, 1) if scorer.scored else 0.0,
        "threads": scorer.threads.threads,
    }
    return finish(config, throughput)
