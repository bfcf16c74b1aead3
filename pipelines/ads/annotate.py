"""Stage ``agpo annotate``: the trained teacher labels query-ad pairs in shards, losing none.

1. ``partition`` (pipelines.ads.annotation.shards): validate the input (CSV / JSONL / Parquet, column mapping) and split
   it by a stable hash of pair_id into ``num_shards`` shard inputs; bad rows go to quarantine.
2. ``label_shard`` for each shard (or only ``shards``, so independent workers or Airflow's mapped tasks
   can share the work): drop duplicate pair_ids to quarantine, then label the pairs in chunks of
   ``chunk_pairs`` (pipelines.ads.annotation.labeling: ``voting.mode`` sample (votes, majority grade,
   retries) or score (the teacher's exact grade distribution), confidence, review queue).
   Each finished chunk is committed atomically (files, then a ``.done`` marker); a run killed mid-shard
   resumes at its first uncommitted chunk. A finished shard is merged into ``labels/``, ``review/`` and
   ``quarantine/`` files plus ``shards/<k>.json`` (row counts, checksums), renamed into place last.
3. ``merge`` once every shard is done: checks that input rows = labels + quarantine (+ rows of other
   splits skipped on purpose), writes ``summary.json`` and the quality report (JSON + PNG).

Every write is temp file -> fsync -> rename; a rerun skips whatever is already done, so Airflow retries
are safe. Sampled labels are seeded per pair, so a rerun, a resume or a different sharding gives identical
labels; scored labels are greedy and exact, identical on a rerun or resume (see labeling for resharding).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from agpo.checks import require_int
from agpo.models import load_model
from agpo.rollout.factory import build_engine
from durable.fileio import sha256_file
from pipelines.ads.annotation.labeling import (
    LABELS_SCHEMA,
    REVIEW_SCHEMA,
    SCORE_NEEDS_HF,
    PairLabeler,
    VotingConfig,
)
from pipelines.ads.annotation.report import quality_report
from pipelines.ads.annotation.shards import DedupedChunks, partition, read_manifest, shard_input, shard_name
from pipelines.ads.contracts import ContractError, write_table, write_tables
from pipelines.ads.ingest import QUARANTINE_SCHEMA, InputConfig
from pipelines.ads.prompts import teacher_prompt
from pipelines.io import print_summary, write_json_atomic
from pipelines.rollout_fields import engine_field, engine_options_field

OUTPUTS = ("labels", "review", "quarantine")
SCHEMAS = {"labels": LABELS_SCHEMA, "review": REVIEW_SCHEMA, "quarantine": QUARANTINE_SCHEMA}


@dataclass(frozen=True)
class AnnotateConfig:
    """Input, teacher and output of an annotation run."""

    input: InputConfig = field(
        default_factory=lambda: InputConfig(split="unlabeled"), metadata={"help": "pairs to label"}
    )
    teacher: str = field(default="work/teacher/rl/model", metadata={"help": "teacher model directory"})
    teacher_run_id: str | None = field(
        default=None, metadata={"help": "id written with every label; null: a hash of the teacher's weights"}
    )
    out_dir: str = field(default="work/annotate", metadata={"help": "run folder (partition, shards, labels, ...)"})
    prompt_version: str | None = field(
        default=None, metadata={"help": "prompt template version; null: the teacher's own (teacher_prompt.json)"}
    )
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    num_shards: int = field(default=4, metadata={"help": "shards the input is split into (stable hash of pair_id)"})
    shards: tuple[int, ...] | None = field(
        default=None, metadata={"help": "label only these shards (a worker's share); null: all"}
    )
    chunk_pairs: int = field(default=512, metadata={"help": "pairs committed at a time (the resume granularity)"})
    gold: str | None = field(
        default="work/data/unlabeled_gold.parquet",
        metadata={"help": "pair_id -> gold_grade Parquet for agreement metrics (gold in the input counts too)"},
    )
    voting: VotingConfig = field(
        default_factory=VotingConfig, metadata={"help": "how the teacher's answers become labels (mode, votes)"}
    )

    def __post_init__(self) -> None:
        require_int("num_shards", self.num_shards, 1)
        require_int("chunk_pairs", self.chunk_pairs, 1)
        if self.voting.mode == "score" and self.engine != "hf":
            raise ValueError(f"voting.{SCORE_NEEDS_HF}, or voting.mode: sample to keep engine: {self.engine}")
        bad = [s for s in self.shards or () if not 0 <= s < self.num_shards]
        if bad:
            raise ValueError(f"shards {bad} are outside 0..{self.num_shards - 1}")


def teacher_fingerprint(model_dir: Path) -> str:
    """A short, stable id of the teacher's weights."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} holds no .safetensors weights; train or point to a teacher")
    digest = hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest()
    return f"teacher-{digest[:12]}"


def shard_done(out: Path, shard: int) -> dict[str, Any] | None:
    path = out / "shards" / f"{shard_name(shard)}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


class ShardLabeler:
    """Labels shards of one partitioned run with one loaded teacher."""

    def __init__(self, config: AnnotateConfig) -> None:
        self.config, self.out = config, Path(config.out_dir)
        model_dir = Path(config.teacher)
        model, self.tokenizer = load_model(model_dir)
        engine = build_engine(config.engine, model, self.tokenizer, model_dir, **config.engine_options)
        self.run_id = config.teacher_run_id or teacher_fingerprint(model_dir)
        prompt = teacher_prompt(model_dir, self.tokenizer, config.prompt_version)
        self.labeler = PairLabeler(engine, self.tokenizer, prompt, config.voting, self.run_id)

    def label_shard(self, shard: int, progress: tqdm | None = None) -> dict[str, Any]:
        """Label one shard (resuming at its first uncommitted chunk); returns its manifest."""
        done = shard_done(self.out, shard)
        if done is not None:
            if progress is not None:
                progress.update(done["pairs"])
            return done
        chunks = DedupedChunks(shard_input(self.out, shard), self.config.chunk_pairs)
        work = self.out / "work" / shard_name(shard)
        work.mkdir(parents=True, exist_ok=True)
        for index, chunk in chunks:
            marker = work / f"chunk-{index:06d}.done"
            if not marker.exists():
                labels, review = self.labeler.label(chunk)
                write_table(
                    pa.Table.from_pylist(labels, schema=LABELS_SCHEMA), work / f"chunk-{index:06d}.labels.parquet"
                )
                write_table(
                    pa.Table.from_pylist(review, schema=REVIEW_SCHEMA), work / f"chunk-{index:06d}.review.parquet"
                )
                write_json_atomic(marker, {"pairs": len(chunk)})
            if progress is not None:
                progress.update(len(chunk))
        return self._finish_shard(shard, work, chunks)

    def _finish_shard(self, shard: int, work: Path, chunks: DedupedChunks) -> dict[str, Any]:
        """Stream the committed chunks into the shard's files, check its row count, then commit it."""
        sources = {
            "labels": (sorted(work.glob("chunk-*.labels.parquet")), LABELS_SCHEMA),
            "review": (sorted(work.glob("chunk-*.review.parquet")), REVIEW_SCHEMA),
        }
        manifest: dict[str, Any] = {"shard": shard, "rows_in": chunks.rows_in}
        for name, (paths, schema) in sources.items():
            target = self.out / name / f"shard-{shard_name(shard)}.parquet"
            rows = write_tables((pq.read_table(p) for p in paths), schema, target)
            manifest[name] = {"rows": rows, "sha256": sha256_file(target)}
        target = write_table(
            pa.Table.from_pylist(chunks.duplicates, schema=QUARANTINE_SCHEMA),
            self.out / "quarantine" / f"shard-{shard_name(shard)}.parquet",
        )
        manifest["quarantine"] = {"rows": len(chunks.duplicates), "sha256": sha256_file(target)}
        manifest["pairs"] = manifest["labels"]["rows"]
        if manifest["pairs"] + len(chunks.duplicates) != chunks.rows_in:
            raise RuntimeError(
                f"shard {shard}: {chunks.rows_in} rows in, {manifest['pairs']} labels + "
                f"{len(chunks.duplicates)} duplicates out; delete {work} and rerun"
            )
        manifest["teacher_run_id"] = self.run_id
        manifest["prompt_version"] = self.labeler.prompt.version
        write_json_atomic(self.out / "shards" / f"{shard_name(shard)}.json", manifest)  # the shard's commit point
        for path in work.iterdir():
            path.unlink()
        work.rmdir()
        return manifest


def run(config: AnnotateConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    started = time.perf_counter()
    manifest = partition(config.input, out, config.num_shards)
    shards = list(config.shards) if config.shards is not None else list(range(config.num_shards))
    total = sum(manifest["shard_rows"][k] for k in shards)
    labeler = ShardLabeler(config)
    with tqdm(total=total, desc="annotate", unit="pair", mininterval=1.0) as bar:
        for shard in shards:
            labeler.label_shard(shard, bar)
    seconds = time.perf_counter() - started
    stats = labeler.labeler.stats
    throughput = {
        "pairs": stats.pairs,  # labeled by this run (a resumed run skips finished work)
        "seconds": round(seconds, 2),
        "generation_seconds": round(stats.generation_seconds, 2),
        "generated_tokens": stats.generated_tokens,
        "scoring_seconds": round(stats.scoring_seconds, 2),
    }
    pending = [k for k in range(config.num_shards) if shard_done(out, k) is None]
    if pending:
        print_summary(
            f"annotate: shards {shards} done; waiting for shards {pending} before the merge", {"shards": out / "shards"}
        )
        return {"shards": out / "shards"}
    return merge(config, throughput)


def merge(config: AnnotateConfig, throughput: dict[str, Any] | None = None) -> dict[str, Path]:
    """Check the row accounting over all shards and write summary.json and the quality report."""
    out = Path(config.out_dir)
    partition_manifest = read_manifest(out / "partition")
    shards = [shard_done(out, k) for k in range(config.num_shards)]
    if partition_manifest is None or any(s is None for s in shards):
        raise ContractError(f"{out} is not fully annotated yet; run `agpo annotate` on the missing shards first")
    for shard in shards:
        for name in OUTPUTS:
            path = out / name / f"shard-{shard_name(shard['shard'])}.parquet"
            if sha256_file(path) != shard[name]["sha256"]:
                raise ContractError(
                    f"{path} does not match its shard manifest (changed after the run); rerun the shard"
                )
    counts = {
        "rows_in": partition_manifest["rows_in"],
        "labels": sum(s["labels"]["rows"] for s in shards),
        "quarantined": partition_manifest["quarantined"] + sum(s["quarantine"]["rows"] for s in shards),
        "skipped_other_splits": partition_manifest["skipped"],
        "review_queue": sum(s["review"]["rows"] for s in shards),
    }
    accounted = counts["labels"] + counts["quarantined"] + counts["skipped_other_splits"]
    if accounted != counts["rows_in"]:
        raise ContractError(f"row accounting failed: {counts}; labels + quarantine + skipped must equal rows_in")
    # the input's bad rows join the shards' duplicates, so quarantine/ holds every quarantined row
    write_table(pq.read_table(out / "partition" / "quarantine.parquet"), out / "quarantine" / "input.parquet")
    paths = quality_report(config, counts, throughput or {}, out)
    summary = {
        **counts,
        "mode": config.voting.mode,
        "teacher_run_ids": sorted({s["teacher_run_id"] for s in shards}),
        "prompt_version": ", ".join(sorted({s["prompt_version"] for s in shards})),
        "throughput": throughput or {},
    }
    paths = {
        "labels": out / "labels",
        "review_queue": out / "review",
        "quarantine": out / "quarantine",
        **paths,
        "summary": write_json_atomic(out / "summary.json", summary),
    }
    report = json.loads(paths["report"].read_text())
    agreement = report.get("gold_agreement") or {}
    print_summary(
        f"annotate: {counts['rows_in']:,} rows in -> {counts['labels']:,} labels, {counts['quarantined']:,} "
        f"quarantined, {counts['skipped_other_splits']:,} other splits; {counts['review_queue']:,} to review; "
        + (f"gold accuracy {agreement['accuracy']:.3f} on {agreement['pairs']:,} pairs; " if agreement else "")
        + (f"{report['throughput']['pairs_per_s']:.1f} pairs/s" if report["throughput"].get("pairs") else "merged"),
        paths,
    )
    return paths
