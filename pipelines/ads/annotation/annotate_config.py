"""The config of ``agpo annotate`` (``AnnotateConfig``: input, teacher, engine, shards, voting, lease), which
pipelines.ads.annotation.annotate runs. It imports no torch, so ``--print-config`` and config errors never load the
stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agpo.checks import require_int
from agpo.engine_options import check_engine_options
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.teacher.voting_config import SCORE_NEEDS_HF, VotingConfig
from pipelines.devices import check_device_keys, device_field, precision_field
from pipelines.rl.engine_fields import engine_field, engine_options_field
from pipelines.runs import run_path_field
from pipelines.threads import check_threads, threads_field

# bounds of the sharding settings: a lease beyond a day is a worker never taken over (inf stopped the heartbeat
# with OverflowError while waiters on other hosts waited for ever); shards are folders and leases each
MAX_LEASE_SECONDS, MAX_SHARDS, MAX_CHUNK_PAIRS = 86_400.0, 10_000, 1_000_000


def check_sharding(config: object) -> None:
    """``num_shards``, ``chunk_pairs`` and ``lease_seconds`` of a sharded stage (annotate, score) are in bounds."""
    require_int("num_shards", config.num_shards, 1)
    require_int("chunk_pairs", config.chunk_pairs, 1)
    if config.num_shards > MAX_SHARDS or config.chunk_pairs > MAX_CHUNK_PAIRS:
        raise ValueError(
            f"num_shards must be at most {MAX_SHARDS:,} and chunk_pairs at most {MAX_CHUNK_PAIRS:,}, got "
            f"{config.num_shards} and {config.chunk_pairs}"
        )
    seconds = config.lease_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= MAX_LEASE_SECONDS:
        raise ValueError(f"lease_seconds must be a number in (0, {MAX_LEASE_SECONDS:g}], got {seconds!r}")


def publish_field() -> Any:
    """The ``publish`` key of a sharded stage (annotate, score): where its finished outputs go, exactly once."""
    return field(
        default=None,
        metadata={
            "help": "where the finished run's outputs are published exactly once, a folder or a URI (s3://bucket/"
            "prefix/): its Parquet part files as a dataset, then _manifest.json with the row counts; null: the run "
            "folder only"
        },
    )


@dataclass(frozen=True)
class AnnotateConfig:
    """Input, teacher and output of an annotation run."""

    input: InputConfig = field(
        default_factory=lambda: InputConfig(split="unlabeled"), metadata={"help": "pairs to label"}
    )
    teacher: str = run_path_field("teacher/rl/model", "teacher model directory")
    teacher_run_id: str | None = field(
        default=None, metadata={"help": "id written with every label; null: a hash of the teacher's weights"}
    )
    out_dir: str = run_path_field("annotate", "run folder (partition, shards, labels, ...)")
    publish: str | None = publish_field()
    prompt_version: str | None = field(
        default=None, metadata={"help": "prompt template version; null: the teacher's own (teacher_prompt.json)"}
    )
    engine: str = engine_field()
    engine_options: dict[str, object] = engine_options_field()
    num_shards: int = field(
        default=4, metadata={"help": "shards the input is split into (stable hash of the query and ad text)"}
    )
    shards: tuple[int, ...] | None = field(
        default=None, metadata={"help": "label only these shards (a worker's share); null: all"}
    )
    chunk_pairs: int = field(default=512, metadata={"help": "pairs committed at a time (the resume granularity)"})
    dedup: bool = field(
        default=True,
        metadata={
            "help": "grade each normalised (query, ad text) once (NFKC, case-folded, whitespace collapsed) and "
            "fan its label out to the repeats; false: grade every row"
        },
    )
    cache: bool = field(
        default=True,
        metadata={
            "help": "label only the pairs the label cache (cache_dir) lacks and read the rest from it: the same "
            "labels, keyed by the teacher's digest, the prompt and decoding settings and the pair's text "
            "(pipelines/ads/annotation/label_cache.py); false: label every pair, read and write no cache"
        },
    )
    cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "the label cache's folder, beside the run folders (a local folder; object-store URIs go through "
            "the same seam but are untested); null: no cache (a stage run on its own labels every pair); agpo "
            "pipeline sets <out_dir>/label_cache"
        },
    )
    gold: str | None = run_path_field(
        "data/unlabeled_gold.parquet",
        "pair_id -> gold_grade Parquet for agreement metrics (gold in the input counts too)",
    )
    voting: VotingConfig = field(
        default_factory=VotingConfig, metadata={"help": "how the teacher's answers become labels (mode, votes)"}
    )
    lease_seconds: float = field(
        default=600.0,
        metadata={
            "help": "a worker's claim on a shard, renewed every eighth of it; a claim seen unchanged this long "
            "(a dead or hung worker on another host) is taken over; a killed worker's on this host at once; "
            "on NFS at least 150 s (pipelines/lease.py)"
        },
    )

    threads: int | None = threads_field()
    device: str = device_field()
    precision: str = precision_field()

    def __post_init__(self) -> None:
        check_threads(self.threads)
        check_device_keys(self)
        check_sharding(self)
        check_engine_options(self.engine, self.engine_options)
        if self.voting.mode == "score" and self.engine != "hf":
            raise ValueError(f"voting.{SCORE_NEEDS_HF}, or voting.mode: sample to keep engine: {self.engine}")
        bad = [s for s in self.shards or () if not 0 <= s < self.num_shards]
        if bad:
            raise ValueError(f"shards {bad} are outside 0..{self.num_shards - 1}")
