"""File output that is never seen half-written: write a temp file beside the target, fsync, rename."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from durable.fileio import fsync_dir


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` so that readers see either the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # make the rename itself durable
    return path


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def print_summary(headline: str, paths: dict[str, Path]) -> None:
    """The end-of-stage summary: one line of results, then where each output is."""
    print(headline)
    for name, path in paths.items():
        print(f"  {name}: {path}")


def restart_metrics(path: Path, resumed_step: int | None) -> None:
    """A fresh run starts an empty file; a resumed one keeps the lines up to its checkpoint's step (later
    steps are trained again, so each step is written exactly once)."""
    if resumed_step is None:
        path.unlink(missing_ok=True)
        return
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    kept = [line for line in lines if json.loads(line)["step"] <= resumed_step]
    write_atomic(path, "".join(f"{line}\n" for line in kept))


def append_metrics(path: Path, step: int, metrics: dict[str, float]) -> None:
    """One JSON line per step, flushed to disk before training goes on (a kill loses no finished step)."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"step": step, **metrics}) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` values at each position."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / (i - max(0, i - window + 1) + 1) for i in range(len(values))]
