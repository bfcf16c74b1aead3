"""Task isolation: the OS user the Celery workers run as, so that task code cannot read another service's secret.

As root, ``up`` runs no worker as the user that runs the other services: it creates (once, ``useradd
--system``: no login shell, no home) user ``agpo-tasks`` in group ``agpo-tasks`` and runs every worker as
it, with no other group: worker-1, worker-2, ... and ``registrar``, the worker of the register step (queue
``register``, deploy/airflow_settings), which alone holds MLflow's user ``registrar``, the one identity that
may move the ``champion`` alias. The group owns what tasks write (``task_folders``: the stack's output root
<home>/outputs, where its DAG runs write, and the task logs; setgid and group-writable under umask 002), and
each role has a private folder (``private_folder``, 0700: HOME, Airflow home and Celery pid file). Out of a
task's reach: <home>/secrets (0700, root), every other service's environment (/proc/<pid>/environ of another
user's process) and Postgres as superuser (its socket folder is user postgres's only, and a local login needs
peer authentication mapped to the user that runs ``up``; deploy/datastores.py). ``claim`` says what holds,
``up`` prints it.

The register worker runs as a user of its own, ``agpo-register`` (created like the first, in the same group),
so a task can read neither its environment (``registrar``'s password) nor its private folder, which holds the
registration lock (``registry_lock_folder``); it reads what the other steps wrote through the group (outputs
are created 0666 less the umask: pipelines/io.py, and durable.fileio.share_like_open for the safetensors files
of a saved student).

The workers write nothing in the checkout's own work/ (work/runs, work/mlflow, ...): there ``make demo`` runs as
the checkout's owner, whose folders (0755) the workers' users cannot write, and ``up`` leaves them as they are.

A folder above the Python interpreter, the repository or the home that other users cannot traverse (/root,
where pyenv keeps Python) gets a traverse-only ACL for the group (``grant_traversal``, ``setfacl -m
g:agpo-tasks:x``: a path known inside it can be reached, nothing listed); ``prepare`` then checks that the
users start the project's Python.

Not as root there is no other user to run as: every service and every task runs as the user that runs
``up``, so a task can read every secret of the stack; ``claim`` says so and docs/operations.md claims nothing more.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from deploy.services import ServiceError
from deploy.stack_config import OUTPUT_FOLDERS, REGISTRAR, REPO, StackConfig

GROUP = "agpo-tasks"
# role -> its OS user when isolated
USERS = {"tasks": "agpo-tasks", "register": "agpo-register"}


def isolated() -> bool:
    """Whether the workers run as users of their own: only root can start a process as another user."""
    return os.geteuid() == 0


def role(worker: str) -> str:
    """``register`` for the register worker, ``tasks`` for the others."""
    return "register" if worker == REGISTRAR else "tasks"


def user(worker_role: str) -> str | None:
    """The OS user a worker of ``worker_role`` runs as; None: as the user that runs ``up``."""
    return USERS[worker_role] if isolated() else None


def group() -> str | None:
    return GROUP if isolated() else None


def private_folder(config: StackConfig, worker_role: str) -> Path:
    """A role's own folder: HOME, Airflow home and pid files of its workers (0700, its user's, when isolated)."""
    return config.home / "workers" / worker_role


def registry_lock_folder(config: StackConfig) -> Path:
    """Where the register worker keeps the registration lock (``$AGPO_REGISTRY_LOCK_DIR``): in its private folder,
    so no task can write, hold or break it, and no folder of a laptop run is needed."""
    return private_folder(config, "register") / "registry-locks"


def task_folders(config: StackConfig) -> list[Path]:
    """The folders tasks write in: the stack's output root and the DAGs' folders in it, the task logs."""
    return [config.output_root, *(config.output_root / name for name in OUTPUT_FOLDERS), config.task_log_folder]


def prepare(config: StackConfig) -> None:
    """The users (created when missing), the folders they must traverse (``grant_traversal``), the task folders
    (group ``GROUP``, mode 2775) and each role's private folder (its user's, 0700) with the register worker's
    lock folder in it; then a check that each user starts the project's Python. Not as root: the folders only."""
    if isolated():
        ensure_users()
        for folder in grant_traversal(config):
            print(f"note: group {GROUP} may now traverse {folder} (ACL g:{GROUP}:x), to run {sys.executable}")
    for folder in task_folders(config):
        folder.mkdir(parents=True, exist_ok=True)
        if isolated():
            os.chown(folder, -1, grp.getgrnam(GROUP).gr_gid)  # its owner kept
            folder.chmod(0o2775)
    private = {private_folder(config, r): r for r in USERS} | {registry_lock_folder(config): "register"}
    for folder, worker_role in private.items():
        folder.mkdir(parents=True, exist_ok=True)
        if isolated():
            shutil.chown(folder, USERS[worker_role], GROUP)
            folder.chmod(0o700)
    if isolated():
        for name in dict.fromkeys(USERS.values()):
            _check_runs_python(name)


def grant_traversal(config: StackConfig, run=subprocess.run) -> list[Path]:
    """Give ``GROUP`` a traverse-only ACL on each folder above (or at) the Python interpreter, its standard
    library, the repository and the stack's home that other users cannot traverse and that has no such ACL
    yet; returns the folders it gave one."""
    needed = [Path(sys.executable).resolve(), Path(sys.base_prefix).resolve(), REPO, config.home.resolve()]
    closed = {
        folder
        for path in needed
        for folder in (path, *path.parents)
        if folder.is_dir() and not folder.stat().st_mode & stat.S_IXOTH
    }
    blocked = sorted(folder for folder in closed if not _group_traverses(folder, run))
    for folder in blocked:
        if shutil.which("setfacl") is None:
            raise ServiceError(
                f"{folder} is closed to other users, so the workers' users cannot run {sys.executable}: install "
                f"setfacl (deploy/install-services.sh installs Debian's acl) or let them through (chmod o+x {folder})"
            )
        done = run(["setfacl", "-m", f"g:{GROUP}:x", str(folder)], capture_output=True, text=True, check=False)
        if done.returncode:
            raise ServiceError(f"setfacl -m g:{GROUP}:x {folder} failed: {done.stderr.strip()}; chmod o+x {folder}?")
    return blocked


def _group_traverses(folder: Path, run=subprocess.run) -> bool:
    """Whether ``folder``'s ACL already lets ``GROUP`` traverse it (``getfacl``'s effective permissions)."""
    if shutil.which("getfacl") is None:
        return False
    done = run(["getfacl", "-p", "--omit-header", str(folder)], capture_output=True, text=True, check=False)
    for line in done.stdout.splitlines():  # group:agpo-tasks:--x, then maybe "#effective:---" (the mask's cut)
        entry, _, effective = line.partition("#effective:")
        tag, _, perms = entry.strip().rpartition(":")
        if tag == f"group:{GROUP}":
            return "x" in (effective or perms)
    return False


def _check_runs_python(name: str) -> None:
    """Fail now, saying why, if OS user ``name`` cannot start this Python and import the project's deploy/."""
    done = subprocess.run(
        [sys.executable, "-c", "import deploy.worker_identity"],
        cwd=REPO,
        env={"PATH": os.defpath},
        user=name,
        group=GROUP,
        extra_groups=[],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise ServiceError(
            f"OS user {name} cannot run {sys.executable} in {REPO}: {done.stderr.strip()[-400:]}\n"
            "every folder above the interpreter, the venv and the repository must be traversable and their files "
            "readable by other users"
        )


def ensure_users(run=subprocess.run) -> list[list[str]]:
    """Create group ``GROUP`` and the users of ``USERS`` that do not exist; returns the commands run."""
    commands = []
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        commands.append(["groupadd", "--system", GROUP])
    for name in dict.fromkeys(USERS.values()):
        try:
            pwd.getpwnam(name)
        except KeyError:
            home, shell = "/nonexistent", "/usr/sbin/nologin"
            commands.append(
                ["useradd", "--system", "--gid", GROUP, "--no-create-home", "--home-dir", home, "--shell", shell, name]
            )
    for command in commands:
        done = run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise ServiceError(
                f"cannot create the workers' OS user: `{' '.join(command)}` failed: {done.stderr.strip()[-400:]}\n"
                f"create users {', '.join(dict.fromkeys(USERS.values()))} in group {GROUP} yourself, or run `up` as "
                "a user other than root (then the workers run as that user and task code can read every secret of "
                "the stack)"
            )
    return commands


def claim(config: StackConfig) -> str:
    """What holds about task code and the stack's secrets, in one paragraph (``up`` prints it)."""
    if isolated():
        shared = USERS["register"] == USERS["tasks"]
        return (
            f"tasks run as OS user {USERS['tasks']} (the register step as {USERS['register']}): they cannot read "
            f"{config.home / 'secrets'}, another service's environment nor Postgres as superuser"
            + ("; they can read the register worker's (MLflow user registrar)" if shared else "")
        )
    me = pwd.getpwuid(os.geteuid()).pw_name
    return (
        f"not isolated: `up` ran as {me}, not root, so the workers run as {me} like every other service and "
        f"task code can read every secret of the stack ({config.home / 'secrets'}, the other services' "
        "environments, Postgres as superuser through its socket); run `up` as root to run them as users of their own"
    )
