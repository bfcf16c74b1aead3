"""Stage ``agpo annotate``: the trained teacher labels query-ad pairs in shards, losing none.

1. ``partition`` (pipelines.ads.annotation.shards): validate the input (CSV / JSONL / Parquet, column mapping) and split
   it by a stable hash of the normalised text the prompt renders into ``num_shards`` shard inputs, so that
   repeats of a (query, ad) pair meet in one shard; bad rows and later copies of a pair_id go to quarantine.
2. ``label_shard`` for each shard (or only ``shards``, so independent workers or Airflow's mapped tasks
   can share the work): label the pairs in chunks of ``chunk_pairs`` rows (pipelines.ads.teacher.labeling:
   ``voting.mode`` sample (votes, majority grade, retries) or score (the teacher's exact grade distribution),
   confidence, review queue). With ``dedup`` (pipelines.ads.annotation.dedup) only the first row of each
   normalised (query, ad) is graded and its label is fanned out to the later rows, each under its own pair_id.
   With ``cache`` and a ``cache_dir`` (pipelines.ads.annotation.label_cache) a graded pair that the same teacher
   and settings labelled before is read from the label cache instead (a hit); the shard's new entries join the
   cache when it is done. Hits and misses are counted per chunk, in the shard manifest and the summary.
   Each finished chunk is committed atomically (files, then a ``.done`` marker); a run killed mid-shard
   resumes at its first uncommitted chunk. A finished shard is merged into ``labels/``, ``review/`` and
   ``quarantine/`` files plus ``shards/<k>.json`` (row counts, checksums), renamed into place last.
3. ``merge`` (pipelines.ads.annotation.merge) once every shard is done: checks that input rows = labels +
   quarantine (+ rows of other splits skipped on purpose), writes ``summary.json`` (with every output's
   SHA-256) and the quality report (JSON + PNG).

One worker at a time partitions, labels a shard or merges (pipelines.lease); shard work
is fingerprinted and resumes only into the same settings (pipelines.ads.annotation.commits). Every write
is temp file -> fsync -> rename; a rerun skips whatever is already done, so Airflow retries
are safe. Sampled labels are seeded per pair, so a rerun, a resume or a different sharding gives identical
labels; scored labels are greedy and exact, identical on a rerun or resume (see labeling for resharding).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from durable.fileio import files_digest, folder_files, sha256_file
from pipelines.ads.annotation.annotate_config import AnnotateConfig
from pipelines.ads.annotation.commits import (
    OUTPUTS,
    begin_shard,
    chunk_counts,
    chunk_path,
    commit_chunk,
    committed_chunk,
    flat,
    leased_shard,
    publish_shard,
    read_tables,
    shard_done,
)
from pipelines.ads.annotation.dedup import DEDUP_KEY, FanOut
from pipelines.ads.annotation.label_cache import CachedLabels, LabelCache, shard_keys
from pipelines.ads.annotation.merge import merge
from pipelines.ads.annotation.shards import (
    LEASES,
    DedupedChunks,
    partition,
    read_manifest,
    shard_input,
    shard_name,
)
from pipelines.ads.intake.ingest import QUARANTINE_SCHEMA
from pipelines.ads.teacher.labeling import LABELS_SCHEMA, REVIEW_SCHEMA, PairLabeler
from pipelines.ads.teacher.prompts import teacher_prompt
from pipelines.devices import teacher_on_device, use_device
from pipelines.io import print_summary
from pipelines.lease import Lease
from pipelines.progress import progress_bar
from pipelines.threads import use_threads

if TYPE_CHECKING:
    from tqdm import tqdm


def teacher_fingerprint(model_dir: Path, files: dict[str, str]) -> str:
    """A short, stable id of the teacher's weights (``files``: its folder's listing, durable.fileio.folder_files)."""
    weights = [files[name] for name in sorted(files) if "/" not in name and name.endswith(".safetensors")]
    if not weights:
        raise FileNotFoundError(f"{model_dir} holds no .safetensors weights; train or point to a teacher")
    digest = hashlib.sha256("".join(weights).encode()).hexdigest()
    return f"teacher-{digest[:12]}"


class ShardLabeler:
    """Labels shards of one partitioned run with one loaded teacher, one writer per shard (its lease).

    ``attempt``: the Airflow try number, recorded in the lease so that a waiting worker can say who holds it.
    """

    def __init__(self, config: AnnotateConfig, attempt: int = 1) -> None:
        self.config, self.out, self.attempt = config, Path(config.out_dir), attempt
        self.threads, self.device = use_threads(config.threads), use_device(config)
        model_dir = Path(config.teacher)
        _, self.tokenizer, engine = teacher_on_device(model_dir, config.engine, config.engine_options, self.device)
        cached = config.cache and config.cache_dir is not None
        # each file's SHA-256, read once: the weights' id and the cache's digest (every file of the folder)
        files = folder_files(model_dir) if cached else {p.name: sha256_file(p) for p in model_dir.glob("*.safetensors")}
        self.weights = teacher_fingerprint(model_dir, files)
        self.run_id = config.teacher_run_id or self.weights
        prompt = teacher_prompt(model_dir, self.tokenizer, config.prompt_version)
        self.labeler = PairLabeler(engine, self.tokenizer, prompt, config.voting, self.run_id)
        self.cache = self._label_cache(files_digest(files)) if cached else None
        self.rows_labelled = 0  # by this run, fanned-out labels included

    def _label_cache(self, teacher_digest: str) -> LabelCache:
        """The cache folder of this teacher (the digest of its folder's files, as a registered model carries) and
        the settings its labels depend on (label_cache)."""
        config = self.config
        settings = {
            "teacher_digest": teacher_digest,
            "teacher_run_id": self.run_id,
            "prompt_version": self.labeler.prompt.version,
            "engine": config.engine,
            "engine_options": dict(config.engine_options),
            **flat("voting", config.voting),
        }
        return LabelCache(config.cache_dir, settings)

    def fingerprint(self, shard: int) -> dict[str, Any]:
        """What this run's labels of ``shard`` depend on (pipelines.ads.annotation.commits)."""
        config = self.config
        shard_file = shard_input(self.out, shard).name
        return {
            "teacher_weights": self.weights,
            "teacher_run_id": self.run_id,
            "prompt_version": self.labeler.prompt.version,
            "engine": config.engine,
            "engine_options": dict(config.engine_options),
            **flat("voting", config.voting),
            "chunk_pairs": config.chunk_pairs,
            "dedup": DEDUP_KEY if config.dedup else None,
            "shard_input_sha256": read_manifest(self.out / "partition")["files"][shard_file],
        }

    def label_shard(self, shard: int, progress: tqdm | None = None) -> dict[str, Any]:
        """Label one shard under its lease (resuming at its first uncommitted chunk, or waiting for the
        worker that holds it); returns its manifest."""
        lease = Lease(self.out / LEASES, f"shard-{shard_name(shard)}", self.config.lease_seconds, self.attempt)
        fix = "annotate with the settings it was labelled with, or into a fresh out_dir"
        manifest, shown = leased_shard(
            self.out, shard, lease, self.fingerprint(shard), lambda: self._label_held(shard, lease, progress), fix
        )
        if progress is not None:
            progress.update(manifest["labels"]["rows"] - shown)
        return manifest

    def _label_held(self, shard: int, lease: Lease, progress: tqdm | None) -> int:
        """Label and commit a shard whose lease this worker holds; returns the pairs shown on ``progress``."""
        work = self.out / "work" / shard_name(shard)
        fingerprint = self.fingerprint(shard)
        fix = f"annotate with the settings it was begun with, or delete {work} to start over"
        begin_shard(self.out, shard, OUTPUTS, fingerprint, fix)
        chunks = DedupedChunks(shard_input(self.out, shard), self.config.chunk_pairs)
        fan_out = FanOut(self.config.dedup)
        cached = self.cache.lookup(shard_keys(shard_input(self.out, shard))) if self.cache else {}
        shown = 0
        for index, chunk in chunks:
            plan = fan_out.plan(chunk)
            if committed_chunk(work, index, len(chunk), fingerprint):
                if plan.keys:  # its copies' labels for the chunks to come
                    fan_out.learn(plan, pq.read_table(chunk_path(work, index, "labels.parquet")).to_pylist())
            else:
                done = self._label_fresh([chunk[i] for i in plan.fresh], cached)
                labels = fan_out.fill(plan, chunk, done.labels)
                self.rows_labelled += len(labels)
                lease.check()
                tables = {
                    "labels.parquet": pa.Table.from_pylist(labels, schema=LABELS_SCHEMA),
                    "review.parquet": pa.Table.from_pylist(done.review, schema=REVIEW_SCHEMA),
                }
                if done.entries is not None:
                    tables["cache.parquet"] = done.entries
                counts = {"cache_hits": done.hits, "cache_misses": done.misses}
                commit_chunk(work, index, tables, fingerprint, counts)
            if progress is not None:
                progress.update(len(chunk))
                shown += len(chunk)
        self._finish_shard(shard, work, chunks, fan_out, fingerprint, lease)
        return shown

    def _label_fresh(self, fresh: list[dict[str, Any]], cached: dict[bytes, dict[str, Any]]) -> CachedLabels:
        """The labels and review rows of a chunk's graded pairs (``fresh``: those it does not fan out): from the
        cache where it has them (``cached``), from the teacher otherwise."""
        if self.cache is not None:
            return self.cache.label(self.labeler, fresh, cached)
        labels, review = self.labeler.label(fresh) if fresh else ([], [])
        return CachedLabels(labels, review, None, 0, len(fresh))

    def _finish_shard(
        self,
        shard: int,
        work: Path,
        chunks: DedupedChunks,
        fan_out: FanOut,
        fingerprint: dict[str, Any],
        lease: Lease,
    ) -> None:
        """The committed chunks' new cache entries go to the label cache, then the chunks become the shard's files
        and its manifest (commits.publish_shard): labels and duplicates must add up to the rows in; the review
        queue is a subset of the labels."""
        sources = {
            "labels": (read_tables(sorted(work.glob("chunk-*.labels.parquet"))), LABELS_SCHEMA),
            "review": (read_tables(sorted(work.glob("chunk-*.review.parquet"))), REVIEW_SCHEMA),
            "quarantine": ([pa.Table.from_pylist(chunks.duplicates, schema=QUARANTINE_SCHEMA)], QUARANTINE_SCHEMA),
        }
        counts = chunk_counts(work)
        record = {
            "rows_in": chunks.rows_in,
            "distinct_pairs": fan_out.distinct_pairs,
            "duplicate_rows": fan_out.duplicate_rows,
            "cache_hits": counts.get("cache_hits", 0),  # each committed chunk counted once
            "cache_misses": counts.get("cache_misses", 0),
            "teacher_run_id": self.run_id,
            "prompt_version": self.labeler.prompt.version,
            "fingerprint": fingerprint,
        }
        if self.cache is not None:  # the new entries of the committed chunks, before the shard's commit point
            self.cache.publish(read_tables(sorted(work.glob("chunk-*.cache.parquet"))), work)
        publish_shard(self.out, shard, sources, record, ("labels", "quarantine"), lease)


def partition_input(config: AnnotateConfig, attempt: int = 1) -> dict[str, Any]:
    """Step 1: the input validated and split by its normalised text, so repeats meet in one shard."""
    return partition(config.input, config.out_dir, config.num_shards, config.lease_seconds, attempt, by="text")


def run(config: AnnotateConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    started = time.perf_counter()
    manifest = partition_input(config)
    shards = list(config.shards) if config.shards is not None else list(range(config.num_shards))
    total = sum(manifest["shard_rows"][k] for k in shards)
    labeler = ShardLabeler(config)
    with progress_bar(total=total, desc="annotate", unit="pair", mininterval=1.0) as bar:
        for shard in shards:
            labeler.label_shard(shard, bar)
    seconds = time.perf_counter() - started
    stats = labeler.labeler.stats
    throughput = {
        "pairs": labeler.rows_labelled,  # labelled by this run, fan-outs included (a resumed run skips finished work)
        "graded_pairs": stats.pairs,  # of them graded by the teacher
        "seconds": round(seconds, 2),
        "generation_seconds": round(stats.generation_seconds, 2),
        "generated_tokens": stats.generated_tokens,
        "scoring_seconds": round(stats.scoring_seconds, 2),
        "threads": labeler.threads.threads,
    }
    pending = [k for k in range(config.num_shards) if shard_done(out, k) is None]
    if pending:
        print_summary(
            f"annotate: shards {shards} done; waiting for shards {pending} before the merge",
            {"shards": out / "shards"},
            labeler.threads,
        )
        return {"shards": out / "shards"}
    return merge(config, throughput)
