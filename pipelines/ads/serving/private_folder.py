"""Where a registered model is verified and then loaded: a folder no other user can change in between.

``agpo serve`` and ``agpo score`` used to download a version into ``out_dir``, check its files' digests there, and
then load it again by path from there; on the distributed stack ``work/runs`` is group-writable, so a task could
rewrite the served code after the check and before the load (issue 58). Now the version is downloaded into
``private_folder()``: a fresh ``mkdtemp`` folder (mode 0700, owned by this user) under a parent no other user can
rename it out of or replace it in (``check_private_parent``: the parent and each folder above it belong to this user
or root and are not writable by others unless sticky, as ``/tmp`` is), checked there and loaded from there; the
folder is removed when the caller is done (the server stopped, the model loaded). The parent is the temporary folder
(``TMPDIR``, else ``/tmp``); where that is not safe, the stage stops and says to point ``TMPDIR`` elsewhere.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipelines.errors import StageFailed

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


class UnsafeFolder(StageFailed):
    """A folder other users could rename or replace a verified model in."""


def check_private_parent(parent: Path) -> None:
    """``parent`` and every folder above it belong to this user or root and are writable by no other user, or are
    sticky (where only an entry's owner may rename or delete it): otherwise an ``UnsafeFolder`` naming it."""
    me = os.geteuid()
    for folder in (parent, *parent.parents):
        info = os.stat(folder)
        if info.st_uid not in (0, me) or (info.st_mode & OTHERS_WRITE and not info.st_mode & stat.S_ISVTX):
            raise UnsafeFolder(
                f"{folder} (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)}) lets other users rename or "
                "replace what is inside it, so a model verified below it could be swapped before it loads; point "
                "TMPDIR at a folder only you can write (e.g. mkdir -m 700 ~/.cache/agpo-tmp)"
            )


@contextmanager
def private_folder(prefix: str) -> Iterator[Path]:
    """A fresh folder only this user can enter (0700), under a parent checked by ``check_private_parent``; it and
    everything in it are removed on exit."""
    parent = Path(tempfile.gettempdir()).resolve()
    check_private_parent(parent)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        info = os.lstat(folder)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) != 0o700 or not stat.S_ISDIR(info.st_mode):
            raise UnsafeFolder(f"{folder} is not a folder of this user's with mode 0700; nothing was loaded")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
