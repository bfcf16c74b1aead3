"""Fixtures of the annotation tests."""

import json

import pytest

from pipelines.ads.intake.contracts import read_pairs


@pytest.fixture(scope="session")
def input_file(small_teacher):
    """The unlabeled pairs as JSONL, plus bad rows and duplicate pair_ids."""
    work, pairs, _ = small_teacher
    rows = read_pairs(pairs, split="unlabeled").to_pylist()
    lines = [json.dumps({k: v for k, v in r.items() if v is not None}) for r in rows]
    lines += [
        json.dumps({"pair_id": "bad-1", "query": "", "ad_title": "lamp"}),
        json.dumps({"pair_id": "bad-2", "query": "sofa"}),
        "{broken",
        json.dumps({"pair_id": "bad-3", "query": "sofa", "ad_title": "lamp", "gold_grade": 9}),
    ]
    lines += [json.dumps({**rows[i], "ad_title": "a later copy"}) for i in (0, 5, 9)]  # duplicate ids
    path = work / "to_label.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, len(rows), len(lines)
