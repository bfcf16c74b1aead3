"""What every part of the stack shares: where it lives (``StackConfig``) and the environment its services start from.

``StackConfig`` holds the stack's home (data, logs, pids and secrets), its ports on 127.0.0.1, its size and
which Celery queues each worker takes: the DAGs send teacher, RL, annotation and student tasks to
``accelerator_queue`` and the rest to ``cpu_queue``; a worker named in ``accelerator_workers`` (all of them
when it is None) takes both, any other only ``cpu_queue``. One more worker, ``REGISTRAR``, takes only
``register_queue``, where the stack's Airflow policy sends the register step (deploy/airflow_settings).
``base_env`` is this process's environment less ``OPERATOR_CREDENTIALS``: the credentials an operator's
shell may hold reach no service, each of which gets its own secret from <home>/secrets instead.

The stack's DAG runs write under ``output_root`` (<home>/outputs), which every Airflow process gets as
``OUTPUT_ROOT_ENV``: the ads DAG's runs in its ``runs/``, the math DAG's in ``math-runs/``, the scoring DAG's in
``scoring/`` (``OUTPUT_FOLDERS``), never in the checkout's own work/runs, where ``make demo`` runs as the
checkout's owner and the workers' users may not write.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # airflow and mlflow of this venv
ADS_DAG = "ads_relevance_agpo"
REGISTERED_MODEL = "ads-relevance-student"  # the registry name the ads DAG registers its students under (tracking)
# and its teacher under <REGISTERED_MODEL>-teacher: both made by admin, changed by REGISTRAR only (mlflow_auth.grants)
# where the register step logs the registered versions' files (pipelines.tracking.registry_experiment_name of the
# ads DAG's experiment): created by admin at `up`, written by registrar only
REGISTRY_EXPERIMENTS = ("ads_relevance_agpo-registry",)
DB_PASSWORD, ADMIN_PASSWORD = "AGPO_STACK_DB_PASSWORD", "AGPO_STACK_ADMIN_PASSWORD"
REGISTRAR = "registrar"  # the Celery worker that runs the register step, and only it
# where a worker's DAG runs write (pipelines.steps reads it; default: work), and the three folders the DAGs make
# in it (the ads, math and scoring DAGs')
OUTPUT_ROOT_ENV = "AGPO_OUTPUT_ROOT"
OUTPUT_FOLDERS = ("runs", "math-runs", "scoring")
# the folder of the registration lock (pipelines.ads.serving.registry reads it): the register worker's own
REGISTRY_LOCK_ENV = "AGPO_REGISTRY_LOCK_DIR"
# credentials an operator's shell may hold: no service inherits them (each has its own from <home>/secrets)
OPERATOR_CREDENTIALS = (
    DB_PASSWORD,
    ADMIN_PASSWORD,
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_AUTH_ADMIN_USERNAME",
    "MLFLOW_AUTH_ADMIN_PASSWORD",
    "MLFLOW_AUTH_CONFIG_PATH",
    "MLFLOW_FLASK_SERVER_SECRET_KEY",
    "AWS_ACCESS_KEY_ID",  # an operator's cloud identity: the workers get the stack's object store's instead
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)
OBJECT_STORE = "weed"  # the object store's service name (deploy/object_store.py)


@dataclass(frozen=True)
class StackConfig:
    """Where the stack keeps its state, its ports and its size."""

    home: Path = REPO / "work" / "stack"
    workers: int = 2
    postgres_port: int = 55432
    redis_port: int = 56379
    mlflow_port: int = 5050
    airflow_port: int = 8090
    s3_port: int = 58333  # the object store's S3 gateway; its other ports are free ones chosen at each start
    bucket: str = "agpo"  # the stack's bucket: the workers' identity may read, write and list it, nothing else
    parallelism: int = 4
    heartbeat_timeout: int = 60
    ads_schedule: str = ""  # the ads DAG's schedule on this stack; "": triggered only (no weekly run)
    accelerator_queue: str = "accelerator"  # the DAGs' AGPO_ACCELERATOR_QUEUE
    cpu_queue: str = "default"  # the DAGs' AGPO_CPU_QUEUE and Airflow's default queue
    register_queue: str = "register"  # the register step's (deploy/airflow_settings), taken by REGISTRAR only
    # the workers that take accelerator tasks (GPU hosts); None: every worker, as on this one CPU machine,
    # so that a lost worker's training or shard is retried on another
    accelerator_workers: tuple[str, ...] | None = None

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.airflow_port}"

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def output_root(self) -> Path:
        """Where the stack's DAG runs write (``OUTPUT_ROOT_ENV``): the stack's own, not the checkout's work/."""
        return self.home / "outputs"

    @property
    def task_log_folder(self) -> Path:
        """Airflow's task logs: written by the workers, read by the API server (nothing else in it)."""
        return self.home / "task-logs"

    def worker_names(self) -> list[str]:
        """The workers that run the DAGs' tasks (``REGISTRAR`` not among them)."""
        return [f"worker-{i}" for i in range(1, self.workers + 1)]

    def worker_queues(self, name: str) -> list[str]:
        """The Celery queues worker ``name`` takes tasks from."""
        if name == REGISTRAR:
            return [self.register_queue]
        accelerator = self.accelerator_workers is None or name in self.accelerator_workers
        return [self.accelerator_queue, self.cpu_queue] if accelerator else [self.cpu_queue]

    def service_names(self) -> list[str]:
        """In start order; ``down`` stops them in reverse."""
        return [
            "postgres",
            "redis",
            OBJECT_STORE,
            "mlflow",
            "airflow-api-server",
            "airflow-scheduler",
            "airflow-dag-processor",
            *self.worker_names(),
            REGISTRAR,
        ]


def base_env() -> dict[str, str]:
    """This environment without an operator's credentials (services get only what each one needs)."""
    return {k: v for k, v in os.environ.items() if k not in OPERATOR_CREDENTIALS}
