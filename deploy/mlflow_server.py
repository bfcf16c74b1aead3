"""The stack's MLflow tracking server: MLflow's basic-auth app in front of a Postgres backend store.

Started once (``mlflow server``, one worker, on 127.0.0.1): runs and models in the Postgres database
``mlflow``, artifacts served by the server itself from <home>/mlflow/artifacts, users and permissions in
<home>/mlflow/auth.db (``deploy/mlflow_auth.py`` writes the 0600 config that names it). The admin password,
the backend's and the Flask key reach it through that file and its environment, never its command line. No
MLflow server jobs run. Every start, running or not, then makes sure of the non-admin users ``tasks`` and
``registrar``, of the stack's registered model and of what each user may do (``mlflow_auth.grants``).
"""

from __future__ import annotations

from deploy import mlflow_auth, services
from deploy.airflow_api import health
from deploy.credentials import Credentials, secrets_dir, write_private
from deploy.datastores import database_uri
from deploy.services import Service
from deploy.stack_config import BIN, REGISTERED_MODEL, REGISTRY_EXPERIMENTS, StackConfig, base_env


def start_mlflow(config: StackConfig, credentials: Credentials, backend_store_uri: str | None = None) -> None:
    """The tracking server with MLflow's basic-auth app, then its non-admin users ``tasks`` and ``registrar``
    (created, or their passwords reset to those in <home>/secrets), and the stack's registered model, which
    ``tasks`` may only read. ``backend_store_uri``: default, the Postgres db mlflow."""
    if not services.is_running(config.run_dir, "mlflow"):
        artifacts = config.home / "mlflow" / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        auth_config = secrets_dir(config.home) / "mlflow-auth.ini"  # holds the admin password: 0600
        users = config.home / "mlflow" / "auth.db"
        write_private(auth_config, mlflow_auth.config_text(users, credentials.mlflow_admin))
        env = {
            **base_env(),
            "MLFLOW_BACKEND_STORE_URI": backend_store_uri
            or database_uri(config, "mlflow", credentials.postgres_mlflow),
            "MLFLOW_AUTH_CONFIG_PATH": str(auth_config),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": credentials.mlflow_flask_key,
            "MLFLOW_DISABLE_TELEMETRY": "true",
            # no MLflow server jobs (GenAI optimisation, scorers): else 7 polling job processes on 2 cores
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
        }
        argv = [
            str(BIN / "mlflow"),
            "server",
            "--app-name",
            mlflow_auth.APP,
            "--host",
            "127.0.0.1",
            "--port",
            str(config.mlflow_port),
            "--workers",
            "1",
            "--serve-artifacts",
            "--artifacts-destination",
            artifacts.as_uri(),
        ]
        services.start(Service("mlflow", argv, env), config.run_dir)
        services.wait_until(
            lambda: health(f"{config.mlflow_url}/health") is not None, "serving /health", 180, config.run_dir, "mlflow"
        )
    admin = credentials.mlflow_admin
    mlflow_auth.ensure_user(config.mlflow_url, admin, mlflow_auth.TASKS, credentials.mlflow_tasks)
    mlflow_auth.ensure_user(config.mlflow_url, admin, mlflow_auth.REGISTRAR, credentials.mlflow_registrar)
    mlflow_auth.ensure_registered_model(config.mlflow_url, admin, REGISTERED_MODEL)
    for username, wanted in mlflow_auth.grants(REGISTERED_MODEL).items():
        mlflow_auth.ensure_grants(config.mlflow_url, admin, username, wanted)
    mlflow_auth.ensure_experiment_access(config.mlflow_url, admin, REGISTRY_EXPERIMENTS)
