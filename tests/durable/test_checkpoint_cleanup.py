"""What a killed save leaves behind, and how the next save or ``latest_checkpoint`` finishes it: a rerun
killed between its two renames gets its step back, every other temp folder goes, and pruning never leaves
a half-deleted checkpoint that looks finished."""

from pathlib import Path

import pytest
import torch

from durable import checkpoint
from durable.checkpoint import MODEL_FILE, latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint

FINGERPRINT = {"run": "test"}


class Killed(Exception):
    """Stands in for a SIGKILL inside save_checkpoint."""


def model_of(value: float) -> torch.nn.Module:
    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(value)
    return model


def save(root: Path, step: int, value: float, keep_last: int = 3) -> Path:
    return save_checkpoint(
        root,
        step,
        model=model_of(value),
        optimizer_state={},
        trainer_state={"step": step},
        fingerprint=FINGERPRINT,
        keep_last=keep_last,
    )


def weight_in(path: Path) -> float:
    model = model_of(0.0)
    load_checkpoint(path, model=model, fingerprint=FINGERPRINT)
    return float(model.weight[0, 0].detach())


def temp_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(".tmp-*"))


def kill_on_call(monkeypatch, owner, name: str, call: int, before=None) -> None:
    """Make ``owner.name`` raise Killed on its ``call``-th call (1-based), after ``before(*args)``."""
    original, calls = getattr(owner, name), []

    def wrapper(*args, **kwargs):
        calls.append(args)
        if len(calls) == call:
            if before is not None:
                before(*args)
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_a_rerun_killed_between_its_two_renames_gets_the_old_copy_back(tmp_path, monkeypatch):
    save(tmp_path, 1, value=1.0)
    with monkeypatch.context() as patch:
        kill_on_call(patch, Path, "rename", call=2)  # 1: step-1 -> .tmp-stale-...; 2: the new one -> step-1
        with pytest.raises(Killed):
            save(tmp_path, 1, value=2.0)
    assert list_checkpoints(tmp_path) == []  # the window the module docstring describes
    assert len(temp_folders(tmp_path)) == 2  # the old copy (stale) and the finished new one
    found = latest_checkpoint(tmp_path)
    assert found == tmp_path / "step-00000001" and weight_in(found) == 1.0
    assert temp_folders(tmp_path) == []


def test_a_stale_copy_left_after_the_swap_is_removed_by_the_next_save(tmp_path, monkeypatch):
    save(tmp_path, 1, value=1.0)
    with monkeypatch.context() as patch:
        kill_on_call(patch, checkpoint.shutil, "rmtree", call=1)  # deleting the old copy of step 1
        with pytest.raises(Killed):
            save(tmp_path, 1, value=2.0)
    assert [name[: len(".tmp-stale-")] for name in temp_folders(tmp_path)] == [".tmp-stale-"]
    assert weight_in(tmp_path / "step-00000001") == 2.0  # the swap itself had finished
    save(tmp_path, 2, value=3.0)
    assert temp_folders(tmp_path) == []
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1, 2]
    assert weight_in(tmp_path / "step-00000001") == 2.0


def test_a_kill_while_pruning_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    save(tmp_path, 1, value=1.0, keep_last=1)

    def delete_the_weights(folder, *_):
        (Path(folder) / MODEL_FILE).unlink()

    with monkeypatch.context() as patch:
        kill_on_call(patch, checkpoint.shutil, "rmtree", call=1, before=delete_the_weights)
        with pytest.raises(Killed):
            save(tmp_path, 2, value=2.0, keep_last=1)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2]  # step 1 is no longer listed
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000002"
    assert temp_folders(tmp_path) == []


def test_latest_checkpoint_removes_a_half_written_save_and_nothing_else(tmp_path):
    save(tmp_path, 1, value=1.0)
    half = tmp_path / ".tmp-step-00000002-4242"  # a save killed while writing
    half.mkdir()
    (half / MODEL_FILE).write_bytes(b"partial")
    (tmp_path / ".tmp-notes").mkdir()  # not a name a save gives: not ours to delete
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000001"
    assert temp_folders(tmp_path) == [".tmp-notes"]
    assert (tmp_path / "metrics.jsonl").exists()


def test_latest_checkpoint_of_a_missing_folder_is_none(tmp_path):
    assert latest_checkpoint(tmp_path / "none") is None
    assert not (tmp_path / "none").exists()
