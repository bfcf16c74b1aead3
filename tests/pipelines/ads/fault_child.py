"""A test helper, not a test: run the ``agpo`` CLI and SIGKILL this very process at a chosen durable step.

    python fault_child.py PHASE K LOG -- <agpo CLI arguments>

Every durable filesystem step the main thread takes (``os.fsync``, ``os.replace``, ``os.rename``,
``os.link``, ``os.unlink``, ``os.rmdir``) inside one of the annotation phases below is appended to LOG as
``<phase>\t<step>``. Right after the K-th step of PHASE, or after the first step of a later phase when
PHASE ends sooner (an earlier run finished it; lease steps, taken in every phase, never count as later),
the process sends itself SIGKILL: a real kill, at an exact point, with nothing flushed or cleaned up; LOG
gets ``KILLED\t<phase>``. PHASE ``none`` kills nowhere (the uninterrupted run that counts the steps of
each phase).
"""

import os
import signal
import sys
import threading

ORDER = ("partition", "lease", "chunk commit", "shard finish", "merge")
PHASES = {  # the function on the stack that names the phase of a step (innermost first wins)
    "_write_partition": "partition",
    "commit_chunk": "chunk commit",
    "_finish_shard": "shard finish",
    "_merge_held": "merge",
    "acquire": "lease",
}
STEPS = ("fsync", "replace", "rename", "link", "unlink", "rmdir")


def phase_of_caller() -> str | None:
    frame = sys._getframe(2)
    while frame is not None:
        phase = PHASES.get(frame.f_code.co_name)
        if phase is not None and "pipelines" in frame.f_code.co_filename:
            return phase
        frame = frame.f_back
    return None


def install(target: str, kill_at: int, log_path: str) -> None:
    counts: dict[str, int] = {}
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 (open for the life of the process)

    def hooked(step, original):
        def run(*args, **kwargs):
            phase = phase_of_caller() if threading.current_thread() is threading.main_thread() else None
            result = original(*args, **kwargs)
            if phase is not None:
                counts[phase] = counts.get(phase, 0) + 1
                log.write(f"{phase}\t{step}\n")
                if target in ORDER and (
                    (phase == target and counts[phase] == kill_at)
                    or (phase != "lease" and ORDER.index(phase) > ORDER.index(target))  # leases come in every phase
                ):
                    log.write(f"KILLED\t{phase}\n")
                    os.kill(os.getpid(), signal.SIGKILL)
            return result

        return run

    for step in STEPS:
        setattr(os, step, hooked(step, getattr(os, step)))


if __name__ == "__main__":
    phase, at, log_file, separator, *cli_args = sys.argv[1:]
    assert separator == "--", __doc__
    install(phase, int(at), log_file)
    from pipelines.cli import main

    sys.exit(main(cli_args))
