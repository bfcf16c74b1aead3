"""Long-running service processes: start, find, stop, kill.

Each service starts in a session of its own (``setsid``), so the session id is the service's pid and
every process it forks (Celery's pool, Airflow's task supervisors and task processes, Postgres backends)
carries it. (torchrun starts its ranks in sessions of their own; pipelines.launch makes them die with
their parent instead.) That makes three operations exact:

- stop: the stop signal to the leader, a grace period, then SIGKILL to whatever of the session is left;
- lose a worker: SIGKILL to every process of the session at once (what a machine crash does);
- check that nothing is left behind: no live process in any recorded session.

Pids are recorded in ``<run_dir>/pids/<name>.pid`` with the process's start time, so a pid file left by
a crash never names an unrelated process that reuses the pid; output goes to ``<run_dir>/logs/<name>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO


class ServiceError(RuntimeError):
    """A service did not start or stop; the message names it and quotes its log."""


@dataclass(frozen=True)
class Service:
    """How to run one service process."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None  # run as this user (Postgres refuses to run as root; workers, deploy/isolation.py)
    cwd: Path | None = None
    group: str | None = None  # its group, and no supplementary group (None: the group named like ``user``)
    umask: int = -1  # -1: inherited

    def __repr__(self) -> str:
        """Every field but the values of ``env`` (they hold the service's secrets): its keys only."""
        shown = {**vars(self), "env": sorted(self.env)}
        return f"Service({', '.join(f'{name}={value!r}' for name, value in shown.items())})"


def pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / "pids" / f"{name}.pid"


def log_file(run_dir: Path, name: str) -> Path:
    return run_dir / "logs" / f"{name}.log"


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no such process, or it ended while we looked
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _start_time(pid: int) -> str | None:
    fields = _stat(pid)
    return fields[19] if fields else None  # field 22 of stat: start time in clock ticks since boot


def recorded_pid(run_dir: Path, name: str) -> int | None:
    """The pid recorded for ``name``, if that very process (same start time) still exists."""
    path = pid_file(run_dir, name)
    if not path.is_file():
        return None
    pid, started = path.read_text().split()
    return int(pid) if _start_time(int(pid)) == started else None


def session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        fields = _stat(int(entry.name)) if entry.name.isdigit() else None
        if fields and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return sorted(pids)


def is_running(run_dir: Path, name: str) -> bool:
    pid = recorded_pid(run_dir, name)
    return pid is not None and bool(session_processes(pid))


def open_log(run_dir: Path, name: str) -> BinaryIO:
    """``name``'s log, opened for appending; the operator's only (folder 0700, file 0600, whatever the umask): a
    service may log a URL or a setting that a task should not read."""
    log = log_file(run_dir, name)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.parent.chmod(0o700)
    descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(descriptor, 0o600)  # a log an older up created with the umask's mode
    return os.fdopen(descriptor, "ab")


def start(service: Service, run_dir: Path) -> int:
    """Start ``service`` in a new session with its output in its log (``open_log``); returns (and records) its
    pid."""
    pid_file(run_dir, service.name).parent.mkdir(parents=True, exist_ok=True)
    with open_log(run_dir, service.name) as out:
        process = subprocess.Popen(
            list(service.argv),
            env=dict(service.env),
            cwd=service.cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=service.user,
            group=service.group or service.user,
            extra_groups=[] if service.user else None,
            umask=service.umask,
        )
    pid_file(run_dir, service.name).write_text(f"{process.pid} {_start_time(process.pid)}")
    return process.pid


def signal_session(sid: int, sig: int) -> None:
    for pid in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, sig)


def stop(run_dir: Path, name: str, stop_signal: int = signal.SIGTERM, grace: float = 30.0) -> None:
    """Stop service ``name``: ``stop_signal`` to its leader, then SIGKILL to its session after ``grace`` s."""
    pid = recorded_pid(run_dir, name)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, stop_signal)
    deadline = time.monotonic() + grace
    while session_processes(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.2)
    _kill_session(pid)
    pid_file(run_dir, name).unlink(missing_ok=True)


def kill(run_dir: Path, name: str) -> list[int]:
    """SIGKILL every process of service ``name`` at once (a lost machine); returns the pids killed."""
    pid = recorded_pid(run_dir, name)
    if pid is None:
        raise ServiceError(f"{name} is not running (no live process recorded in {pid_file(run_dir, name)})")
    victims = session_processes(pid)
    _kill_session(pid)
    return victims


def _kill_session(sid: int, timeout: float = 10.0) -> None:
    """SIGKILL the session until it is empty (again and again: a process may fork meanwhile)."""
    deadline = time.monotonic() + timeout
    while session_processes(sid) and time.monotonic() < deadline:
        signal_session(sid, signal.SIGKILL)
        _reap(sid)
        time.sleep(0.1)
    if session_processes(sid):
        raise ServiceError(f"session {sid} still has processes {session_processes(sid)} after SIGKILL")


def _reap(pid: int) -> None:
    """Collect the exit status of a leader started by this process (else it lingers as a zombie)."""
    with contextlib.suppress(ChildProcessError):  # not our child: its parent (or init) reaps it
        os.waitpid(pid, os.WNOHANG)


def wait_until(check, what: str, timeout: float, run_dir: Path, name: str, interval: float = 0.5) -> None:
    """Poll ``check()`` until true; fail early, quoting the log, if service ``name`` has died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not is_running(run_dir, name):
            log = log_file(run_dir, name)
            raise ServiceError(f"{name} exited before {what}; the end of {log}:\n{tail_log(run_dir, name)}")
        time.sleep(interval)
    raise ServiceError(f"{name}: {what} not reached in {timeout:.0f} s; its log:\n{tail_log(run_dir, name)}")


def log_size(run_dir: Path, name: str) -> int:
    path = log_file(run_dir, name)
    return path.stat().st_size if path.is_file() else 0


def read_log(run_dir: Path, name: str, start: int = 0) -> str:
    """The log of ``name`` from byte ``start`` on (logs are appended over restarts)."""
    path = log_file(run_dir, name)
    if not path.is_file():
        return ""
    with open(path, "rb") as log:
        log.seek(start)
        return log.read().decode(errors="replace")


def tail_log(run_dir: Path, name: str, lines: int = 30) -> str:
    path = log_file(run_dir, name)
    if not path.is_file():
        return f"(no log at {path})"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
