"""The one checked GGUF file of an installed model: a single file is read where it is installed; byte parts
are concatenated in order into a temporary folder (streamed, :data:`BLOCK` bytes at a time) that is deleted
afterwards. Either way its SHA256 is computed and checked against the wheels' list."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from agpo.pretrained.cache import default_cache_dir
from agpo.pretrained.checksums import check_sha256
from agpo.pretrained.wheels import InstalledGGUF

BLOCK = 1 << 20  # bytes read at a time when concatenating and hashing


def concatenate(parts: Sequence[Path], target: Path) -> str:
    """Write ``parts`` one after another into the new file ``target`` (streamed); the SHA256 of the result."""
    digest = hashlib.sha256()
    with target.open("xb") as out:
        for part in parts:
            with part.open("rb") as source:
                while block := source.read(BLOCK):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def open_gguf(installed: InstalledGGUF, workdir: str | Path | None = None) -> Iterator[tuple[Path, str]]:
    """(path, SHA256) of the checked GGUF file for the length of the ``with`` block.

    A single file is used where it is installed. Parts are concatenated into a new temporary folder in
    ``workdir`` (default: the model cache), which is deleted when the block ends, however it ends.
    """
    if len(installed.parts) == 1:
        path = installed.parts[0]
        sha256 = file_sha256(path)
        check_sha256(installed, sha256)
        yield path, sha256
        return
    workdir = Path(workdir).expanduser() if workdir is not None else default_cache_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{installed.entry.name}.", suffix=".gguf.tmp", dir=workdir))
    try:
        path = folder / installed.entry.gguf_file
        sha256 = concatenate(installed.parts, path)
        check_sha256(installed, sha256)
        yield path, sha256
    finally:
        shutil.rmtree(folder, ignore_errors=True)
