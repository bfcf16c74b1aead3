"""One writer per piece of work (a shard, the partition, the merge): a lease on a shared folder, fenced.

A lease on ``name`` is a generation of files ``<folder>/<name>/gen-000003.json``, each naming its holder
(host, boot id, pid, Airflow try), a random token and an expiry. The highest generation is the lease.

- **Take**: create the next generation with ``os.link`` from a complete temp file: atomic, and it fails
  when the name exists, on local disks and NFS alike, so of two workers racing for one generation exactly
  one wins and the other waits or re-reads.
- **Wait or take over**: while the newest generation is live, others wait (polling) until the work is done
  (``done()``, then they do nothing) or the lease goes stale: its expiry has passed (a dead or hung worker
  on any host), or its holder is a process of this host and boot that no longer exists (a killed worker:
  taken over at once, no waiting for the expiry).
- **Keep**: a heartbeat thread rewrites the holder's own generation with a new expiry every quarter of
  ``seconds``, so a working holder never goes stale; a stopped or hung one does.
- **Fence**: before each commit the holder calls ``check()``: the newest generation must still carry its
  token (a token, not a number, so a generation number reused after a release cannot fool it). A worker
  whose lease was taken over gets ``LeaseLost`` and commits nothing more.
- **Release**: the holder deletes its generation and older ones, then the lease's folder and the leases
  folder when they are empty.

What remains: a holder that passes ``check()`` and is then frozen past its expiry may still complete one
commit after a successor started. Every commit here is of deterministic content and the final one (a
shard manifest) is created exclusively, so the result stays whole; merge's checksums catch anything else.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.io import write_json_atomic

_GENERATION = re.compile(r"^gen-(\d{6})\.json$")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class LeaseLost(RuntimeError):
    """This worker's lease was taken over: another worker now owns the work."""


def this_boot() -> str:
    return BOOT_ID.read_text().strip() if BOOT_ID.is_file() else ""


@dataclass(frozen=True)
class Generation:
    number: int
    record: dict[str, Any]

    def holder(self) -> str:
        record = self.record
        return f"{record['host']} pid {record['pid']} (try {record['attempt']})"

    def stale(self, now: float) -> bool:
        """Expired, or held by a process of this host and boot that has exited."""
        record = self.record
        if record["expires_at"] < now:
            return True
        if record["host"] != socket.gethostname() or record["boot"] != this_boot():
            return False
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's process
            return False
        return False


class Lease:
    """A lease on ``folder/name``, held by this process (the module docstring has the protocol)."""

    def __init__(self, folder: Path, name: str, seconds: float, attempt: int = 1) -> None:
        if not seconds > 0:
            raise ValueError(f"lease seconds must be > 0, got {seconds!r}")
        self.folder, self.name, self.seconds, self.attempt = Path(folder) / name, name, seconds, attempt
        self.token = secrets.token_hex(8)
        self.number: int | None = None
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self, done: Callable[[], bool], poll: float | None = None) -> bool:
        """Take the lease, waiting while a live worker holds it; False when ``done()`` turned true first."""
        poll = poll if poll is not None else min(5.0, self.seconds / 4)
        waiting_for = None
        while not done():
            newest = self._newest()
            if newest is None or newest.stale(time.time()):
                if self._create(newest.number + 1 if newest else 1):
                    self._heartbeat = threading.Thread(target=self._beat, name=f"lease {self.name}", daemon=True)
                    self._heartbeat.start()
                    return True
                continue
            if newest.record["token"] != waiting_for:
                waiting_for = newest.record["token"]
                print(f"{self.name}: held by {newest.holder()}; waiting for it to finish or go stale", file=sys.stderr)
            time.sleep(poll)
        return False

    def check(self) -> None:
        """The fence before a commit: raise ``LeaseLost`` unless this worker still holds the lease."""
        newest = self._newest()
        if self.lost.is_set() or newest is None or newest.record["token"] != self.token:
            self.lost.set()
            holder = newest.holder() if newest is not None else "nobody (released)"
            raise LeaseLost(
                f"{self.name}: this worker's lease was taken over (now {holder}) after it was not renewed for "
                f"{self.seconds:g} s; its work is left to the new holder"
            )
        if newest.record["expires_at"] < time.time() + self.seconds / 2:
            self._write(self.number, replace=True)

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        newest = self._newest()
        if newest is None or newest.record["token"] != self.token:
            return
        for path in self.folder.glob("gen-*.json"):
            match = _GENERATION.match(path.name)
            if match and int(match.group(1)) <= self.number:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: another worker is already taking the next generation
            self.folder.rmdir()
            self.folder.parent.rmdir()  # the last lease of the run folder (others: not empty, left)

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / 4):
            newest = self._newest()
            if newest is None or newest.record["token"] != self.token:
                self.lost.set()
                return
            try:
                self._write(self.number, replace=True)
            except OSError:  # the folder is gone: released by a successor
                self.lost.set()
                return

    def _newest(self) -> Generation | None:
        """The newest generation; re-listed when it vanishes while being read (a release)."""
        while True:
            numbers = sorted(int(m.group(1)) for p in self._list() if (m := _GENERATION.match(p)))
            if not numbers:
                return None
            try:
                record = json.loads((self.folder / f"gen-{numbers[-1]:06d}.json").read_text())
            except FileNotFoundError:
                continue
            return Generation(numbers[-1], record)

    def _list(self) -> list[str]:
        try:
            return os.listdir(self.folder)
        except FileNotFoundError:
            return []

    def _create(self, number: int) -> bool:
        try:
            self._write(number, replace=False)
        except FileExistsError:  # another worker took this generation first
            return False
        self.number = number
        return True

    def _write(self, number: int, replace: bool) -> None:
        record = {
            "host": socket.gethostname(),
            "boot": this_boot(),
            "pid": os.getpid(),
            "attempt": self.attempt,
            "token": self.token,
            "expires_at": time.time() + self.seconds,
        }
        write_json_atomic(self.folder / f"gen-{number:06d}.json", record, exclusive=not replace)
