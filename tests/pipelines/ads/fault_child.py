"""A test helper, not a test: run the ``agpo`` CLI with one fault injected at a chosen durable step.

    python fault_child.py KIND PHASE K LOG -- <agpo CLI arguments>
    python fault_child.py --serve

``--serve`` imports torch, transformers and the CLI once (about 7 of a run's 9 s on 2 cores), then for each
request line on stdin, ``{"argv": [KIND, PHASE, K, LOG, "--", ...], "stdout": path, "stderr": path}``, forks a
child that runs as the first form would, with its output in those files, and answers a line
``{"returncode": ...}`` (as ``subprocess``'s: -9 for a SIGKILL) once the child has ended (fork_server.py: the
server holds one thread when it forks, so the child inherits no lock another thread held). Both forms import the
product's modules before the hooks go in, so they run as in production: ``shutil`` imported after the hooks would
see functions that do not take ``dir_fd`` and fall back to its path-based ``rmtree``, which removes a folder in one
more ``rmdir`` (191 durable steps in an uninterrupted run instead of 190).

Every durable filesystem step the working thread takes (``os.fsync``, ``os.replace``, ``os.rename``,
``os.link``, ``os.unlink``, ``os.rmdir``) inside one of the annotation phases below is appended to LOG as
``<phase>\t<step>``. The fault lands at the K-th step of PHASE, or at the first step of a later phase when
PHASE ends sooner (an earlier run finished it; lease steps, taken in every phase, never count as later);
LOG gets ``FAULT\t<kind>\t<phase>``. KIND is one of

- ``kill``: right after the step the process sends itself SIGKILL: a real kill, nothing flushed or cleaned;
- ``enospc`` / ``eio``: the step itself fails with ``OSError`` ENOSPC (a full disk) or EIO (a failing
  one), and the run goes on as the product handles it (the CLI exits 1 with a "disk error" message);
- ``thread``: the CLI runs in a worker thread, which dies right after the step with an exception nothing
  in the product catches (a killed worker thread); the process lives on and runs the CLI again in its main
  thread, so a dead thread's live lease would make it wait forever (the parent's timeout fails it).

KIND ``none`` injects nothing (the uninterrupted run that counts the steps of each phase).
"""

import contextlib
import errno
import os
import signal
import sys
import threading

import fork_server  # next to this file, on sys.path as the script's folder

ORDER = ("partition", "lease", "chunk commit", "shard finish", "merge")
PHASES = {  # the function on the stack that names the phase of a step (innermost first wins)
    "_write_partition": "partition",
    "commit_chunk": "chunk commit",
    "_finish_shard": "shard finish",
    "_merge_held": "merge",
    "acquire": "lease",
}
STEPS = ("fsync", "replace", "rename", "link", "unlink", "rmdir")
ERRORS = {"enospc": errno.ENOSPC, "eio": errno.EIO}


class WorkerThreadKilled(BaseException):
    """The exception that kills the worker thread (a BaseException: no ``except Exception`` stops it)."""


def phase_of_caller() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        phase = PHASES.get(frame.f_code.co_name)
        if phase is not None and "pipelines" in frame.f_code.co_filename:
            return phase
        frame = frame.f_back
    return None


def install(kind: str, target: str, at: int, log_path: str, worker: list[threading.Thread]) -> None:
    """Hook the durable steps of the thread in ``worker`` (set once it starts) for one fault."""
    counts: dict[str, int] = {}
    fired = threading.Event()
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)

    def lands(phase: str) -> bool:
        if kind == "none" or fired.is_set():
            return False
        return (phase == target and counts[phase] == at) or (
            phase != "lease" and ORDER.index(phase) > ORDER.index(target)  # leases come in every phase
        )

    def hooked(step, original):
        def run(*args, **kwargs):
            phase = phase_of_caller() if worker and threading.current_thread() is worker[0] else None
            if phase is None:
                return original(*args, **kwargs)
            counts[phase] = counts.get(phase, 0) + 1
            log.write(f"{phase}\t{step}\n")
            if not lands(phase):
                return original(*args, **kwargs)
            fired.set()
            log.write(f"FAULT\t{kind}\t{phase}\n")
            if kind in ERRORS:
                raise OSError(ERRORS[kind], f"{os.strerror(ERRORS[kind])} (injected at {step})")
            with contextlib.suppress(OSError):  # a step that fails on its own (unlink of a missing file) counts too
                original(*args, **kwargs)
            if kind == "thread":
                raise WorkerThreadKilled(f"worker thread killed after {step} in {phase}")
            os.kill(os.getpid(), signal.SIGKILL)

        return run

    for step in STEPS:
        setattr(os, step, hooked(step, getattr(os, step)))


def run_cli(argv: list[str]) -> int:
    kind, phase, at, log_file, separator, *cli_args = argv
    assert separator == "--" and (kind in (*ERRORS, "kill", "thread", "none")), __doc__
    worker: list[threading.Thread] = []
    install(kind, phase, int(at), log_file, worker)
    from pipelines.cli import main as agpo

    if kind != "thread":
        worker.append(threading.main_thread())
        return agpo(cli_args)
    thread = threading.Thread(target=agpo, args=(cli_args,), name="worker")
    worker.append(thread)
    thread.start()
    thread.join()
    worker.clear()  # the rerun's steps are not hooked
    return agpo(cli_args)


def import_product() -> None:
    from pipelines.threads import prepare_openmp

    prepare_openmp()  # as the CLI does, before torch loads libgomp
    import agpo.models  # noqa: F401 (torch and transformers: what makes a fresh process slow)

    # what the command imports when it starts (scikit-learn's metrics among them): 9 s of a 15 s child on 2 cores
    import pipelines.ads.annotation.annotate
    import pipelines.cli  # noqa: F401


if __name__ == "__main__":
    sys.exit(fork_server.main(import_product, run_cli))
