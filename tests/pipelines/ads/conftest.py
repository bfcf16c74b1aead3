"""Fixtures of the annotation tests."""

import json
from contextlib import contextmanager

import pytest

from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.teacher.labeling import PairLabeler


@pytest.fixture(scope="session")
def labeling_dies_on_call():
    """``with labeling_dies_on_call(n) as calls:`` the teacher's labeling (``PairLabeler.label``) raises
    KeyboardInterrupt on its n-th call, a kill after the chunks before it committed; ``calls`` gets each call's
    pair count."""

    @contextmanager
    def dies_on_call(n: int):
        calls, label = [], PairLabeler.label

        def dying(self, pairs):
            calls.append(len(pairs))
            if len(calls) == n:
                raise KeyboardInterrupt
            return label(self, pairs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(PairLabeler, "label", dying)
            yield calls

    return dies_on_call


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
