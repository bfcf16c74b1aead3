"""The pipeline on real distributed services, on one machine: ``python -m deploy.stack up | down | status``.

    PostgreSQL  databases ``airflow`` (Airflow's metadata), ``celery`` (Celery's task results), ``mlflow``
    Redis       the Celery broker (password required)
    SeaweedFS   an S3 object store (deploy/object_store.py), bucket ``agpo``: the workers' as ``agpo-tasks``
    MLflow      tracking server with MLflow's basic-auth app: Postgres backend store, artifacts served from
                <home>/mlflow/artifacts, users in <home>/mlflow/auth.db
    Airflow     API server (UI, REST API, execution API), scheduler, DAG processor, CeleryExecutor,
                ``workers`` Celery workers named worker-1, worker-2, ..., and worker ``registrar``, which
                runs the register step only

PostgreSQL and Redis are Debian's packages (``deploy/install-services.sh`` installs them). Everything
binds to 127.0.0.1 on its own port; data, logs and pids live under ``home`` (``deploy/stack_config.py``), and so
do the DAG runs' outputs (<home>/outputs/runs/<run> for the ads DAG): the stack shares no folder with the runs of
``make demo`` in the checkout's work/.
Each service is started by a module of its own: ``deploy/datastores.py`` (PostgreSQL, Redis),
``deploy/mlflow_server.py``, ``deploy/airflow_services.py``; this one starts them in order, stops them, and
is the command line.

Credentials: each service has its own secret, generated on the first ``up`` into ``<home>/secrets``
(mode 0600; ``deploy/credentials.py`` lists them), so ``up`` needs nothing from the environment. Each
Postgres role owns one database and may connect to no other. ``$AGPO_STACK_ADMIN_PASSWORD``, when set at
``up``, becomes the password of user ``admin`` of the Airflow UI and REST API (else it is generated);
``$AGPO_STACK_DB_PASSWORD``, the shared password of earlier versions, is no longer read. MLflow refuses
anonymous requests; tasks log as MLflow user ``tasks``, not an admin, which may read the registered
model but not change it: only the register step's user ``registrar`` may (``deploy/mlflow_auth.py``).
Workers run task code, so they get only what a worker uses (``airflow_services.worker_env``): the
broker's password, the Celery results role's, and their MLflow user's; not the metadata DB's, the
Fernet key, the JWT secret (with it a task could mint API tokens) nor any admin password. As root, ``up``
runs the workers as OS users of their own (``deploy/isolation.py``), so task code cannot read the secrets
folder, another service's environment nor Postgres as superuser; not as root it can, and ``up`` says so.

``up`` is idempotent: it starts only what is not running, so it also brings a lost worker back. ``down``
stops every service and then checks that no process of the stack is left.

Sizing for a small machine: one task per worker at a time, ``parallelism`` tasks in all, the DAGs' pools a slot
per worker, torch threads split between the workers. Workers share this machine's disk (run folders, task logs), as
workers on several machines would share a volume. A worker that dies is noticed when its task stops heartbeating for
``heartbeat_timeout`` s; Airflow retries the task on a live one 30 s later (a final failure: ``$AGPO_ALERT_WEBHOOK``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from deploy import isolation, mlflow_auth, screenshots, services
from deploy.airflow_api import AirflowError
from deploy.airflow_services import ADMIN, client, start_airflow
from deploy.credentials import SECRET_FILES, Credentials, CredentialsError, read_secret, secrets_dir, set_secret
from deploy.datastores import start_postgres, start_redis
from deploy.mlflow_auth import MlflowAuthError
from deploy.mlflow_server import start_mlflow
from deploy.object_store import start_stack_store
from deploy.services import ServiceError
from deploy.stack_config import ADMIN_PASSWORD, ADS_DAG, DB_PASSWORD, REGISTERED_MODEL, REPO, StackConfig


def up(config: StackConfig, env: Mapping[str, str] | None = None) -> None:
    """Start every service that is not running, then wait until the stack can run DAGs. Secrets not yet in
    <home>/secrets are generated; ``$AGPO_STACK_ADMIN_PASSWORD`` (of ``env``), when set, is the Airflow admin's.
    The workers' OS users and folders are made first (``isolation.prepare``)."""
    env = os.environ if env is None else env
    if env.get(ADMIN_PASSWORD):
        set_secret(config.home, SECRET_FILES["airflow_admin"], env[ADMIN_PASSWORD])
    credentials = Credentials.load(config.home)
    isolation.prepare(config)
    start_postgres(config, credentials)
    start_redis(config, credentials)
    start_stack_store(config, credentials)
    start_mlflow(config, credentials)
    start_airflow(config, credentials)


STOP_SIGNALS = {"postgres": signal.SIGINT}  # Postgres: fast shutdown (SIGTERM waits for clients)


def down(config: StackConfig) -> list[str]:
    """Stop every service (reverse start order); returns the processes still alive after it (should be none)."""
    recorded = {name: services.recorded_pid(config.run_dir, name) for name in config.service_names()}
    for name in reversed(config.service_names()):
        services.stop(config.run_dir, name, STOP_SIGNALS.get(name, signal.SIGTERM))
    return [f"{name}: pid {pid}" for name, sid in recorded.items() if sid for pid in services.session_processes(sid)]


def status(config: StackConfig) -> dict[str, bool]:
    return {name: services.is_running(config.run_dir, name) for name in config.service_names()}


def kill_worker(config: StackConfig, name: str) -> list[int]:
    """SIGKILL worker ``name`` and every process it started (its Celery pool and task processes)."""
    if name not in config.worker_names():
        raise ServiceError(f"no worker {name!r}; this stack has {config.worker_names()}")
    return services.kill(config.run_dir, name)


def take_screenshots(config: StackConfig, run_id: str, compare: list[str], out: Path) -> list[screenshots.Shot]:
    """The graph of DAG run ``run_id`` in Airflow, the teacher (``train``) runs of two pipeline runs side by
    side in MLflow, and the newest registered student version with its model card."""
    out.mkdir(parents=True, exist_ok=True)
    graph = screenshots.airflow_run_graph(
        config.airflow_url,
        client(config).token,
        ADS_DAG,
        run_id,
        out / "stack-airflow-run-graph.png",
        [ADS_DAG, "annotate_shard"],
    )
    mlflow_user = (mlflow_auth.ADMIN, read_secret(secrets_dir(config.home) / SECRET_FILES["mlflow_admin"]))
    experiment_id, run_ids = screenshots.stage_runs(
        config.mlflow_url, mlflow_user, ADS_DAG, [f"{ADS_DAG}/{n}" for n in compare], "train"
    )
    teachers = screenshots.mlflow_compare(
        config.mlflow_url,
        mlflow_user,
        experiment_id,
        run_ids,
        out / "stack-mlflow-compare-teachers.png",
        ["trainer.algorithm"],
    )
    card = screenshots.mlflow_model_card(
        config.mlflow_url, mlflow_user, REGISTERED_MODEL, out / "stack-mlflow-student-card.png", ["3 exact"]
    )
    return [graph, teachers, card]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack", description=__doc__.split("\n\n")[0])
    defaults = StackConfig()
    parser.add_argument("--home", type=Path, default=defaults.home, help="data, logs and pids (default: work/stack)")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="Celery workers (default: 2)")
    for port in ("postgres_port", "redis_port", "s3_port", "mlflow_port", "airflow_port"):
        parser.add_argument(f"--{port.replace('_', '-')}", type=int, default=getattr(defaults, port))
    parser.add_argument(
        "--ads-schedule", default="", help="the ads DAG's schedule here, e.g. @weekly; '': triggered only"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="start what is not running and wait until DAGs can run")
    commands.add_parser("down", help="stop everything; fails if a process is left")
    commands.add_parser("status", help="which services run")
    trigger = commands.add_parser("trigger", help="trigger the ads DAG through the REST API and wait for it")
    trigger.add_argument("--conf", default="{}", help="DAG run conf (JSON): the DAG's params")
    trigger.add_argument("--run-id", default=None, help="Airflow run id; default: Airflow's")
    trigger.add_argument("--timeout", type=float, default=3600)
    shots = commands.add_parser("screenshots", help="PNGs of a DAG run's graph and of two teacher runs compared")
    shots.add_argument("--run-id", required=True, help="the Airflow run whose graph to show")
    shots.add_argument("--compare", nargs=2, required=True, metavar="RUN_NAME", help="two pipeline run names")
    shots.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    kill = commands.add_parser("kill-worker", help="SIGKILL a worker and its task processes (a lost machine)")
    kill.add_argument("name")
    args = parser.parse_args(argv)
    config = StackConfig(
        home=args.home.resolve(),
        workers=args.workers,
        postgres_port=args.postgres_port,
        redis_port=args.redis_port,
        s3_port=args.s3_port,
        mlflow_port=args.mlflow_port,
        airflow_port=args.airflow_port,
        ads_schedule=args.ads_schedule,
    )
    try:
        return _command(args, config)
    except (ServiceError, AirflowError, CredentialsError, MlflowAuthError, TimeoutError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _command(args: argparse.Namespace, config: StackConfig) -> int:
    if args.command == "up":
        if os.environ.get(DB_PASSWORD):
            print(f"note: {DB_PASSWORD} is no longer read: each service has its own password", file=sys.stderr)
        up(config)
        keys = secrets_dir(config.home)
        print(
            f"stack up ({config.workers} workers); state and logs in {config.home}, secrets in {keys} (0600)\n"
            f"  DAG runs write in {config.output_root} (the ads DAG's: runs/<run>, math-runs/, scoring/)\n"
            f"  Airflow UI and REST API: {config.airflow_url} (user {ADMIN}, password: {keys}/airflow-admin.password)\n"
            f"  MLflow UI: {config.mlflow_url} (user {mlflow_auth.ADMIN}, password: {keys}/mlflow-admin.password)\n"
            f"  log to it as the tasks do: MLFLOW_TRACKING_URI={config.mlflow_url} MLFLOW_TRACKING_USERNAME="
            f"{mlflow_auth.TASKS} MLFLOW_TRACKING_PASSWORD=$(cat {keys}/mlflow-tasks.password)\n"
            f"  stop it: python -m deploy.stack down"
        )
        if isolation.isolated():
            print(f"isolation: {isolation.claim(config)}")
        else:
            print(f"warning: {isolation.claim(config)}", file=sys.stderr)
    elif args.command == "down":
        left = down(config)
        if left:
            print(f"error: processes left after down: {left}", file=sys.stderr)
            return 1
        print(f"stack down; no process left (state kept in {config.home})")
    elif args.command == "status":
        for name, running in status(config).items():
            print(f"{name:24} {'running' if running else 'stopped'}")
    elif args.command == "trigger":
        api = client(config)
        conf = json.loads(args.conf)
        run_id = api.trigger(ADS_DAG, conf, args.run_id)
        print(f"triggered {ADS_DAG} run {run_id}; follow it at {config.airflow_url}/dags/{ADS_DAG}/runs/{run_id}")
        state = api.wait_for_run(ADS_DAG, run_id, args.timeout)
        print(api.format_task_table(ADS_DAG, run_id))
        # the DAG names the run's folder after run_name, else after the Airflow run id made safe
        runs = config.output_root / "runs"
        print(f"run {run_id}: {state}; outputs: {runs / conf['run_name'] if conf.get('run_name') else runs}/")
        model = conf.get("registered_model") or REGISTERED_MODEL  # the DAG's param, else its default
        print(f"MLflow: {config.mlflow_url} (the champion: models:/{model}@champion)")
        return 0 if state == "success" else 1
    elif args.command == "screenshots":
        for shot in take_screenshots(config, args.run_id, args.compare, args.out):
            print(f"wrote {shot.path}")
    elif args.command == "kill-worker":
        print(f"killed {args.name}: pids {kill_worker(config, args.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
