"""Service processes and stack settings, on real processes: a service's whole session is found and
killed, a stop escalates to SIGKILL, an early exit is reported with its log, and the stack's settings
keep every address on 127.0.0.1 and give each process only the secrets it uses (workers the fewest)."""

import dataclasses
import os
import sys
from urllib.parse import quote

import pytest

from deploy import services, worker_identity
from deploy.airflow_services import airflow_env, worker_command, worker_env
from deploy.credentials import Credentials
from deploy.services import Service, ServiceError
from deploy.stack_config import StackConfig


def test_kill_takes_down_every_process_of_the_session(tmp_path):
    tree = Service("tree", ["sh", "-c", "sleep 300 & sleep 300 & wait"], os.environ)
    leader = services.start(tree, tmp_path)
    services.wait_until(lambda: len(services.session_processes(leader)) == 3, "three processes", 10, tmp_path, "tree")
    assert services.recorded_pid(tmp_path, "tree") == leader
    killed = services.kill(tmp_path, "tree")
    assert len(killed) == 3 and leader in killed
    assert services.session_processes(leader) == [] and not services.is_running(tmp_path, "tree")


def test_stop_escalates_to_sigkill_when_the_stop_signal_is_ignored(tmp_path):
    ignore_sigterm = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    stubborn = Service("stubborn", [sys.executable, "-c", ignore_sigterm])
    leader = services.start(stubborn, tmp_path)
    services.wait_until(lambda: services.session_processes(leader), "started", 10, tmp_path, "stubborn")
    services.stop(tmp_path, "stubborn", grace=0.5)
    assert services.session_processes(leader) == []
    assert services.recorded_pid(tmp_path, "stubborn") is None


def test_a_service_that_exits_early_is_reported_with_its_log(tmp_path):
    services.start(Service("broken", ["sh", "-c", "echo 'port 5432 already in use'; exit 3"]), tmp_path)
    with pytest.raises(ServiceError, match=r"broken exited before listening(.|\n)*port 5432 already in use"):
        services.wait_until(lambda: False, "listening", 10, tmp_path, "broken")


def test_a_service_prints_its_env_keys_but_not_their_values():
    service = Service("api", ["airflow", "api-server"], {"AIRFLOW__API_AUTH__JWT_SECRET": "jwt-s3cret", "PATH": "/bin"})
    for shown in (repr(service), str(service), f"{service}", repr([service])):
        assert "jwt-s3cret" not in shown and "/bin" not in shown
        assert "AIRFLOW__API_AUTH__JWT_SECRET" in shown and "'api-server'" in shown


OPERATOR_SHELL = {  # what an operator's shell may hold when it runs `up`
    "AGPO_STACK_DB_PASSWORD": "operator-db-secret",
    "AGPO_STACK_ADMIN_PASSWORD": "operator-admin-secret",
    "MLFLOW_TRACKING_USERNAME": "operator",
    "MLFLOW_TRACKING_PASSWORD": "operator-mlflow-secret",
    "AWS_ACCESS_KEY_ID": "operator-cloud-key",
    "AWS_SECRET_ACCESS_KEY": "operator-cloud-secret",
}


def test_airflow_settings_bind_to_loopback_and_carry_no_operator_or_mlflow_credential(tmp_path, monkeypatch):
    for name, value in OPERATOR_SHELL.items():
        monkeypatch.setenv(name, value)
    config = StackConfig(home=tmp_path, airflow_port=18090, mlflow_port=15050)
    credentials = Credentials.load(tmp_path)
    env = airflow_env(config, credentials)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18090/execution/"
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15050"
    databases = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": "airflow", "AIRFLOW__CELERY__RESULT_BACKEND": "celery"}
    for key, role in databases.items():
        password = getattr(credentials, f"postgres_{role}")
        assert env[key].endswith(f"://{role}:{password}@127.0.0.1:{config.postgres_port}/{role}")  # its own role
    redis = quote(credentials.redis, safe="")
    assert env["AIRFLOW__CELERY__BROKER_URL"] == f"redis://scheduler:{redis}@127.0.0.1:{config.redis_port}/0"
    assert env["AIRFLOW__CELERY__WORKER_ENABLE_REMOTE_CONTROL"] == "False"
    assert not set(OPERATOR_SHELL) & set(env)
    held = "".join(env.values())
    for secret in ("operator-", credentials.airflow_admin, credentials.mlflow_admin, credentials.mlflow_tasks):
        assert secret not in held  # admin passwords live in their 0600 files only; MLflow's task user: workers'
    assert credentials.postgres_mlflow not in held and credentials.mlflow_flask_key not in held  # MLflow's own


def test_workers_get_only_the_secrets_they_use(tmp_path, monkeypatch):
    for name, value in OPERATOR_SHELL.items():
        monkeypatch.setenv(name, value)
    config = StackConfig(home=tmp_path)
    credentials = Credentials.load(tmp_path)
    servers = airflow_env(config, credentials)
    shell_and_servers = {**OPERATOR_SHELL, **servers}  # as if base_env had let the operator's through
    env = worker_env(config, shell_and_servers, "worker-1", credentials)
    withheld = {
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__CORE__FERNET_KEY",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        "AGPO_STACK_DB_PASSWORD",
        "AGPO_STACK_ADMIN_PASSWORD",
    }
    assert withheld <= set(shell_and_servers) and not withheld & set(env)
    # takes its tasks from its own broker user, with unacked keys of its role's own, not the scheduler's
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://tasks:")
    assert env["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_KEY"] == "unacked-tasks"
    registrar = worker_env(config, shell_and_servers, "registrar", credentials)
    assert registrar["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://registrar:")
    assert registrar["AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__UNACKED_KEY"] == "unacked-registrar"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == servers["AIRFLOW__CELERY__RESULT_BACKEND"]  # writes results
    assert (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"]) == ("tasks", credentials.mlflow_tasks)
    # the stack's bucket as identity agpo-tasks, not the operator's cloud keys; the register worker has no S3 keys
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_ENDPOINT_URL"]) == ("agpo-tasks", config.s3_url)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"} & set(registrar)
    held = "".join(env.values())
    used = {"redis_tasks", "postgres_celery", "mlflow_tasks", "s3_tasks"}
    for name, secret in dataclasses.asdict(credentials).items():
        assert (secret in held) == (name in used), name
    assert "operator-" not in held


def test_each_worker_records_its_own_name_as_the_task_hostname(tmp_path, monkeypatch):
    config = StackConfig(home=tmp_path, workers=3)
    assert config.worker_names() == ["worker-1", "worker-2", "worker-3"]
    credentials = Credentials.load(tmp_path)
    env = worker_env(config, airflow_env(config, credentials), "worker-2", credentials)
    assert env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == "deploy.worker_identity.hostname"
    monkeypatch.setenv("AGPO_WORKER_NAME", env["AGPO_WORKER_NAME"])
    assert worker_identity.hostname().startswith("worker-2@")
    monkeypatch.delenv("AGPO_WORKER_NAME")
    assert "@" not in worker_identity.hostname()


def test_workers_listen_on_named_queues_and_only_accelerator_workers_take_accelerator_tasks(tmp_path):
    config = StackConfig(home=tmp_path)
    for name in config.worker_names():  # this CPU stack: every worker may take any task (a lost one fails over)
        argv = worker_command(config, name)
        assert (
            argv[argv.index("--queues") + 1] == "accelerator,default" and argv[argv.index("--concurrency") + 1] == "1"
        )
    gpu = StackConfig(home=tmp_path, workers=3, accelerator_workers=("worker-1", "worker-2"), accelerator_queue="gpu")
    assert [gpu.worker_queues(name) for name in gpu.worker_names()] == [
        ["gpu", "default"],
        ["gpu", "default"],
        ["default"],
    ]
    env = airflow_env(gpu, Credentials.load(tmp_path))  # the DAGs read their queue names from it
    assert (env["AGPO_ACCELERATOR_QUEUE"], env["AGPO_CPU_QUEUE"], env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"]) == (
        "gpu",
        "default",
        "default",
    )


def test_service_logs_are_the_operators_only_whatever_the_umask(tmp_path):
    """A service log may hold a URL or a setting; with umask 000 it used to be world-readable (0666)."""
    old = os.umask(0)
    try:  # it stays up until stopped: one that exited at once raced wait_until's "has it died" check under load
        command = "import time; print('started', flush=True); time.sleep(60)"
        services.start(Service("echo", [sys.executable, "-c", command]), tmp_path)
    finally:
        os.umask(old)
    log = services.log_file(tmp_path, "echo")
    try:
        services.wait_until(lambda: "started" in log.read_text(), "logging", 30, tmp_path, "echo")
    finally:
        services.stop(tmp_path, "echo")
    assert oct(log.stat().st_mode & 0o777) == "0o600" and oct(log.parent.stat().st_mode & 0o777) == "0o700"
