"""A content-addressed cache of exported ONNX graphs: a student whose network is byte for byte one exported
before gets the same graph files copied, not traced again.

Why: torch's dynamo exporter takes tens of seconds for a MiniLM student on 2 cores, and a run exports the same
network several times. The zero-shot encoder is the baseline, and the student whenever a trained one falls
below it (the zero-shot floor), in the run's student, its gold-only student and every weekly run after it: the
three graphs of one run are byte-identical, as the exporter is deterministic.

The key is a SHA-256 over what decides the graph: ``EXPORT_SETTINGS`` (the exporter's version and arguments,
changed whenever export_onnx's call changes), torch's version, the graphs asked for (file name and reading),
the network's module tree (``repr``: classes, activations, sizes), its config where it has one (less
``_name_or_path``, the folder it was loaded from), and every
state-dict tensor (name, dtype, shape, bytes). An entry is a folder ``<cache>/<key>/`` holding the graph files,
written to a temporary folder and renamed whole with the SHA-256 of each file, so a reader sees all of an entry or
none; an entry missing a file, or one whose bytes no longer match, is a miss: traced again and replaced.

Where: ``$AGPO_ONNX_CACHE``, else ``$XDG_CACHE_HOME/agpo/onnx``, else ``~/.cache/agpo/onnx``, made 0700. A graph
in the cache is served after a copy, so a cache folder that another user owns, or that others may write, is not
used (``private_cache``): export then traces as if there were no cache. ``AGPO_ONNX_CACHE=off`` turns it off.
After each store the least recently used entries go until the cache holds ``$AGPO_ONNX_CACHE_GB`` (2) GiB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

OFF = "off"
SUMS = "sha256.json"  # an entry's files and their SHA-256
DEFAULT_GB = 2.0  # the cache's size after a store: a MiniLM student's two graphs are about 180 MB


def cache_folder() -> Path | None:
    """The cache's folder from the environment (see the module docstring), or None when turned off."""
    chosen = os.environ.get("AGPO_ONNX_CACHE")
    if chosen == OFF:
        return None
    if chosen:
        return Path(chosen)
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "agpo" / "onnx"


def private_cache(folder: Path | None) -> Path | None:
    """``folder``, created 0700 if absent, when this user owns it and nobody else may write it; else None."""
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        status = folder.stat()
    except OSError:
        return None
    others_write = status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return folder if status.st_uid == os.geteuid() and not others_write else None


def graph_key(net: torch.nn.Module, graphs: Mapping[str, str], settings: str) -> str:
    """SHA-256 of what decides ``net``'s exported ``graphs`` ({file name: reading}) under ``settings``."""
    digest = hashlib.sha256()
    for part in (settings, torch.__version__, repr(sorted(graphs.items())), repr(net)):
        digest.update(part.encode() + b"\0")
    config = getattr(getattr(net, "backbone", None), "config", None)
    if config is not None:  # less the folder it was loaded from: the same network saved elsewhere is one graph
        settings_of_net = {name: value for name, value in config.to_dict().items() if name != "_name_or_path"}
        digest.update(json.dumps(settings_of_net, sort_keys=True, default=str).encode() + b"\0")
    for name, tensor in net.state_dict().items():
        tensor = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode() + b"\0")
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def restore(cache: Path, key: str, directory: Path, files: list[str]) -> bool:
    """Copy entry ``key``'s ``files`` into ``directory``, each checked against the SHA-256 the entry recorded;
    False (nothing copied) when the entry lacks a file or a file's bytes changed."""
    entry = cache / key
    try:
        recorded = json.loads((entry / SUMS).read_text())
        found = {name: (entry / name).read_bytes() for name in files}
    except (OSError, ValueError):
        return False
    if any(hashlib.sha256(data).hexdigest() != recorded.get(name) for name, data in found.items()):
        return False
    os.utime(entry)  # recently used: pruned last
    for name, data in found.items():
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_suffix(".tmp")
        temporary.write_bytes(data)
        temporary.replace(target)
    return True


def store(cache: Path, key: str, directory: Path, files: list[str]) -> None:
    """Keep ``directory``'s ``files`` as entry ``key`` with their SHA-256 in ``SUMS``: written into a temporary
    folder and renamed whole, replacing an entry that failed its check. An entry another process renamed first
    is kept (the same key, the same bytes)."""
    entry = cache / key
    shutil.rmtree(entry, ignore_errors=True)  # absent, or one that restore refused
    staging = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=cache))
    try:
        sums = {}
        for name in files:
            data = (directory / name).read_bytes()
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_bytes(data)
            sums[name] = hashlib.sha256(data).hexdigest()
        (staging / SUMS).write_text(json.dumps(sums))
        staging.rename(entry)
    except OSError:  # another process renamed its entry first
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    prune(cache, keep=entry)


def prune(cache: Path, keep: Path) -> None:
    """Remove the least recently used entries (by their folder's mtime) until the cache holds at most
    ``$AGPO_ONNX_CACHE_GB`` (default ``DEFAULT_GB``) GiB; ``keep`` stays."""
    limit = float(os.environ.get("AGPO_ONNX_CACHE_GB", DEFAULT_GB)) * 2**30
    sized = []
    for entry in cache.iterdir():
        if entry.name.startswith("."):  # another process's staging folder
            continue
        try:
            sized.append((entry.stat().st_mtime, sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()), entry))
        except OSError:  # removed meanwhile
            continue
    total = sum(size for _, size, _ in sized)
    for _, size, entry in sorted(sized, key=lambda row: row[0]):
        if total <= limit:
            break
        if entry != keep:
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
