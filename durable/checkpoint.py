"""Training checkpoints that survive a kill at any moment and refuse to load anything wrong.

A checkpoint is one folder ``<root>/step-00000010/`` holding

- ``model.safetensors``: the weights (``safetensors.torch.save_model``: tied weights stored once);
- ``optimizer.pt``: the optimizer state, plain tensors and numbers, read back with
  ``torch.load(weights_only=True)``, so a tampered file cannot run code;
  (or, in their place, whatever files a ``CheckpointWriter``'s caller wrote: DeepSpeed's per-rank shards,
  agpo.distributed);
- ``rng.pt``: torch's and Python's random-generator states (same loader);
- ``trainer_state.json``: counters, the data cursor, the LR-schedule and controller states;
- ``manifest.json``: written last: format version, step, the run fingerprint, and the size and SHA-256
  of every other file.

Saving is atomic: every file is written into ``.tmp-step-<step>-<pid>``, fsynced, the folder is fsynced
and then renamed into place (a rename within one filesystem is atomic), and the parent folder is fsynced.
A kill while writing leaves the previous checkpoints and a temp folder, never half of a ``step-*``
folder. Saving a step that already exists (a rerun) takes two renames, as POSIX cannot rename over a
non-empty folder: the old folder moves aside to ``.tmp-stale-step-<step>-<pid>``, the new one moves in,
then the old one is deleted; a kill between the two renames leaves that step missing, with its old copy
in the ``.tmp-stale-`` folder, until the step is put back (below). Older checkpoints beyond ``keep_last`` are renamed to
``.tmp-pruned-step-<step>-<pid>`` before they are deleted, so a kill while deleting never leaves a
half-deleted ``step-*`` folder.

The next ``save_checkpoint`` or ``latest_checkpoint`` on the folder finishes what a killed save left: a
``.tmp-stale-`` folder whose step is missing is renamed back (the step's previous copy, complete), and
every other ``.tmp-`` folder (a half-written save, a stale copy already replaced, a half-deleted old
checkpoint) is removed. A checkpoint folder therefore has one writer at a time (one training process);
``list_checkpoints`` only reads. tests/durable/test_fault_injection_training.py SIGKILLs a real process at
each of these points inside a save, and at random moments of a save loop.

Loading verifies the manifest first: a missing or truncated file, a checksum that differs, an unknown
format or a fingerprint from a different run (other model shape, algorithm, data size, ...) raises
``CheckpointError`` naming the file or key, and says how to proceed.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from durable.fileio import fsync_dir, fsync_file, sha256_file
from durable.fingerprint import describe_differences

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{8})$")
# what a killed save can leave: a half-written save, the old copy of a step saved again, an old checkpoint
# being pruned (the names save_checkpoint gives them)
_TEMP_DIR = re.compile(r"^\.tmp-(stale-|pruned-)?(step-\d{8})-\d+$")
MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, MANIFEST_FILE = (
    "model.safetensors",
    "optimizer.pt",
    "rng.pt",
    "trainer_state.json",
    "manifest.json",
)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, truncated or from a different run; the message says which and what to do."""


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint folder and its trainer state."""

    path: Path
    step: int
    trainer_state: dict[str, Any]


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Finished checkpoints under ``root`` as (step, path), oldest first (temp folders are ignored)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found)


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    fingerprint: dict[str, Any],
    keep_last: int,
) -> Path:
    """Write the checkpoint of ``step`` atomically under ``root`` and prune to the newest ``keep_last``."""
    writer = CheckpointWriter(root, step, keep_last)
    writer.begin()
    save_model(model, str(writer.folder / MODEL_FILE))
    torch.save(optimizer_state, writer.folder / OPTIMIZER_FILE)
    return writer.publish(trainer_state, fingerprint)


class CheckpointWriter:
    """One checkpoint save in three moves, for a writer that fills the folder itself (DeepSpeed's engine writes
    each rank's shards): ``begin`` (finish a killed save, make the temp folder), the caller writes its files into
    ``folder`` (any depth), ``publish`` (RNG states, trainer state and the manifest of every file, fsync, rename,
    prune). Several processes may write into ``folder`` between the two when they agree on ``owner`` (the pid in
    the temp name: the writing group's first process); ``begin`` and ``publish`` are that process's alone."""

    def __init__(self, root: str | Path, step: int, keep_last: int, owner: int | None = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        self.root, self.step, self.keep_last = Path(root), step, keep_last
        self.final = self.root / step_dir_name(step)
        self.folder = self.root / f".tmp-{self.final.name}-{owner or os.getpid()}"

    def begin(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        finish_interrupted_save(self.root)
        self.folder.mkdir()
        return self.folder

    def publish(self, trainer_state: dict[str, Any], fingerprint: dict[str, Any]) -> Path:
        tmp, final, root = self.folder, self.final, self.root
        torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / RNG_FILE)
        (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1, sort_keys=True), encoding="utf-8")
        names = sorted(str(f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file())
        files = {name: _describe(tmp / name) for name in names}
        manifest = {"format_version": FORMAT_VERSION, "step": self.step, "fingerprint": fingerprint, "files": files}
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
        for name in (*files, MANIFEST_FILE):
            fsync_file(tmp / name)
        for folder in sorted({(tmp / name).parent for name in files}, reverse=True):
            fsync_dir(folder)
        if final.exists():  # the same step saved again (a rerun): two renames, see the module docstring
            stale = root / f".tmp-stale-{final.name}-{os.getpid()}"
            final.rename(stale)
            tmp.rename(final)
            fsync_dir(root)
            shutil.rmtree(stale)
        else:
            tmp.rename(final)
            fsync_dir(root)
        for _, old in list_checkpoints(root)[: -self.keep_last]:
            pruned = root / f".tmp-pruned-{old.name}-{os.getpid()}"
            old.rename(pruned)  # no longer a checkpoint before any of its files goes
            shutil.rmtree(pruned)
        return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest finished checkpoint folder under ``root``, or None; first finishes what a killed save
    left there (``finish_interrupted_save``)."""
    if Path(root).is_dir():
        finish_interrupted_save(root)
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def finish_interrupted_save(root: str | Path) -> None:
    """Restore the old copy of a step a killed rerun left missing, and remove every other temp folder of
    a killed save under ``root`` (see the module docstring). Only for the folder's one writer."""
    root = Path(root)
    changed = False
    for folder in sorted(root.iterdir()):
        match = _TEMP_DIR.match(folder.name)
        if match is None or not folder.is_dir():
            continue
        final = root / match.group(2)
        if match.group(1) == "stale-" and not final.exists():
            folder.rename(final)  # killed between the two renames of a rerun: the step's previous copy
        else:
            shutil.rmtree(folder, ignore_errors=True)
        changed = True
    if changed:
        fsync_dir(root)


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    fingerprint: dict[str, Any],
) -> tuple[Checkpoint, dict[str, Any]]:
    """Verify ``path``, load its weights into ``model`` and return (checkpoint, optimizer state).

    The RNG states are restored too. Raises ``CheckpointError`` before touching ``model`` when anything
    does not verify or cannot be read safely (a file that pickles code, even with a matching checksum);
    only weights that do not fit ``model`` are found while loading them, which may leave it partly loaded.
    """
    path = Path(path)
    manifest = _verified_manifest(path, fingerprint)
    optimizer_state = _load_tensors(path / OPTIMIZER_FILE)
    checkpoint = _restore(path, manifest)
    try:
        load_model(model, str(path / MODEL_FILE), strict=True)
    except (RuntimeError, ValueError, OSError) as err:
        raise CheckpointError(f"{path / MODEL_FILE} does not fit the model: {err}") from None
    return checkpoint, optimizer_state


def read_checkpoint(path: str | Path, fingerprint: dict[str, Any]) -> Checkpoint:
    """Verify ``path``, restore its RNG states and return its step and trainer state; the caller loads the
    weights and optimizer state it wrote (``CheckpointWriter``)."""
    path = Path(path)
    return _restore(path, _verified_manifest(path, fingerprint))


def _restore(path: Path, manifest: dict[str, Any]) -> Checkpoint:
    """The RNG states of a verified checkpoint restored; its step and trainer state."""
    rng = _load_tensors(path / RNG_FILE)
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuple(rng["python"]))
    return Checkpoint(path, int(manifest["step"]), state)


def _verified_manifest(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any]:
    hint = f"delete {path} to resume from the checkpoint before it, or start in a fresh output folder"
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CheckpointError(f"{path} is not a finished checkpoint (no {MANIFEST_FILE}); {hint}")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{manifest_path} is corrupt ({err}); {hint}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {manifest.get('format_version')!r}, this version reads {FORMAT_VERSION}"
        )
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{file} is missing; {hint}")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"{file} is truncated or overwritten: {size} bytes, expected {expected['bytes']}; {hint}"
            )
        digest = sha256_file(file)
        if digest != expected["sha256"]:
            raise CheckpointError(
                f"{file} is corrupt: sha256 {digest[:12]}..., expected {expected['sha256'][:12]}...; {hint}"
            )
    details = describe_differences(manifest["fingerprint"], fingerprint, limit=10)
    if details:
        raise CheckpointError(
            f"{path} was written by a different run (checkpoint -> this run: {details}); resume with the same "
            "config and data, or start in a fresh output folder"
        )
    return manifest


def _load_tensors(file: Path) -> dict[str, Any]:
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # any unpickling failure: the checksum passed, so the writer was incompatible
        raise CheckpointError(f"{file} cannot be read safely (weights_only): {err}") from None


def _as_tuple(value: Any) -> Any:
    """random.setstate needs tuples; a round trip may hand back lists."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, list | tuple) else value


def _describe(file: Path) -> dict[str, Any]:
    return {"bytes": file.stat().st_size, "sha256": sha256_file(file)}
