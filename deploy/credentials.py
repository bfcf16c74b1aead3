"""Each service's own secret, generated on the first ``up`` and kept in ``<home>/secrets`` (mode 0600).

    postgres-airflow.password  Postgres role airflow, owner of db airflow: Airflow's metadata (API server,
                               scheduler, DAG processor)
    postgres-celery.password   Postgres role celery, owner of db celery: Celery's task results (scheduler and
                               workers)
    postgres-mlflow.password   Postgres role mlflow, owner of db mlflow: MLflow's backend store (MLflow server)
    redis.password             Redis user scheduler: the Celery broker, every queue (scheduler, API server, DAG
                               processor)
    redis-tasks.password       Redis user tasks: the workers' own queues only (workers)
    redis-registrar.password   Redis user registrar: the register queue only (the register worker)
    airflow-admin.password     user admin of the Airflow UI and REST API (people; $AGPO_STACK_ADMIN_PASSWORD
                               replaces it at ``up`` when set)
    airflow-internal.json      Airflow's Fernet key and JWT secret (API server, scheduler, DAG processor)
    mlflow-admin.password      MLflow's admin user (people, and ``up`` creating the task user)
    mlflow-tasks.password      MLflow's user tasks, not an admin: what Airflow tasks log with (workers)
    mlflow-registrar.password  MLflow's user registrar, the one that may move the champion alias (the
                               register worker)
    mlflow-flask.key           the MLflow server's Flask secret key (CSRF tokens of its forms)
    s3-admin.secret            the object store's identity agpo-admin, every action (``up`` making the bucket)
    s3-tasks.secret            the object store's identity agpo-tasks: read, write and list the stack's bucket
                               only (workers)

Generated, not derived from one master secret: each is ``secrets.token_urlsafe(24)``, written once and
reused by every later ``up``, so no two services share a secret and one that leaks tells nothing of the
others. To choose one, write the file (one line) before the first ``up``; to rotate one, delete it and run
``down`` and ``up`` (MLflow's admin excepted: MLflow keeps the password its user store was created with).
Files are written atomically in a folder of mode 0700; one found with wider permissions is narrowed to
0600. Services get their secret through a 0600 config file or their environment, never a command line.

Postgres's superuser has no password: it is reached only through the cluster's Unix socket, whose folder
(<home>/postgres/run) only its OS user may enter, by peer authentication. Everything here is readable by the
OS user that runs ``up``: as root, the workers run as other users (deploy/isolation.py) and get their
secrets from their environment only; not as root, task code can read it all (docs/operations.md, deployment).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

SECRET_FILES = {
    "postgres_airflow": "postgres-airflow.password",
    "postgres_celery": "postgres-celery.password",
    "postgres_mlflow": "postgres-mlflow.password",
    "redis": "redis.password",
    "redis_tasks": "redis-tasks.password",
    "redis_registrar": "redis-registrar.password",
    "airflow_admin": "airflow-admin.password",
    "mlflow_admin": "mlflow-admin.password",
    "mlflow_tasks": "mlflow-tasks.password",
    "mlflow_registrar": "mlflow-registrar.password",
    "mlflow_flask_key": "mlflow-flask.key",
    "s3_admin": "s3-admin.secret",
    "s3_tasks": "s3-tasks.secret",
}
AIRFLOW_INTERNAL = "airflow-internal.json"


class CredentialsError(RuntimeError):
    """A secret file is missing or malformed: the message names the file and the fix."""


def secrets_dir(home: Path) -> Path:
    return home / "secrets"


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, in a folder of mode 0700, atomically: a reader sees the old
    file or the new one, never a part, and the text never sits in a file that others may read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_private(path: Path) -> str:
    """The text of a secret file, narrowing its mode to 0600 first if others could read it."""
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        path.chmod(0o600)
    return path.read_text()


def read_secret(path: Path) -> str:
    """The one-line secret in ``path`` (a trailing newline is dropped)."""
    try:
        value = read_private(path).removesuffix("\n")
    except FileNotFoundError:
        raise CredentialsError(f"no secret at {path}: `python -m deploy.stack up` generates it") from None
    if not value or not value.isprintable():
        raise CredentialsError(
            f"{path} must hold one line of printable characters; fix it, or delete it to have `up` generate one"
        )
    return value


def secret(home: Path, file: str) -> str:
    """The secret in ``<home>/secrets/<file>``, generated on first use."""
    path = secrets_dir(home) / file
    if not path.exists():
        write_private(path, secrets.token_urlsafe(24))
    return read_secret(path)


def set_secret(home: Path, file: str, value: str) -> None:
    """Replace the secret in ``<home>/secrets/<file>`` (an operator's choice, e.g. the Airflow admin's)."""
    if not value or not value.isprintable():
        raise CredentialsError(f"the secret for {file} must be one line of printable characters")
    write_private(secrets_dir(home) / file, value)


def airflow_internal(home: Path) -> dict[str, str]:
    """Airflow's Fernet key and JWT secret, generated once."""
    path = secrets_dir(home) / AIRFLOW_INTERNAL
    if not path.is_file():
        from cryptography.fernet import Fernet  # Airflow's own dependency

        keys = {"fernet_key": Fernet.generate_key().decode(), "jwt_secret": secrets.token_urlsafe(32)}
        write_private(path, json.dumps(keys))
    return json.loads(read_private(path))


@dataclass(frozen=True, repr=False)  # no repr: a traceback or a log line never shows a secret
class Credentials:
    """Every secret of the stack, one per service (the table in this module's docstring)."""

    postgres_airflow: str
    postgres_celery: str
    postgres_mlflow: str
    redis: str
    redis_tasks: str
    redis_registrar: str
    airflow_admin: str
    mlflow_admin: str
    mlflow_tasks: str
    mlflow_registrar: str
    mlflow_flask_key: str
    s3_admin: str
    s3_tasks: str
    fernet_key: str
    jwt_secret: str

    @classmethod
    def load(cls, home: Path) -> Credentials:
        """The stack's secrets under ``home``, generating those that do not exist yet."""
        found = {field: secret(home, file) for field, file in SECRET_FILES.items()}
        return cls(**found, **airflow_internal(home))
