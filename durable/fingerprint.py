"""What differs between two recorded settings: a checkpoint's run fingerprint, an annotation shard's work,
a pipeline step's params. Every refusal to resume or reuse names the keys this finds, old value -> new."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_ABSENT = object()


def canonical_json(value: Any) -> str:
    """One text per value: sorted keys, no spaces (what hashes of settings are taken over)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)


def differing_keys(old: Any, new: Any, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(dotted key, old, new)`` for every value that differs between two settings trees, in key order;
    values as canonical JSON (cut at 60 characters), ``(absent)`` for a key on one side only."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return [
            change
            for key in sorted(set(old) | set(new))
            for change in differing_keys(old.get(key, _ABSENT), new.get(key, _ABSENT), f"{prefix}{key}.")
        ]
    if old == new:
        return []
    return [(prefix.rstrip(".") or "value", _shown(old), _shown(new))]


def describe_differences(old: Any, new: Any, limit: int = 3) -> str:
    """``key: old -> new; ...`` for the first ``limit`` differing keys ('' when none differ)."""
    changes = differing_keys(json.loads(canonical_json(old)), json.loads(canonical_json(new)))
    shown = "; ".join(f"{key}: {before} -> {after}" for key, before, after in changes[:limit])
    return shown + (f"; and {len(changes) - limit} more" if len(changes) > limit else "")


def _shown(value: Any, limit: int = 60) -> str:
    text = "(absent)" if value is _ABSENT else canonical_json(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
