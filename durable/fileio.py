"""Small file primitives for durable writes and integrity checks (checkpoints, shards, manifests, logs)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def folder_files(folder: str | Path, leave_out: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file under ``folder`` (but the relative paths in ``leave_out``): relative POSIX path -> SHA-256, in
    path order. A symbolic link is refused: what it points at could change without the folder changing."""
    root, files = Path(folder), {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link: a model folder to hash holds plain files only")
        if path.is_file() and relative not in leave_out:
            files[relative] = sha256_file(path)
    return files


def files_digest(files: dict[str, str]) -> str:
    """One SHA-256 over a ``folder_files`` listing (its paths and their hashes, in path order)."""
    text = "\n".join(f"{digest}  {path}" for path, digest in sorted(files.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def changed_files(expected: dict[str, str], found: dict[str, str]) -> list[str]:
    """The paths that differ between two listings, each as ``path (changed|missing|added)``."""
    changes = []
    for path in sorted(set(expected) | set(found)):
        if path not in found:
            changes.append(f"{path} (missing)")
        elif path not in expected:
            changes.append(f"{path} (added)")
        elif expected[path] != found[path]:
            changes.append(f"{path} (changed)")
    return changes


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only set it)."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.is_file() else ():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    return 0o022


def share_like_open(directory: str | Path) -> None:
    """Give the files in ``directory`` the mode a plain ``open`` would (0666 less the umask). safetensors
    creates its files 0600, which only the writer's user may read: a step run by another user of the same
    group (the stack's register worker) could not read the model."""
    mode = 0o666 & ~current_umask()
    for path in Path(directory).iterdir():
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def fsync_file(path: str | Path) -> None:
    with Path(path).open("rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(directory: str | Path) -> None:
    """Make renames and new entries in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: str | Path) -> tuple[list[Any], bytes]:
    """The records of a JSON-lines file that is only appended to, one whole line per write, and its torn tail.

    A kill during an append can leave the last line torn: written in part, without its newline (the
    newline is the last byte of each write). That line was never finished, so it is returned apart as
    bytes (``b""`` when the file ends with its newline) for the caller to drop. Any other line that is not
    JSON is damage no kill explains: ``ValueError`` names the file and the line number.
    """
    *lines, torn = Path(path).read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(
                f"{path}, line {number}, is not JSON ({err}); only the last line can be torn by a kill, so the "
                "file was damaged otherwise: repair or delete that line"
            ) from None
    return records, torn
