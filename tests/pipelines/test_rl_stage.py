"""`agpo train` killed with SIGKILL and rerun: the resumed run writes the same metrics, step for step, as a
run that was never interrupted, and every step exactly once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TIMING = ("time_rollout", "time_reward", "time_update", "time_step", "tokens_per_s")
MAX_STEPS = 8


def train_command(pairs, model, out):
    sets = {
        "pairs": pairs, "base_model": model, "out_dir": out, "audit_examples": 16, "audit_samples": 2,
        "trainer.max_steps": MAX_STEPS, "trainer.group_size": 4, "trainer.prompts_per_step": 4,
        "trainer.max_new_tokens": 16, "trainer.eval_every": 4, "trainer.checkpoint_every": 2,
        "trainer.keep_checkpoints": 2, "trainer.lr_schedule": "cosine", "trainer.learning_rate": 1e-3,
    }  # fmt: skip
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "pipelines.cli", "train", *args]


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def steps_written(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


@pytest.mark.integration
def test_sigkill_then_rerun_gives_the_uninterrupted_metrics(small_teacher):
    work, pairs, model = small_teacher
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    whole, killed = work / "whole", work / "killed"
    subprocess.run(train_command(pairs, model, whole), env=env, check=True, capture_output=True, timeout=600)

    proc = subprocess.Popen(train_command(pairs, model, killed), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 300
    while steps_written(killed) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 5 <= steps_written(killed) < MAX_STEPS

    rerun = subprocess.run(train_command(pairs, model, killed), env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] in (4, 6) and summary["steps"] == MAX_STEPS
    assert [row["step"] for row in metrics(killed)] == list(range(MAX_STEPS + 1))  # each step exactly once
    assert metrics(killed) == metrics(whole)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-00000006", "step-00000008"]

    # a corrupted newest checkpoint is refused with a clear message and exit code 2
    newest = killed / "checkpoints" / "step-00000008" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:-10])
    refused = subprocess.run(train_command(pairs, model, killed), env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2
    assert "model.safetensors is truncated or overwritten" in refused.stderr and "delete" in refused.stderr
