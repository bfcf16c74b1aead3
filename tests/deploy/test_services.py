"""Service processes and stack settings, on real processes: a service's whole session is found and
killed, a stop escalates to SIGKILL, an early exit is reported with its log, and the stack's settings
keep credentials in the environment and every address on 127.0.0.1."""

import os
import stat
import sys

import pytest

from deploy import services, stack, worker_identity
from deploy.services import Service, ServiceError


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


def test_credentials_come_from_the_environment_only():
    with pytest.raises(ServiceError, match="set AGPO_STACK_DB_PASSWORD and AGPO_STACK_ADMIN_PASSWORD"):
        stack.Credentials.from_env({})
    found = stack.Credentials.from_env({stack.DB_PASSWORD: "d", stack.ADMIN_PASSWORD: "a"})
    assert (found.db_password, found.admin_password) == ("d", "a")


def test_airflow_settings_bind_to_loopback_and_carry_no_stack_password(tmp_path, monkeypatch):
    monkeypatch.setenv(stack.DB_PASSWORD, "db-secret")
    monkeypatch.setenv(stack.ADMIN_PASSWORD, "admin-secret")
    config = stack.StackConfig(home=tmp_path, airflow_port=18090, mlflow_port=15050)
    env = stack.airflow_env(config, stack.Credentials.from_env())
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18090/execution/"
    assert env["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:15050"
    assert "@127.0.0.1:" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    assert stack.DB_PASSWORD not in env and stack.ADMIN_PASSWORD not in env
    assert "admin-secret" not in "".join(env.values())  # the admin password lives in its 0600 file only
    keys = tmp_path / "secrets" / "airflow-internal.json"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600 and stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
    assert (
        stack.airflow_env(config, stack.Credentials.from_env())["AIRFLOW__CORE__FERNET_KEY"]
        == env["AIRFLOW__CORE__FERNET_KEY"]
    )  # generated once, then reused


def test_each_worker_records_its_own_name_as_the_task_hostname(tmp_path, monkeypatch):
    config = stack.StackConfig(home=tmp_path, workers=3)
    assert config.worker_names() == ["worker-1", "worker-2", "worker-3"]
    env = stack.worker_env(config, {}, "worker-2")
    assert env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == "deploy.worker_identity.hostname"
    monkeypatch.setenv("AGPO_WORKER_NAME", env["AGPO_WORKER_NAME"])
    assert worker_identity.hostname().startswith("worker-2@")
    monkeypatch.delenv("AGPO_WORKER_NAME")
    assert "@" not in worker_identity.hostname()
