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
