"""The label cache: a pair whose content a teacher already labelled with the same settings is not labelled again.

**Where**: a Parquet dataset beside the run folders (``<runs root>/label_cache/``, ``cache_dir``), read and written
through pipelines.storage's seam (a local folder; an object-store URI takes the same calls, untested so far).
One folder per cache key prefix: ``teacher=<digest>/settings=<hash>/``, where the digest is the teacher folder's
``durable.fileio.files_digest`` (every file: weights, tokenizer, ``teacher_prompt.json``) and the hash is over the
prompt version, engine and its options, every voting setting (votes, temperature, seed, retries, review
threshold, mode) and the id written with each label (``_settings.json`` in the folder shows them). A changed
teacher, prompt or decoding setting therefore reads another folder and misses by construction.

**Entry**: one row per pair the teacher graded, keyed by the pair's content (``content_key``: blake2b-128 over
the fields the prompt reads, ``ingest.TEXT_FIELDS``, as it reads them, ``prompts.escape_field``, NUL-joined),
holding its label row (grade, votes, grade_probs, confidence, parse failures, run id, prompt version), whether
it went to review and the teacher's answers there. A hit gives back that label and review row under the pair's
own pair_id: the rows the teacher gave before, so a run's outputs are the same with or without the cache. (In
sample mode the votes are seeded by pair_id, so the same text under a new pair_id gets the label of its first
pair_id, as dedup fans a label out within a run.) Several entries of one key: the first in path order.

**Lookup** (``lookup``): per shard, the shard input's keys are collected and every part of the prefix folder is
read, keeping the rows whose key the shard holds (memory: one shard's keys and hits).

**Writes**: a chunk's new entries are a file of the chunk, checksummed by its ``.done`` marker
(pipelines.ads.annotation.commits): none exists without its committed chunk. When every chunk of the shard is
committed and before the shard's manifest, ``publish`` streams them into one file named by its content's SHA-256
(``part-<sha>.parquet``, written temp-then-rename by ``storage.upload``): a killed run leaves no part, or a
whole one that a rerun writes again with the same bytes. Hits and misses are counted per chunk in its marker, so
a resumed shard counts each chunk once; a shard's entries enter the cache only once the shard is done, so an
interrupted shard's rerun misses exactly as the uninterrupted run would have.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from durable.fileio import sha256_file
from durable.fingerprint import canonical_json
from pipelines.ads.annotation.dedup import LABEL_FIELDS
from pipelines.ads.intake.contracts import write_tables
from pipelines.ads.intake.ingest import TEXT_FIELDS
from pipelines.ads.teacher.labeling import LABELS_SCHEMA, REVIEW_SCHEMA, PairLabeler
from pipelines.ads.teacher.prompts import escape_field
from pipelines.storage import Location, guarded, locate, upload

SETTINGS = "_settings.json"  # what a prefix folder's entries were labelled with (not data: pipelines.storage)
CACHE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary(16), nullable=False),
        pa.field("pair_id", pa.string(), nullable=False),  # the pair it was labelled under
        *(LABELS_SCHEMA.field(name) for name in LABEL_FIELDS),
        pa.field("review", pa.bool_(), nullable=False),
        pa.field("teacher_answers", pa.list_(pa.string())),  # the review row's; null when not reviewed
    ]
)


def content_key(pair: dict[str, Any]) -> bytes:
    """The pair's content as the prompt reads it (module docstring)."""
    text = "\x00".join(escape_field(pair[name]) for name in TEXT_FIELDS)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def shard_keys(shard_input: Path) -> set[bytes]:
    """The content keys of a shard's input rows, read in batches."""
    keys: set[bytes] = set()
    for batch in pq.ParquetFile(shard_input).iter_batches(columns=list(TEXT_FIELDS)):
        keys.update(content_key(row) for row in batch.to_pylist())
    return keys


@dataclass(frozen=True)
class CachedLabels:
    """A chunk's graded rows, labelled by the teacher (misses) or read from the cache (hits): ``labels`` and
    ``review`` in the order of the pairs, ``entries`` the misses' new cache rows (None: no cache)."""

    labels: list[dict[str, Any]]
    review: list[dict[str, Any]]
    entries: pa.Table | None
    hits: int
    misses: int


class LabelCache:
    """The cache folder of one teacher and its settings (``settings``: the teacher's digest and what it labels
    with; module docstring)."""

    def __init__(self, root: str, settings: dict[str, Any]) -> None:
        self.settings = settings
        digest = hashlib.sha256(canonical_json(settings).encode()).hexdigest()
        teacher = f"teacher={settings['teacher_digest'][:16]}"
        self.location = locate(root).child(teacher).child(f"settings={digest[:16]}")

    def lookup(self, keys: set[bytes]) -> dict[bytes, dict[str, Any]]:
        """The cached entries of ``keys`` (the first of each key in path order)."""
        if not keys or not self.location.exists():
            return {}
        wanted = pa.array(sorted(keys), pa.binary(16))
        found: dict[bytes, dict[str, Any]] = {}
        for part in self.parts():
            table = pq.read_table(part.open_random(), schema=CACHE_SCHEMA)
            for row in table.filter(pc.is_in(table["key"], value_set=wanted)).to_pylist():
                found.setdefault(row["key"], row)
        return found

    def parts(self) -> list[Location]:
        """The folder's published parts in path order (a killed upload's temp file is none of them)."""
        selector = pafs.FileSelector(self.location.path)
        infos = guarded(self.location, lambda: self.location.filesystem.get_file_info(selector))
        names = sorted(
            i.base_name for i in infos if i.base_name.startswith("part-") and i.base_name.endswith(".parquet")
        )
        return [self.location.child(name) for name in names]

    def label(
        self, labeler: PairLabeler, pairs: Sequence[dict[str, Any]], cached: dict[bytes, dict[str, Any]]
    ) -> CachedLabels:
        """Label ``pairs``: the cached ones from ``cached`` (``lookup``'s), the rest by ``labeler``."""
        keys = [content_key(pair) for pair in pairs]
        missed = [i for i, key in enumerate(keys) if key not in cached]
        graded, queued = labeler.label([pairs[i] for i in missed]) if missed else ([], [])
        own = dict(zip(missed, graded, strict=True))
        reviewed = {row["pair_id"]: row for row in queued}
        labels, review = [], []
        for i, pair in enumerate(pairs):
            label, row = (own[i], reviewed.get(pair["pair_id"])) if i in own else hit_rows(pair, cached[keys[i]])
            labels.append(label)
            if row is not None:
                review.append(row)
        entries = [
            {
                "key": keys[i],
                **own[i],
                "review": pairs[i]["pair_id"] in reviewed,
                "teacher_answers": reviewed.get(pairs[i]["pair_id"], {}).get("teacher_answers"),
            }
            for i in missed
        ]
        table = pa.Table.from_pylist(entries, schema=CACHE_SCHEMA)
        return CachedLabels(labels, review, table, len(pairs) - len(missed), len(missed))

    def publish(self, tables: Iterable[pa.Table], work: Path) -> None:
        """A finished shard's new entries (its chunks' tables, staged in its ``work`` folder) as one
        content-addressed part, then ``_settings.json`` beside it; nothing when the shard graded no pair."""
        staged, settings = work / "cache.parquet", work / SETTINGS
        if not write_tables(tables, CACHE_SCHEMA, staged):
            return
        upload(staged, self.location.child(f"part-{sha256_file(staged)[:32]}.parquet"))
        settings.write_text(json.dumps(self.settings, indent=2, sort_keys=True) + "\n")
        upload(settings, self.location.child(SETTINGS))


def hit_rows(pair: dict[str, Any], entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The label row and, when it was reviewed, the review row of a cache hit, under the pair's own pair_id."""
    label = {"pair_id": pair["pair_id"], **{name: entry[name] for name in LABEL_FIELDS}}
    if not entry["review"]:
        return label, None
    review = {name: label[name] for name in REVIEW_SCHEMA.names if name in label}
    review.update(
        query=pair["query"],
        ad_title=pair["ad_title"],
        abstained=entry["grade"] is None,
        teacher_answers=entry["teacher_answers"],
    )
    return label, {name: review[name] for name in REVIEW_SCHEMA.names}
