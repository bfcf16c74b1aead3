"""A test helper, not a test: the forking server of the fault-injection children (``fault_child.py``,
``register_fault_child.py``), which spares each run the seconds a fresh interpreter spends importing torch,
transformers and mlflow.

A child script ends with ``sys.exit(fork_server.main(import_product, run))``: it imports the product once
(``import_product``), then either runs once with its command-line arguments (``run(sys.argv[1:])``, its exit
code the process's) or, given ``--serve``, reads request lines on stdin, ``{"argv": [...], "stdout": path,
"stderr": path}``, forks a child per line that runs ``run(argv)`` with its output in those files, and answers a
line ``{"returncode": ...}`` (as ``subprocess``'s: -9 for a SIGKILL) once that child has ended. The server
holds one thread when it forks (checked), so no child inherits a lock another thread held, and it only
imports: a connection or engine it opened would be shared by every child. ``started`` runs such a server from
a test and sends it the requests.
"""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path


def serve(run: Callable[[list[str]], int | None]) -> int:
    """Answer each request line with the exit code of a forked child; a child returns its own exit code."""
    for line in sys.stdin:
        request = json.loads(line)
        assert len(os.listdir("/proc/self/task")) == 1, "an import started a thread: forking would copy its locks"
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
            return run(request["argv"])  # the child leaves through sys.exit, as a fresh process would
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)
    return 0


def main(import_product: Callable[[], None], run: Callable[[list[str]], int | None]) -> int | None:
    """A child script's entry point: one run with its arguments, or ``--serve``."""
    import_product()
    return serve(run) if sys.argv[1:] == ["--serve"] else run(sys.argv[1:])


@contextlib.contextmanager
def started(script: Path, env: dict[str, str], timeout: float) -> Iterator[Callable[[list[str], Path], int]]:
    """``script --serve`` in its own session with ``env``; yields ``request(argv, output)``: the exit code of one
    run, whose stdout and stderr are kept in ``output``.out and .err. A run that takes over ``timeout`` seconds,
    or a server that ends before it answers, fails the test; so does a server that does not end with exit code
    0 once its stdin is closed."""
    process = subprocess.Popen(
        [sys.executable, str(script), "--serve"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def request(argv: list[str], output: Path) -> int:
        files = {"stdout": str(output.with_suffix(".out")), "stderr": str(output.with_suffix(".err"))}
        with contextlib.suppress(BrokenPipeError):  # a server that ended: no answer comes, below
            process.stdin.write(json.dumps({"argv": argv, **files}) + "\n")
            process.stdin.flush()
        if not select.select([process.stdout], [], [], timeout)[0]:
            os.killpg(process.pid, signal.SIGKILL)  # the server and the hung child
            raise AssertionError(f"no answer in {timeout} s to {argv}; see {files['stderr']}")
        answer = process.stdout.readline()
        if not answer:
            raise AssertionError(f"the fork server ended with exit code {process.wait()} before answering {argv}")
        return json.loads(answer)["returncode"]

    try:
        yield request
    finally:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        returncode = process.wait(timeout=60)
    assert returncode == 0, f"the fork server ended with exit code {returncode} (its traceback: the test's stderr)"
