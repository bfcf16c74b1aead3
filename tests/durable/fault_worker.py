"""A process for test_fault_injection_training.py to SIGKILL: it saves checkpoints or distils a student, and
can stop at a named point inside that work, write its pid to a marker file and sleep there until the test
kills it. Not a test module itself.

    python tests/durable/fault_worker.py '{"job": "save", "root": ..., "step": 2, "value": 2.0, "keep_last": 2,
                                          "pause": "optimizer-written", "marker": ...}'
    python tests/durable/fault_worker.py '{"job": "save-loop", "root": ..., "marker": ...}'
    python tests/durable/fault_worker.py '{"job": "distill", "checkpoint_dir": ..., "out": ..., "pause": ...}'

Pause points, each optionally ``@<step>``: only at the folder of that step (the one saved, or pruned):

    model-written      model.safetensors written, nothing else yet
    optimizer-written  optimizer.pt written too
    files-written      all five files written, none fsynced
    before-rename      the temp folder fsynced, not yet renamed into place
    between-renames    a step saved again: its old copy moved aside, the new one not yet in place
    renamed            the new checkpoint renamed into place, older ones not yet pruned
    pruning            deleting a pruned checkpoint: its model.safetensors is gone, the rest not yet
    stale-delete       deleting the old copy of a step saved again, as far as for pruning
    epoch:<n>          (distill) epoch n finished and checkpointed
    batch:<n>          (distill) at the n-th training batch of this process
"""

import json
import os
import pathlib
import shutil
import sys
import time
from pathlib import Path

import torch

from durable import checkpoint
from durable.checkpoint import MODEL_FILE, latest_checkpoint, load_checkpoint, save_checkpoint

FINGERPRINT = {"run": "fault-injection"}
SIZE = (512, 2048)  # 1 M weights: a 4 MiB model file and as much optimizer state per save


def model_of(value: float, size: tuple[int, int] = SIZE) -> torch.nn.Linear:
    """A model whose every weight is ``value``: a checkpoint's weights say which save wrote them."""
    model = torch.nn.Linear(*size)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return model


def save(root: str, step: int, value: float, keep_last: int, size: tuple[int, int] = SIZE) -> Path:
    model = model_of(value, size)
    return save_checkpoint(
        root,
        step,
        model=model,
        optimizer_state={"exp_avg": torch.full(size, value)},
        trainer_state={"step": step, "value": value},
        fingerprint=FINGERPRINT,
        keep_last=keep_last,
    )


def pause(marker: str) -> None:
    """Tell the test where this process stands and wait to be killed."""
    Path(marker).write_text(str(os.getpid()))
    time.sleep(600)
    sys.exit("paused for 600 s and was never killed")


def wrap(owner, name: str, hit, marker: str, *, before=None) -> None:
    """Pause in ``owner.name`` when ``hit(*args)``: after the call, or before it once ``before(*args)`` ran."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if before is not None and hit(*args):
            before(*args)
            pause(marker)
        result = original(*args, **kwargs)
        if before is None and hit(*args):
            pause(marker)
        return result

    setattr(owner, name, wrapper)


def install(point: str, marker: str) -> None:
    """Make this process pause at ``point`` (the module docstring lists them)."""
    name, _, step = point.partition("@")
    tag = f"step-{int(step):08d}" if step else "step-"

    def temp(prefix: str):
        return lambda path, *_: Path(path).name.startswith(prefix) and tag in Path(path).name

    def delete_weights(folder, *_):
        (Path(folder) / MODEL_FILE).unlink()

    points = {
        "model-written": lambda: wrap(checkpoint, "save_model", lambda _m, file: tag in str(file), marker),
        "optimizer-written": lambda: wrap(
            torch, "save", lambda _o, file, *_: Path(file).name == "optimizer.pt" and tag in str(file), marker
        ),
        "files-written": lambda: wrap(
            checkpoint, "fsync_file", lambda file: tag in Path(file).parent.name, marker, before=lambda *_: None
        ),
        "before-rename": lambda: wrap(checkpoint, "fsync_dir", temp(".tmp-step-"), marker),
        "between-renames": lambda: wrap(pathlib.Path, "rename", lambda _s, target: temp(".tmp-stale-")(target), marker),
        "renamed": lambda: wrap(pathlib.Path, "rename", lambda source, _t: temp(".tmp-step-")(source), marker),
        "pruning": lambda: wrap(shutil, "rmtree", temp(".tmp-pruned-"), marker, before=delete_weights),
        "stale-delete": lambda: wrap(shutil, "rmtree", temp(".tmp-stale-"), marker, before=delete_weights),
    }
    kind, _, count = point.partition(":")
    if kind == "batch":
        import student.training

        calls = []
        wrap(student.training, "distill_loss", lambda *_: calls.append(1) or len(calls) == int(count), marker)
    elif kind != "epoch":  # distill_run pauses after an epoch itself
        points[name]()


def save_loop(root: str, marker: str) -> None:
    """Save steps 1, 2, ... (two kept) from the newest checkpoint on, as a training run that saves without
    end would; ``marker`` is written once the first save starts."""
    latest = latest_checkpoint(root)
    step = 0
    if latest is not None:
        model = model_of(0.0)
        step = load_checkpoint(latest, model=model, fingerprint=FINGERPRINT)[0].step
    Path(marker).write_text(str(os.getpid()))
    while True:
        step += 1
        save(root, step, float(step), keep_last=2)


def distill_run(spec: dict) -> None:
    """The student distilled from a small synthetic task (as tests/student/test_distil.py), saved to ``out``."""
    from evaluation.metrics import validation_scores
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
    from student.model import RelevanceStudent, StudentConfig
    from student.training import DistilTrainingConfig, distil

    rows = generate_pairs(SyntheticConfig(train=120, audit=30, unlabeled=0, test=0, seed=5))
    labels = [
        {**r, "votes": [int(g == r["gold_grade"]) * 2 for g in range(4)], "grade": r["gold_grade"]}
        | {"confidence": 1.0, "gold_grade": None}
        for r in rows
        if r["split"] == "train"
    ]
    validation = [r for r in rows if r["split"] == "audit"]
    student = RelevanceStudent.build(
        StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=[r["query"] + " " + r["ad_title"] for r in rows]
    )
    # the linear schedule and BERT's dropout make the result depend on the restored scheduler and RNG states
    config = DistilTrainingConfig(
        epochs=spec["epochs"], patience=9, batch_size=16, learning_rate=2e-3, schedule="linear"
    )
    pause_epoch = int(spec["pause"].removeprefix("epoch:")) if spec.get("pause", "").startswith("epoch:") else None

    def on_epoch(record: dict) -> None:
        if record["epoch"] == pause_epoch:
            pause(spec["marker"])

    checkpoints = spec["checkpoint_dir"]
    result = distil(
        student, labels, validation, config, score=validation_scores, on_epoch=on_epoch, checkpoint_dir=checkpoints
    )
    student.save(spec["out"])
    (Path(spec["out"]) / "history.json").write_text(json.dumps(result.history))


def main(spec: dict) -> None:
    if spec.get("pause"):
        install(spec["pause"], spec["marker"])
    if spec["job"] == "save":
        save(spec["root"], spec["step"], spec["value"], spec["keep_last"])
        sys.exit(f"the save finished without reaching {spec['pause']!r}")
    elif spec["job"] == "save-loop":
        save_loop(spec["root"], spec["marker"])
    else:
        distill_run(spec)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
