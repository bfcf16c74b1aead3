"""File output that is never seen half-written: write a temp file beside the target, fsync, rename.

Temp names are ``.<target>.<host>.<pid>.<random>.tmp``: unique across processes and hosts on a shared
volume, and tied to their target, so whoever owns a target (a shard's lease holder, say) can clear what a
killed writer left with ``remove_temps``.

Input paths a user gives are checked with ``require_file`` before anything opens or hashes them; a JSON-lines
file another process is appending to is read up to its last newline (``complete_rows``).
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import socket
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from durable.fileio import fsync_dir
from pipelines.errors import StageFailed

if TYPE_CHECKING:
    from pipelines.devices import DeviceChoice
    from pipelines.threads import ThreadChoice

NOT_REGULAR = (  # what a path that is not a regular file is, by its stat mode
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def require_file(path: str | Path, what: str, fix: str, error: type[Exception] = StageFailed) -> Path:
    """``path`` if it names a regular file (through symlinks), else ``error`` with "<what> <path> <what it is
    instead>; <fix>". It only ``stat``s the path: opening a FIFO waits for a writer and /dev/zero never
    ends, so a stage calls this before it opens or hashes a path a user gave."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise error(f"{what} {path} {_stat_problem(path, err)}; {fix}") from None
    if stat.S_ISREG(mode):
        return path
    kind = next((name for test, name in NOT_REGULAR if test(mode)), "another kind of entry")
    raise error(
        f"{what} {path} is {kind}, not a regular file (streams and devices are not read: save the data to a "
        f"file first); {fix}"
    )


def _stat_problem(path: Path, err: OSError | ValueError) -> str:
    if isinstance(err, ValueError):
        return f"is not a usable path ({err})"
    if err.errno == errno.ELOOP:
        return "is a symlink loop (too many levels of symbolic links)"
    if err.errno == errno.ENOENT and path.is_symlink():
        return f"is a symlink to {os.readlink(path)}, which does not exist"
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    return f"cannot be read ({err.strerror})"


def temp_path(target: str | Path) -> Path:
    """A fresh temp name beside ``target``, unique across hosts and processes."""
    target = Path(target)
    return target.with_name(f".{target.name}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def remove_temps(folder: str | Path, target: str = "*") -> int:
    """Delete the temp files or folders of ``target`` (a name; ``*``: any) in ``folder``; returns how many.
    Only the owner of those targets may call it: another writer's temp file in flight would vanish."""
    removed = 0
    for path in Path(folder).glob(f".{target}.*.tmp"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed += 1
    return removed


def _new_temp(path: Path, tries: int = 3) -> tuple[Path, int]:
    """Create ``path``'s folder and a fresh temp file in it. Another worker may remove the folder once it is
    empty (a lease's release, a finished shard's work folder) between the ``mkdir`` and the ``open``: then
    make it again."""
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = temp_path(path)
            # 0o666: the umask decides who may read an output (on the stack, the group of the task and register
            # users); secrets are written by deploy.credentials, never here
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:
            tries -= 1
            if not tries:
                raise


def write_atomic(path: str | Path, data: bytes | str, exclusive: bool = False) -> Path:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one. With
    ``exclusive`` the file is only created, never replaced (``os.link``: atomic on local disks and NFS), and
    ``FileExistsError`` says another writer created it first."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp, fd = _new_temp(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            os.link(tmp, path)
            tmp.unlink()
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # make the rename itself durable
    return path


def write_json_atomic(path: str | Path, obj: Any, exclusive: bool = False) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n", exclusive)


def print_summary(
    headline: str, paths: dict[str, Path], threads: ThreadChoice | None = None, device: DeviceChoice | None = None
) -> None:
    """The end-of-stage summary: one line of results, where each output is, the CPU threads and the device it
    ran with."""
    print(headline)
    for name, path in paths.items():
        print(f"  {name}: {path}")
    if threads is not None:
        print(f"  threads: {threads.describe()}")
    if device is not None:
        print(f"  device: {device.describe()}")


def append_metrics(path: Path, step: int, metrics: dict[str, float]) -> None:
    """One JSON line per step, flushed to disk before training goes on (a kill loses no finished step)."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, **metrics}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values at each position."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i - max(0, i - window + 1) + 1) for i in range(len(values))]


def complete_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON rows of ``path`` up to its last newline ([] when it does not exist yet)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
