"""Fixtures of the annotation tests."""

import json
import os
import signal
import subprocess
import time
from contextlib import contextmanager

import pytest

from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.teacher.labeling import PairLabeler


@pytest.fixture(scope="session")
def sigkilled_after_two_chunks():
    """``sigkilled_after_two_chunks(command, out)``: the annotate ``command`` (writing ``out``) started and SIGKILLed
    once its second chunk is committed; returns the environment it ran in, for the rerun."""

    def run_and_kill(command: list[str], out) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not list(out.glob("work/*/chunk-000001.done")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return env

    return run_and_kill


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
