"""Task isolation without the stack (deploy/isolation.py, the settings it gives the workers, Postgres's client
authentication, the register step's queue): as root the workers run as users of their own with their own
MLflow user and folders, and a process started that way reads neither a 0600 secret nor a root service's
environment; not as root, isolation is not claimed and ``up`` says so."""

import grp
import importlib.util
import os
import pwd
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from deploy import isolation, services
from deploy.airflow_services import POLICY, airflow_env, worker_service
from deploy.credentials import Credentials, write_private
from deploy.datastores import hba_text, ident_text
from deploy.services import Service, ServiceError
from deploy.stack_config import OUTPUT_ROOT_ENV, REGISTRAR, REGISTRY_LOCK_ENV, REPO, StackConfig

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")


def held_secrets(env: dict[str, str], credentials: Credentials) -> set[str]:
    return {name for name, secret in vars(credentials).items() if secret in "".join(env.values())}


def test_as_root_each_worker_runs_as_its_roles_user_with_its_own_mlflow_user_and_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(isolation, "isolated", lambda: True)
    config = StackConfig(home=tmp_path)
    credentials = Credentials.load(tmp_path)
    env = airflow_env(config, credentials)
    tasks = worker_service(config, env, "worker-1", credentials)
    registrar = worker_service(config, env, REGISTRAR, credentials)
    assert (tasks.user, tasks.group, tasks.umask) == ("agpo-tasks", "agpo-tasks", 0o002)
    assert (registrar.user, registrar.group, registrar.umask) == (isolation.USERS["register"], "agpo-tasks", 0o002)
    assert tasks.env["MLFLOW_TRACKING_USERNAME"] == "tasks" and registrar.env["MLFLOW_TRACKING_USERNAME"] == "registrar"
    assert held_secrets(tasks.env, credentials) == {"redis_tasks", "postgres_celery", "mlflow_tasks", "s3_tasks"}
    assert held_secrets(registrar.env, credentials) == {"redis_registrar", "postgres_celery", "mlflow_registrar"}
    for service, role in ((tasks, "tasks"), (registrar, "register")):
        own = tmp_path / "workers" / role  # HOME, Airflow home and pid file: nobody else's
        assert service.env["HOME"] == str(own) and service.env["AIRFLOW_HOME"] == str(own / "airflow")
        assert service.argv[service.argv.index("--pid") + 1].startswith(f"{own}/")
        assert service.env["AIRFLOW__LOGGING__BASE_LOG_FOLDER"] == str(tmp_path / "task-logs")
    assert registrar.argv[registrar.argv.index("--queues") + 1] == "register"
    assert tasks.argv[tasks.argv.index("--queues") + 1] == "accelerator,default"


def test_the_stacks_runs_and_registration_lock_are_its_own_not_the_laptop_runs(tmp_path, monkeypatch):
    """Every worker writes DAG runs under the stack's output root and only the register worker gets a lock folder,
    its own: none of them is a folder of the checkout's work/, where `make demo` runs as the checkout's owner."""
    monkeypatch.setenv(REGISTRY_LOCK_ENV, "/operator/locks")  # an operator's shell: reaches no worker
    monkeypatch.setenv(OUTPUT_ROOT_ENV, "work")
    config = StackConfig(home=tmp_path)
    credentials = Credentials.load(tmp_path)
    env = airflow_env(config, credentials)
    assert env[OUTPUT_ROOT_ENV] == str(tmp_path / "outputs") == str(config.output_root)
    workers = {name: worker_service(config, env, name, credentials).env for name in (*config.worker_names(), REGISTRAR)}
    assert {worker[OUTPUT_ROOT_ENV] for worker in workers.values()} == {env[OUTPUT_ROOT_ENV]}
    locks = tmp_path / "workers" / "register" / "registry-locks"
    assert {name: worker.get(REGISTRY_LOCK_ENV) for name, worker in workers.items()} == {
        **dict.fromkeys(config.worker_names()),
        REGISTRAR: str(locks),
    }
    folders = [*isolation.task_folders(config), locks]
    assert all(folder.is_relative_to(tmp_path) for folder in folders)  # nothing of the checkout's work/
    assert not any(folder.is_relative_to(REPO / "work") for folder in folders)
    monkeypatch.setattr(isolation, "isolated", lambda: False)
    isolation.prepare(config)  # not root: the folders only
    assert all(folder.is_dir() for folder in folders)
    assert sorted(p.name for p in config.output_root.iterdir()) == ["math-runs", "runs", "scoring"]


def test_not_as_root_workers_run_as_the_caller_and_isolation_is_not_claimed(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 65534)  # nobody
    config = StackConfig(home=tmp_path)
    credentials = Credentials.load(tmp_path)
    worker = worker_service(config, airflow_env(config, credentials), "worker-1", credentials)
    assert (worker.user, worker.group, worker.umask) == (None, None, -1)
    assert worker.env.get("HOME") == os.environ.get("HOME")  # the caller's, with its caches
    claim = isolation.claim(config)
    nobody = pwd.getpwuid(65534).pw_name
    assert claim.startswith(f"not isolated: `up` ran as {nobody}, not root")
    assert f"task code can read every secret of the stack ({tmp_path / 'secrets'}" in claim


def test_the_users_are_created_once_and_a_failure_says_what_to_do(monkeypatch):
    def missing(name):
        raise KeyError(name)

    monkeypatch.setattr(isolation.grp, "getgrnam", missing)
    monkeypatch.setattr(isolation.pwd, "getpwnam", missing)
    ran = []
    commands = isolation.ensure_users(lambda command, **_: ran.append(command) or SimpleNamespace(returncode=0))
    assert ran == commands
    users = list(dict.fromkeys(isolation.USERS.values()))  # agpo-tasks (and agpo-register, once it has its own)
    assert [c[:2] for c in commands] == [["groupadd", "--system"], *[["useradd", "--system"]] * len(users)]
    assert [c[-1] for c in commands] == ["agpo-tasks", *users]
    assert all(c[c.index("--shell") + 1] == "/usr/sbin/nologin" and "--no-create-home" in c for c in commands[1:])

    def refused(command, **_):
        return SimpleNamespace(returncode=1, stderr="useradd: cannot lock /etc/passwd")

    with pytest.raises(ServiceError, match=r"cannot lock /etc/passwd(.|\n)*create users agpo-tasks.* in group"):
        isolation.ensure_users(refused)

    monkeypatch.setattr(isolation.grp, "getgrnam", lambda name: name)
    monkeypatch.setattr(isolation.pwd, "getpwnam", lambda name: name)
    assert isolation.ensure_users(refused) == []  # all there: nothing run


def test_a_closed_folder_above_the_home_gets_a_traverse_only_acl_for_the_group_once(tmp_path, monkeypatch):
    closed = tmp_path / "closed"
    (closed / "stack").mkdir(parents=True)
    closed.chmod(0o700)
    acl = {}  # folder -> the group's ACL entry, as setfacl leaves it and getfacl prints it

    def run(command, **_):
        if command[0] == "getfacl":
            entry = f"group:agpo-tasks:{acl[command[-1]]}\n" if command[-1] in acl else ""
            return SimpleNamespace(returncode=0, stdout=entry)
        acl[command[-1]] = command[command.index("-m") + 1].rpartition(":")[2]
        return SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(isolation.shutil, "which", lambda name: f"/usr/bin/{name}")
    config = StackConfig(home=closed / "stack")
    assert closed in isolation.grant_traversal(config, run)
    assert acl[str(closed)] == "x" and str(closed / "stack") not in acl  # traverse only, where it is closed
    assert closed not in isolation.grant_traversal(config, run)  # once


def test_postgres_trusts_nobody_and_its_superuser_logs_in_by_peer_through_the_socket_only():
    rules = [line.split() for line in hba_text().splitlines() if line and not line.startswith("#")]
    assert not [rule for rule in rules if "trust" in rule]
    assert rules == [
        ["local", "all", "postgres", "peer", "map=stack"],
        ["host", "all", "postgres", "127.0.0.1/32", "reject"],
        ["host", "sameuser", "all", "127.0.0.1/32", "scram-sha-256"],  # each role its own database, by password
    ]
    assert ident_text("root").splitlines()[1:] == ["stack  root  postgres", "stack  postgres  postgres"]
    assert ident_text("postgres").splitlines()[1:] == ["stack  postgres  postgres"]


def load_policy():
    spec = importlib.util.spec_from_file_location("airflow_local_settings", POLICY / "airflow_local_settings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cluster_policy_sends_the_register_step_and_only_it_to_the_register_queue(monkeypatch):
    policy = load_policy()
    tasks = {
        name: SimpleNamespace(dag_id=dag, task_id=task, queue="default")
        for name, (dag, task) in {
            "register": ("ads_relevance_agpo", "register"),
            "merge": ("ads_relevance_agpo", "merge"),
            "other dag's register": ("math_rlvr", "register"),
        }.items()
    }
    monkeypatch.delenv("AGPO_REGISTER_QUEUE", raising=False)
    policy.task_policy(tasks["register"])
    assert tasks["register"].queue == "default"  # any Airflow but the stack's: unchanged
    monkeypatch.setenv("AGPO_REGISTER_QUEUE", "register")
    for task in tasks.values():
        policy.task_policy(task)
    assert {name: task.queue for name, task in tasks.items()} == {
        "register": "register",
        "merge": "default",
        "other dag's register": "default",
    }


PROBE = """
for path in "$@"; do cat "$path" > /dev/null 2>> "$OUT" && echo "read $path" >> "$OUT"; done
grep -E '^(Uid|Gid|Groups):' /proc/self/status >> "$OUT"
"""


@ROOT_ONLY
def test_a_process_started_as_another_user_reads_neither_a_secret_nor_a_root_services_environment():
    tmp_path = Path(tempfile.mkdtemp(prefix="agpo-isolation-"))  # pytest's tmp_path is under a 0700 folder
    tmp_path.chmod(0o755)
    secret = tmp_path / "secrets" / "jwt.secret"
    write_private(secret, "jwt-s3cret")
    server = services.start(Service("server", ["sleep", "60"], {"JWT_SECRET": "jwt-s3cret"}), tmp_path)
    nobody = pwd.getpwnam("nobody")
    argv = ["sh", "-c", PROBE, "probe", str(secret), f"/proc/{server}/environ"]
    out = tmp_path / "probe.out"
    out.touch()
    os.chown(out, nobody.pw_uid, -1)
    try:
        probe = Service("probe", argv, {"OUT": str(out)}, user="nobody", group=grp.getgrgid(nobody.pw_gid).gr_name)
        pid = services.start(probe, tmp_path)
        services.wait_until(lambda: not services.session_processes(pid), "the probe's end", 30, tmp_path, "server")
        report = out.read_text()
    finally:
        services.stop(tmp_path, "server", grace=1)
        shutil.rmtree(tmp_path)
    assert f"{secret}: Permission denied" in report and f"/proc/{server}/environ: Permission denied" in report
    assert "read " not in report
    assert f"Uid:\t{nobody.pw_uid}\t" in report and f"Gid:\t{nobody.pw_gid}\t" in report
    assert "Groups:\t \n" in report  # no supplementary group (root's)
    assert "jwt-s3cret" not in report
