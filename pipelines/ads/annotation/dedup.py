"""Exact deduplication: pairs whose normalised (query, ad text) repeat are graded once, the label fanned out.

**Key** (``pair_key``): each field the prompt renders (``ingest.TEXT_FIELDS``: query and ad_title, the only
fields of ``RelevancePrompt.render``; the instruction, chat wrapping and answer format are fixed per run) as
the prompt places it (``prompts.escape_field``: NFKC, control characters to spaces, angle brackets to
‹ ›, stripped, cut to ``MAX_FIELD_CHARS``), then case-folded with every whitespace run collapsed to one
space; the fields joined by NUL (which ``escape_field`` has turned into a space, so the join is
unambiguous) and hashed with blake2b to 16 bytes (a collision is ~2^-64 at 10^10 keys). Two prompts that
differ only in case or spacing therefore share one grade: the teacher's answer to the first of them.

**Sharding**: ``agpo annotate`` partitions by ``shard_text`` (the same normalised text), so every copy of a
key lands in the shard of its first row, whatever ``num_shards``; labels do not depend on the sharding.

**Fan-out** (``FanOut``, one per shard, fed its chunks in input order): the first row of a key in the
shard is *graded* by the teacher; each later row (a *copy*) gets that label (grade, votes, grade_probs,
confidence, parse failures, run id, prompt version) under its own pair_id. The review queue holds the
graded row only: one task per distinct pair, never the same text twice for a human. A resumed run reads the
committed chunks' labels back (``learn``), so copies in later chunks get the same label as in an
uninterrupted run. Memory: one label per distinct key of the shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.ads.intake.ingest import TEXT_FIELDS
from pipelines.ads.teacher.prompts import escape_field

DEDUP_KEY = "prompt-text-nfkc-casefold-v1"  # the key's definition, in the annotation fingerprint
LABEL_FIELDS = (
    "grade",
    "votes",
    "grade_probs",
    "confidence",
    "parse_failures",
    "teacher_run_id",
    "prompt_version",
)


def shard_text(pair: dict[str, Any]) -> str:
    """The normalised text of every field the prompt renders, NUL-joined (module docstring)."""
    return "\x00".join(" ".join(escape_field(pair[name]).casefold().split()) for name in TEXT_FIELDS)


def pair_key(pair: dict[str, Any]) -> bytes:
    return hashlib.blake2b(shard_text(pair).encode("utf-8"), digest_size=16).digest()


@dataclass(frozen=True)
class ChunkPlan:
    """One chunk's rows split into the graded (``fresh``: indices of the first row of a key in the shard)
    and the copies; ``keys``: each row's key (empty without dedup)."""

    keys: list[bytes]
    fresh: list[int]


class FanOut:
    """A shard's keys -> the label of each key's first row; counts graded pairs and fanned-out copies."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.labels: dict[bytes, tuple[Any, ...] | None] = {}
        self.distinct_pairs = 0
        self.duplicate_rows = 0

    def plan(self, chunk: Sequence[dict[str, Any]]) -> ChunkPlan:
        """Which rows of the next chunk (in input order) are graded; without dedup, all of them."""
        if not self.enabled:
            self.distinct_pairs += len(chunk)
            return ChunkPlan([], list(range(len(chunk))))
        keys = [pair_key(row) for row in chunk]
        fresh = []
        for i, key in enumerate(keys):
            if key not in self.labels:
                self.labels[key] = None  # graded in this chunk
                fresh.append(i)
        self.distinct_pairs += len(fresh)
        self.duplicate_rows += len(chunk) - len(fresh)
        return ChunkPlan(keys, fresh)

    def fill(self, plan: ChunkPlan, chunk: Sequence[dict[str, Any]], graded: list[dict[str, Any]]) -> list[dict]:
        """The chunk's label rows in chunk order: ``graded`` (the labels of ``plan.fresh``, in that order),
        remembered, and every copy's key label under the copy's own pair_id."""
        if not self.enabled:
            return graded
        own = dict(zip(plan.fresh, graded, strict=True))
        self._remember(plan, own)
        return [
            own.get(i) or {"pair_id": row["pair_id"], **dict(zip(LABEL_FIELDS, self.labels[plan.keys[i]], strict=True))}
            for i, row in enumerate(chunk)
        ]

    def learn(self, plan: ChunkPlan, committed: list[dict[str, Any]]) -> None:
        """Remember the labels of a chunk committed earlier (``committed``: its label rows, in chunk order)."""
        if self.enabled:
            self._remember(plan, {i: committed[i] for i in plan.fresh})

    def _remember(self, plan: ChunkPlan, labels: dict[int, dict[str, Any]]) -> None:
        for i, label in labels.items():
            self.labels[plan.keys[i]] = tuple(label[name] for name in LABEL_FIELDS)
