"""The local model cache: where it is (``$AGPO_MODEL_CACHE`` or ``~/.cache/agpo/models``), when an entry
``<cache>/<name>`` is a finished conversion (its marker file :data:`MARKER` names the model and the version of
every wheel it was made from), and how a converted folder is renamed into place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from agpo.pretrained.catalog import PackagedModel

MARKER = "agpo_packaged_model.json"
CACHE_ENV = "AGPO_MODEL_CACHE"


def default_cache_dir() -> Path:
    """``$AGPO_MODEL_CACHE`` when set, else ``~/.cache/agpo/models``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agpo" / "models").expanduser()


def _marker_versions(marker: dict, entry: PackagedModel) -> dict[str, str] | None:
    if "versions" in marker:
        return marker["versions"]
    if "version" in marker and len(entry.distributions) == 1:  # written when an entry had exactly one wheel
        return {entry.distributions[0]: marker["version"]}
    return None


def is_complete(directory: Path, entry: PackagedModel, versions: dict[str, str] | None) -> bool:
    """A finished conversion of ``entry`` (from exactly these wheel ``versions`` when they are known)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("name") != entry.name or marker.get("gguf_file") != entry.gguf_file:
        return False
    return versions is None or _marker_versions(marker, entry) == versions


def move_into_place(staging: Path, target: Path, entry: PackagedModel, versions: dict[str, str]) -> None:
    """Rename ``staging`` to ``target``; a stale ``target`` is moved aside first and deleted after."""
    stale = None
    if target.exists():
        stale = target.with_name(f".{target.name}.{os.getpid()}.stale")
        shutil.rmtree(stale, ignore_errors=True)
        target.rename(stale)
    try:
        staging.rename(target)
    except OSError:
        if not is_complete(target, entry, versions):  # not another process that finished first: a real failure
            raise
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)
