"""The stack's secrets (deploy/credentials.py): one per service, generated once into <home>/secrets with mode
0600, reused by every later ``up``, an operator's own choice honoured; ``up`` needs no environment."""

import dataclasses
import os
import stat

import pytest

from deploy import airflow_services, stack
from deploy.credentials import SECRET_FILES, Credentials, CredentialsError, write_private
from deploy.stack_config import ADMIN_PASSWORD, DB_PASSWORD, StackConfig


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_each_service_gets_its_own_secret_in_a_0600_file_kept_across_ups(tmp_path):
    first = dataclasses.asdict(Credentials.load(tmp_path))
    assert len(set(first.values())) == len(first) == 15  # no two services share a secret
    assert all(len(value) >= 32 for value in first.values())  # MLflow wants 12 characters at least
    folder = tmp_path / "secrets"
    assert mode(folder) == 0o700
    written = sorted(p.name for p in folder.iterdir())
    assert written == sorted([*SECRET_FILES.values(), "airflow-internal.json"])  # no temporary file left
    assert all(mode(folder / name) == 0o600 for name in written)
    assert dataclasses.asdict(Credentials.load(tmp_path)) == first  # the next `up` reuses them
    assert repr(Credentials.load(tmp_path)).startswith("<deploy.credentials.Credentials object")  # no secret shown


def test_a_secret_an_operator_wrote_is_used_and_narrowed_to_0600(tmp_path):
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o755)
    chosen = folder / "postgres-mlflow.password"
    chosen.write_text("my own 'db' password@:/\n")
    chosen.chmod(0o644)
    credentials = Credentials.load(tmp_path)
    assert credentials.postgres_mlflow == "my own 'db' password@:/"
    assert mode(chosen) == 0o600 and mode(folder) == 0o700
    chosen.write_text("two\nlines")
    with pytest.raises(CredentialsError, match=r"postgres-mlflow\.password must hold one line.*delete it"):
        Credentials.load(tmp_path)


def test_a_private_file_is_replaced_whole_and_never_readable_by_others(tmp_path):
    path = tmp_path / "secrets" / "redis.conf"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    old_umask = os.umask(0)  # even a permissive umask does not widen it
    try:
        write_private(path, 'requirepass "new"\n')
    finally:
        os.umask(old_umask)
    assert path.read_text() == 'requirepass "new"\n' and mode(path) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["redis.conf"]


def test_up_needs_no_environment_and_takes_the_airflow_admin_password_from_it_when_set(tmp_path, monkeypatch):
    started = []
    for name in ("start_postgres", "start_redis", "start_stack_store", "start_mlflow", "start_airflow"):
        monkeypatch.setattr(stack, name, lambda config, credentials, name=name: started.append((name, credentials)))
    monkeypatch.setattr(stack.isolation, "prepare", lambda config: None)  # no OS users made by a unit test
    config = StackConfig(home=tmp_path)
    stack.up(config, env={})
    generated = started[0][1]
    assert [name for name, _ in started] == [
        "start_postgres",
        "start_redis",
        "start_stack_store",
        "start_mlflow",
        "start_airflow",
    ]
    assert all(credentials is generated for _, credentials in started)  # one set of secrets for the whole start

    started.clear()
    stack.up(config, env={ADMIN_PASSWORD: "the operator's choice", DB_PASSWORD: "shared"})
    again = dataclasses.asdict(started[0][1])
    assert again["airflow_admin"] == "the operator's choice"
    assert (tmp_path / "secrets" / "airflow-admin.password").read_text() == "the operator's choice"
    assert "shared" not in again.values()  # the old shared password is no longer read
    assert {k: v for k, v in again.items() if k != "airflow_admin"} == {
        k: v for k, v in dataclasses.asdict(generated).items() if k != "airflow_admin"
    }
    assert airflow_services.client(config)._credentials == {"username": "admin", "password": "the operator's choice"}
