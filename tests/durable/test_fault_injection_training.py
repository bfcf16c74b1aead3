"""Training's checkpoints under real SIGKILLs (issue 19, item 6): a process killed inside
``save_checkpoint`` at each of its steps, or at random moments of a save loop, never leaves a partial
checkpoint that lists as finished, and the next ``latest_checkpoint`` returns the previous complete one (the
new one once it was renamed into place) and removes every temp folder; a distillation killed after an epoch,
within one, and inside a checkpoint save ends, rerun after each kill, with the bytes of an uninterrupted run.

The killed processes run tests/durable/fault_worker.py, which stops at the named point, writes a marker and
sleeps until the test kills it: the kill lands exactly there, inside the save, not after it.
"""

import importlib.util
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable.checkpoint import (
    MANIFEST_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    RNG_FILE,
    STATE_FILE,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fault_worker.py")
_spec = importlib.util.spec_from_file_location("fault_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)
# one thread everywhere: the killed and the uninterrupted runs compute alike, and the shared cores stay free
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
ALL_FILES = {MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, MANIFEST_FILE}


def launch(spec: dict, marker: Path) -> subprocess.Popen:
    """Start the worker on ``spec`` and wait until it writes ``marker`` (it paused, or its loop began)."""
    command = [sys.executable, str(WORKER), json.dumps({**spec, "marker": str(marker)}, default=str)]
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not marker.exists():
        proc.kill()
        pytest.fail(f"the worker never reached its marker ({spec.get('pause')}): {proc.communicate()[1][-2000:]}")
    marker.unlink()
    return proc


def sigkill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL


def temp_folders(root: Path) -> list[str]:
    """The temp folders under ``root``, named without the pid of the process that made them."""
    return sorted(re.sub(r"\d+$", "", p.name) for p in root.glob(".tmp-*"))


def finished(root: Path) -> dict[int, float]:
    """Each checkpoint listed as finished, read-only (no cleanup): it must verify and load, and hold one
    save's weights, optimizer state and trainer state; step -> the value that save wrote."""
    found = {}
    for step, path in list_checkpoints(root):
        model = worker.model_of(0.0)
        checkpoint, optimizer = load_checkpoint(path, model=model, fingerprint=worker.FINGERPRINT)
        value = checkpoint.trainer_state["value"]
        assert checkpoint.step == step and checkpoint.trainer_state["step"] == step
        assert bool((model.weight == value).all()) and bool((optimizer["exp_avg"] == value).all()), path
        found[step] = value
    return found


# point in save_checkpoint -> (the killed save: step, value, keep_last; what lists as finished right after the
# kill; the newest checkpoint then, as (step, value); the temp folders the kill left, by prefix)
KILL_POINTS = {
    "model-written": ((2, 2.0, 2), {1: 1.0}, (1, 1.0), [".tmp-step-00000002-"]),
    "optimizer-written": ((2, 2.0, 2), {1: 1.0}, (1, 1.0), [".tmp-step-00000002-"]),
    "files-written": ((2, 2.0, 2), {1: 1.0}, (1, 1.0), [".tmp-step-00000002-"]),
    "before-rename": ((2, 2.0, 2), {1: 1.0}, (1, 1.0), [".tmp-step-00000002-"]),
    "renamed": ((2, 2.0, 1), {1: 1.0, 2: 2.0}, (2, 2.0), []),  # step 1 not yet pruned
    "pruning": ((2, 2.0, 1), {2: 2.0}, (2, 2.0), [".tmp-pruned-step-00000001-"]),
    # step 1 saved again: its old copy moved aside, the new one still in its temp folder
    "between-renames": ((1, 5.0, 2), {}, (1, 1.0), [".tmp-stale-step-00000001-", ".tmp-step-00000001-"]),
    "stale-delete": ((1, 5.0, 2), {1: 5.0}, (1, 5.0), [".tmp-stale-step-00000001-"]),
}
WRITTEN = {  # the files in the half-written temp folder at the points before its rename
    "model-written": {MODEL_FILE},
    "optimizer-written": {MODEL_FILE, OPTIMIZER_FILE},
    "files-written": ALL_FILES,
    "before-rename": ALL_FILES,
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_kill_inside_a_save_leaves_the_previous_checkpoint_or_the_new_one(tmp_path, point):
    (step, value, keep_last), listed, newest, left = KILL_POINTS[point]
    root = tmp_path / "checkpoints"
    worker.save(root, 1, 1.0, keep_last=2)
    spec = {"job": "save", "root": root, "step": step, "value": value, "keep_last": keep_last, "pause": point}
    sigkill(launch(spec, tmp_path / "paused"))

    assert finished(root) == listed  # nothing partial lists as finished
    assert temp_folders(root) == left
    if point in WRITTEN:
        (half,) = root.glob(".tmp-step-*")
        assert {p.name for p in half.iterdir()} == WRITTEN[point]
    step = int(latest_checkpoint(root).name.removeprefix("step-"))
    assert (step, finished(root)[step]) == newest
    assert temp_folders(root) == []
    worker.save(root, 3, 3.0, keep_last=2)  # and saving goes on
    assert list(finished(root))[-1] == 3 and temp_folders(root) == []


def test_a_save_loop_killed_at_random_moments_never_lists_a_partial_checkpoint(tmp_path):
    """Six kills at seeded random moments of a process that does nothing but save 12 MiB checkpoints (about
    0.07 s each), each followed by a rerun that resumes from the newest one: wherever the kill lands (writing,
    hashing, fsyncing, renaming, pruning), the finished checkpoints all load, none is lost, temp folders go."""
    rng = random.Random(19)
    root, newest, seen = tmp_path / "checkpoints", 0, []
    for kill in range(6):
        proc = launch({"job": "save-loop", "root": root}, tmp_path / f"started-{kill}")
        time.sleep(rng.uniform(0.05, 0.5))
        sigkill(proc)
        seen += temp_folders(root)
        listed = finished(root)  # each loads and holds its own step's weights: value == step
        assert all(value == step for step, value in listed.items()) and len(listed) <= 3
        found = latest_checkpoint(root)
        assert found is not None and int(found.name.removeprefix("step-")) >= newest  # no finished save lost
        newest = int(found.name.removeprefix("step-"))
        assert temp_folders(root) == []
    assert newest >= 6, newest
    print(f"newest step {newest}; temp folders the kills left: {seen}")


def test_distillation_killed_at_several_epochs_ends_as_an_uninterrupted_run(tmp_path):
    """Four epochs, killed after epoch 1, in the middle of epoch 2 and inside the epoch-3 save (its optimizer
    state written), rerun after each kill: the student's weights, the history and every file of the last
    checkpoint are byte for byte those of a run never stopped."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    spec = {"job": "distill", "epochs": 4}
    uninterrupted = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps({**spec, "checkpoint_dir": str(whole / "ckpt"), "out": str(whole)})],
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )
    spec |= {"checkpoint_dir": killed / "ckpt", "out": killed}
    # kill point -> the newest finished checkpoint right after the kill, and the temp folders left
    for point, newest, left in [
        ("epoch:1", 1, []),
        ("batch:4", 1, []),  # the 4th of 8 batches of epoch 2: this run resumed after epoch 1
        ("optimizer-written@3", 2, [".tmp-step-00000003-"]),  # after epoch 2's save, which pruned epoch 1
    ]:
        sigkill(launch({**spec, "pause": point}, tmp_path / "paused"))
        assert [step for step, _ in list_checkpoints(killed / "ckpt")] == [newest], point
        assert temp_folders(killed / "ckpt") == left, point
    rerun = subprocess.run(
        [sys.executable, str(WORKER), json.dumps(spec, default=str)], env=ENV, capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    errors = uninterrupted.communicate(timeout=300)[1]
    assert uninterrupted.returncode == 0, errors[-2000:]

    assert json.loads((killed / "history.json").read_text()) == json.loads((whole / "history.json").read_text())
    assert (killed / "model.safetensors").read_bytes() == (whole / "model.safetensors").read_bytes()
    last = [root / "ckpt" / "step-00000004" for root in (killed, whole)]
    # weights, optimizer and schedule with the best weights and the generator, RNG states, history, checksums
    for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, MANIFEST_FILE):
        assert (last[0] / name).read_bytes() == (last[1] / name).read_bytes(), name
    assert temp_folders(killed / "ckpt") == [] and os.listdir(killed / "ckpt") == ["step-00000004"]
