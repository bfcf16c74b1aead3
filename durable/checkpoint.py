"""Training checkpoints that survive a kill at any moment and refuse to load anything wrong.

A checkpoint is one folder ``<root>/step-00000010/`` holding

- ``model.safetensors``: the weights (``safetensors.torch.save_model``: tied weights stored once);
- ``optimizer.pt``: the optimizer state, plain tensors and numbers, read back with
  ``torch.load(weights_only=True)``, so a tampered file cannot run code;
- ``rng.pt``: torch's and Python's random-generator states (same loader);
- ``trainer_state.json``: counters, the data cursor, the LR-schedule and controller states;
- ``manifest.json``: written last: format version, step, the run fingerprint, and the size and SHA-256
  of every other file.

Saving is atomic: every file is written into ``.tmp-step-...``, fsynced, the folder is fsynced and then
renamed into place (a rename within one filesystem is atomic), and the parent folder is fsynced. A
kill leaves either the previous checkpoints or the new one, never half of one; leftover temp folders
are removed by the next save. After a save only the newest ``keep_last`` checkpoints remain.

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

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{8})$")
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
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(".tmp-step-*"):  # from a save that was killed
        shutil.rmtree(leftover, ignore_errors=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    tmp.mkdir()
    save_model(model, str(tmp / MODEL_FILE))
    torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
    torch.save({"torch": torch.get_rng_state(), "python": random.getstate()}, tmp / RNG_FILE)
    (tmp / STATE_FILE).write_text(json.dumps(trainer_state, indent=1, sort_keys=True), encoding="utf-8")
    files = {name: _describe(tmp / name) for name in (MODEL_FILE, OPTIMIZER_FILE, RNG_FILE, STATE_FILE)}
    manifest = {"format_version": FORMAT_VERSION, "step": step, "fingerprint": fingerprint, "files": files}
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
    for name in (*files, MANIFEST_FILE):
        fsync_file(tmp / name)
    fsync_dir(tmp)
    if final.exists():  # the same step saved again (a rerun): swap, never leave a gap
        stale = root / f".tmp-stale-{final.name}-{os.getpid()}"
        final.rename(stale)
        tmp.rename(final)
        shutil.rmtree(stale)
    else:
        tmp.rename(final)
    fsync_dir(root)
    for _, old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest finished checkpoint folder under ``root``, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    fingerprint: dict[str, Any],
) -> tuple[Checkpoint, dict[str, Any]]:
    """Verify ``path``, load its weights into ``model`` and return (checkpoint, optimizer state).

    The RNG states are restored too. Raises ``CheckpointError`` before touching ``model`` when anything
    does not verify.
    """
    path = Path(path)
    manifest = _verified_manifest(path, fingerprint)
    try:
        load_model(model, str(path / MODEL_FILE), strict=True)
    except (RuntimeError, ValueError, OSError) as err:
        raise CheckpointError(f"{path / MODEL_FILE} does not fit the model: {err}") from None
    optimizer_state = _load_tensors(path / OPTIMIZER_FILE)
    rng = _load_tensors(path / RNG_FILE)
    torch.set_rng_state(rng["torch"])
    random.setstate(_as_tuple(rng["python"]))
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    return Checkpoint(path, int(manifest["step"]), state), optimizer_state


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
    written = manifest["fingerprint"]
    differing = sorted(k for k in set(written) | set(fingerprint) if written.get(k) != fingerprint.get(k))
    if differing:
        details = ", ".join(f"{k}: checkpoint {written.get(k)!r} vs this run {fingerprint.get(k)!r}" for k in differing)
        raise CheckpointError(
            f"{path} was written by a different run ({details}); resume with the same config and data, "
            "or start in a fresh output folder"
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
