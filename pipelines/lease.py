"""One writer per piece of work (a shard, the partition, the merge): a lease on a shared folder, fenced.

A lease on ``name`` is a generation of files ``<folder>/<name>/gen-000003.json``, each naming its holder
(host, boot id, PID namespace, pid, Airflow try), a random token, its length in seconds and a heartbeat
count. The highest generation is the lease.

- **Take**: create the next generation with ``os.link`` from a complete temp file: atomic, and it fails
  when the name exists, on local disks and NFS alike, so of two workers racing for one generation exactly
  one wins and the other waits or re-reads.
- **Wait or take over**: while the newest generation is live, others wait (polling) until the work is done
  (``done()``, then they do nothing) or the lease is free. It is free when it is a tombstone (released),
  when its holder is a process of this host, boot and PID namespace that no longer exists (a killed
  worker: taken over at once), or when the waiter has watched it for the lease's ``seconds`` by its own
  monotonic clock without seeing it change (a dead or hung worker on any host, or in another container).
  No wall clock is compared across hosts, so clock skew can neither expire a live lease nor keep a dead one.
- **Keep**: a heartbeat thread rewrites the holder's own generation (a new heartbeat count) every eighth
  of ``seconds``, in place through a descriptor opened without ``O_CREAT``: a renewal can never create a
  file, so it cannot bring back a generation a successor deleted. A heartbeat that fails (an unreadable
  lease, a read error) is logged and fences the holder.
- **Fence**: before each commit the holder calls ``check()``: its own last renewal must be under half of
  ``seconds`` old by its monotonic clock (a holder that was frozen longer may already have a successor that
  waited ``seconds``: it stops itself) and the newest generation must still carry its token (a token, not a
  number). A worker whose lease was taken over gets ``LeaseLost`` and commits nothing more.
- **Release**: the holder creates a tombstone generation above its own, then deletes its own and the older
  ones; so does the heartbeat when the thread that took the lease has died without releasing it (its
  process lives on, so nobody else could tell), and a take that is interrupted removes what it created.
  The tombstone keeps the numbers climbing, so a frozen holder's generation can never be the newest again;
  the run's merge clears its released leases at the end (``remove_leases``).

Records are fixed-size, checksummed JSON, so a reader that catches a rewrite half-done sees a bad checksum
and reads again.

Shared volumes (NFS): ``lease_seconds`` must exceed twice the mount's attribute-cache time plus a heartbeat, at
least 150 s on default mounts (docs/annotation.md "Leases on shared volumes" says why).

What remains: a holder that passes ``check()`` and is then frozen past ``seconds`` may still complete one
write after a successor started. Shard outputs are published under names that carry their content's
SHA-256 and the shard's manifest is created exclusively (``commits.publish_shard``), so it can neither
change a file a manifest describes nor replace a manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.errors import StageFailed
from pipelines.io import write_atomic

LOG = logging.getLogger(__name__)

_GENERATION = re.compile(r"^gen-(\d{6})\.json$")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
RECORD_BYTES = 512  # every generation file has this size, so a renewal overwrites it whole, in place
TORN_READ_RETRIES = 20
BEATS_PER_LEASE = 8  # a holder fences itself after half a lease without renewal: 4 missed beats


class LeaseLost(StageFailed):
    """This worker's lease was taken over: another worker now owns the work."""


class LeaseUnreadable(StageFailed):
    """A generation file that does not hold a lease record (corrupt, or written by an older version)."""


def this_boot() -> str:
    return BOOT_ID.read_text().strip() if BOOT_ID.is_file() else ""


def this_pid_namespace() -> str:
    """The PID namespace of this process (``pid:[4026531836]``): pids of other containers mean nothing here."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def encode_record(record: dict[str, Any]) -> bytes:
    """A lease record as ``RECORD_BYTES`` of JSON (space-padded) with a checksum of its fields."""
    fields = {k: v for k, v in record.items() if k != "sum"}
    payload = json.dumps({**fields, "sum": _checksum(fields)}, sort_keys=True).encode()
    if len(payload) > RECORD_BYTES:
        raise ValueError(f"lease record of {len(payload)} bytes exceeds {RECORD_BYTES}: {fields}")
    return payload.ljust(RECORD_BYTES)


def decode_record(data: bytes) -> dict[str, Any] | None:
    """The record in ``data``, or None when it is torn or corrupt (its checksum does not match)."""
    try:
        record = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("sum") != _checksum({k: v for k, v in record.items() if k != "sum"}):
        return None
    return record


def _checksum(fields: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(fields, sort_keys=True).encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class Generation:
    number: int
    record: dict[str, Any]

    def holder(self) -> str:
        if self.record.get("released"):
            return "nobody (released)"
        record = self.record
        return f"{record['host']} pid {record['pid']} (try {record['attempt']})"

    def free_at_once(self) -> bool:
        """Released, or held by a process of this host, boot and PID namespace that has exited."""
        record = self.record
        if record.get("released"):
            return True
        here = (socket.gethostname(), this_boot(), this_pid_namespace())
        if (record["host"], record["boot"], record["pidns"]) != here:
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

    def __init__(
        self,
        folder: Path,
        name: str,
        seconds: float,
        attempt: int = 1,
        clock: Callable[[], float] = time.monotonic,
        reader: Callable[[], Generation | None] | None = None,
    ) -> None:
        """``clock``: this process's seconds, for every wait and staleness the lease measures (never compared
        across hosts); ``reader``: how the newest generation is read (``newest``, the folder's; a test may hand
        in a frozen or failing one). Both are public attributes, replaceable while the lease is held."""
        if not seconds > 0:
            raise ValueError(f"lease seconds must be > 0, got {seconds!r}")
        self.folder, self.name, self.seconds, self.attempt = Path(folder) / name, name, seconds, attempt
        self.clock = clock
        self.reader = reader if reader is not None else self.newest
        self.token = secrets.token_hex(8)
        self.number: int | None = None
        self.lost = threading.Event()
        self.heartbeat: threading.Thread | None = None  # renews the lease while held (``start_heartbeat``)
        self._beats = 0
        self._renewed_at = 0.0  # clock() of the last renewal this holder made
        self._stop = threading.Event()
        self._owner = threading.current_thread()  # the thread that took the lease

    def acquire(self, done: Callable[[], bool], poll: float | None = None) -> bool:
        """Take the lease, waiting while a live worker holds it; False when ``done()`` turned true first."""
        poll = poll if poll is not None else min(5.0, self.seconds / 4)
        seen, since = None, 0.0
        while not done():
            newest = self.reader()
            if newest is not None and (newest.number, newest.record) != seen:
                if seen is None or newest.record["token"] != seen[1]["token"]:
                    LOG.warning("%s: held by %s; waiting for it to finish or go stale", self.name, newest.holder())
                seen, since = (newest.number, newest.record), self.clock()
            if newest is None or newest.free_at_once() or self._unchanged_too_long(newest, since):
                if self._create(newest.number + 1 if newest else 1):
                    self._owner = threading.current_thread()
                    self.start_heartbeat()
                    return True
                continue
            time.sleep(poll)
        return False

    def check(self) -> None:
        """The fence before a commit: raise ``LeaseLost`` unless this worker still holds the lease."""
        if not self.lost.is_set() and self._renewed_long_ago():
            self._lose(f"not renewed for {self.clock() - self._renewed_at:.1f} s, over half the lease")
        newest = self.reader()
        if self.lost.is_set() or newest is None or newest.record["token"] != self.token:
            self.lost.set()
            holder = newest.holder() if newest is not None else "nobody (released)"
            raise LeaseLost(
                f"{self.name}: this worker's lease was taken over (now {holder}) or lost after it was not renewed "
                f"in time ({self.seconds:g} s lease); its work is left to the new holder"
            )
        self._renew()

    def release(self) -> None:
        """Leave a tombstone above this holder's generation, then delete it and the older ones."""
        self.stop_heartbeat()
        newest = self.reader()
        if newest is None or newest.record["token"] != self.token:
            return
        try:
            write_atomic(self._path(self.number + 1), encode_record(self._record(released=True)), exclusive=True)
        except FileExistsError:  # a successor already took the next generation
            return
        for path in self.folder.glob("gen-*.json"):
            match = _GENERATION.match(path.name)
            if match and int(match.group(1)) <= self.number:
                path.unlink(missing_ok=True)

    def start_heartbeat(self) -> None:
        """Renew the lease ``BEATS_PER_LEASE`` times per lease length in a daemon thread, until
        ``stop_heartbeat`` or a loss (acquire starts it)."""
        self._stop = threading.Event()
        self.heartbeat = threading.Thread(target=self._beat, name=f"lease {self.name}", daemon=True)
        self.heartbeat.start()

    def stop_heartbeat(self) -> None:
        """Stop renewing (release does; a test that plays a hung holder does too) and wait for the thread."""
        self._stop.set()
        if self.heartbeat is not None and self.heartbeat is not threading.current_thread():
            self.heartbeat.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.seconds / BEATS_PER_LEASE) and not self.lost.is_set():
            try:
                if not self._owner.is_alive():  # it died without releasing: its process lives on, so free it
                    self._lose(f"the thread that took it ({self._owner.name}) has died")
                    self.release()
                    return
                if self._renewed_long_ago():
                    self._lose("its heartbeat was late by over half the lease (the process was frozen or starved)")
                    return
                newest = self.reader()
                if newest is None or newest.record["token"] != self.token:
                    self._lose(f"the newest generation is now {newest.holder() if newest else 'gone'}")
                    return
                self._renew()
            except Exception as error:  # any failure fences the holder, and says why
                self._lose(f"its heartbeat failed: {error!r}")
                return

    def _lose(self, why: str) -> None:
        LOG.warning("%s: lease lost, commits are fenced: %s", self.name, why)
        self.lost.set()

    def _renewed_long_ago(self) -> bool:
        return self.clock() - self._renewed_at > self.seconds / 2

    def _unchanged_too_long(self, newest: Generation, since: float) -> bool:
        return self.clock() - since >= max(self.seconds, float(newest.record.get("seconds", 0)))

    def _renew(self) -> None:
        """Rewrite this holder's generation in place with the next heartbeat count; never creates it."""
        self._beats += 1
        started = self.clock()
        try:
            fd = os.open(self._path(self.number), os.O_WRONLY)  # no O_CREAT: a deleted generation stays deleted
        except FileNotFoundError:
            self._lose("its generation file was deleted (released by a successor)")
            raise LeaseLost(f"{self.name}: this worker's lease generation {self.number} was deleted") from None
        try:
            os.pwrite(fd, encode_record(self._record()), 0)
        finally:
            os.close(fd)
        self._renewed_at = started

    def newest(self) -> Generation | None:
        """The newest generation in the lease's folder; re-listed when it vanishes while being read (a release),
        re-read when a rewrite was caught half-done."""
        torn = 0
        while True:
            numbers = sorted(int(m.group(1)) for p in self._list() if (m := _GENERATION.match(p)))
            if not numbers:
                return None
            path = self._path(numbers[-1])
            try:
                record = decode_record(path.read_bytes())
            except FileNotFoundError:
                time.sleep(0.005)  # a cached listing (NFS) may name it for a while: do not spin
                continue
            if record is not None:
                return Generation(numbers[-1], record)
            torn += 1
            if torn > TORN_READ_RETRIES:
                raise LeaseUnreadable(
                    f"{path} is not a lease record (corrupt, or left by an older version); delete it once no "
                    "worker holds that lease"
                )
            time.sleep(0.005)

    def _list(self) -> list[str]:
        try:
            return os.listdir(self.folder)
        except FileNotFoundError:
            return []

    def _create(self, number: int) -> bool:
        started, path = self.clock(), self._path(number)
        try:
            write_atomic(path, encode_record(self._record()), exclusive=True)
        except FileExistsError:  # another worker took this generation first
            return False
        except BaseException:  # interrupted, maybe after the link: no generation of ours may outlive the call
            with contextlib.suppress(OSError):
                if (decode_record(path.read_bytes()) or {}).get("token") == self.token:
                    path.unlink()
            raise
        self.number, self._renewed_at = number, started
        return True

    def _path(self, number: int) -> Path:
        return self.folder / f"gen-{number:06d}.json"

    def _record(self, released: bool = False) -> dict[str, Any]:
        record = {
            "host": socket.gethostname(),
            "boot": this_boot(),
            "pidns": this_pid_namespace(),
            "pid": os.getpid(),
            "attempt": self.attempt,
            "token": self.token,
            "seconds": self.seconds,
            "beat": self._beats,
        }
        return {**record, "released": True} if released else record


def remove_leases(folder: Path) -> None:
    """Remove a run's released leases (the merge's end): each lease whose newest generation is a tombstone, then
    the folder once empty. A lease someone holds is left alone: a second merger that took the merge lease after
    this one released it keeps it. (Still open: a lease taken between the check and the removal, microseconds.)"""
    for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
        newest = Lease(folder, name, 1.0).newest() if (folder / name).is_dir() else None
        if newest is None or newest.record.get("released"):
            shutil.rmtree(folder / name, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: a live lease stays
        folder.rmdir()
