"""The pipeline on real distributed services, on one machine: ``python -m deploy.stack up | down | status``.

    PostgreSQL  databases ``airflow`` (Airflow's metadata), ``celery`` (Celery's task results), ``mlflow``
    Redis       the Celery broker (password required)
    MLflow      tracking server with MLflow's basic-auth app: Postgres backend store, artifacts served from
                <home>/mlflow/artifacts, users in <home>/mlflow/auth.db
    Airflow     API server (UI, REST API, execution API), scheduler, DAG processor, CeleryExecutor,
                and ``workers`` Celery workers named worker-1, worker-2, ...

PostgreSQL and Redis are Debian's packages (``deploy/install-services.sh`` installs them). Everything
binds to 127.0.0.1 on its own port; data, logs and pids live under ``home``.

Credentials: each service has its own secret, generated on the first ``up`` into ``<home>/secrets``
(mode 0600; ``deploy/credentials.py`` lists them), so ``up`` needs nothing from the environment. Each
Postgres role owns one database and may connect to no other. ``$AGPO_STACK_ADMIN_PASSWORD``, when set at
``up``, becomes the password of user ``admin`` of the Airflow UI and REST API (else it is generated);
``$AGPO_STACK_DB_PASSWORD``, the shared password of earlier versions, is no longer read. MLflow refuses
anonymous requests; tasks log as MLflow user ``tasks``, not an admin (``deploy/mlflow_auth.py``).
Workers run task code, so they get only what a worker uses (``worker_env``): the broker's password, the
Celery results role's, and the MLflow task user's; not the metadata DB's, the Fernet key, the JWT secret
(with it a task could mint API tokens) nor any admin password.

``up`` is idempotent: it starts only what is not running, so it also brings a lost worker back. ``down``
stops every service and then checks that no process of the stack is left.

Sizing for a small machine: one task per worker at a time, ``parallelism`` tasks in all, and torch
threads split between the workers. Workers share this machine's file system (run folders, task logs),
as workers on several machines would share a volume. A worker that dies is noticed when its task
stops heartbeating for ``heartbeat_timeout`` seconds; Airflow then retries the task on a live worker.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from deploy import mlflow_auth, screenshots, services
from deploy.airflow_api import AirflowClient, AirflowError, health
from deploy.credentials import (
    SECRET_FILES,
    Credentials,
    CredentialsError,
    read_secret,
    secrets_dir,
    set_secret,
    write_private,
)
from deploy.mlflow_auth import MlflowAuthError
from deploy.services import Service, ServiceError

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # airflow and mlflow of this venv
ADS_DAG = "ads_relevance_agpo"
DB_PASSWORD, ADMIN_PASSWORD = "AGPO_STACK_DB_PASSWORD", "AGPO_STACK_ADMIN_PASSWORD"
ADMIN = "admin"
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
)
# Airflow settings that only the API server, scheduler and DAG processor use; workers, which run task code,
# get none (with the JWT secret a task could mint API tokens; with the metadata DB's URL, rewrite any run)
SERVER_ONLY = (
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
)


@dataclass(frozen=True)
class StackConfig:
    """Where the stack keeps its state, its ports and its size."""

    home: Path = REPO / "work" / "stack"
    workers: int = 2
    postgres_port: int = 55432
    redis_port: int = 56379
    mlflow_port: int = 5050
    airflow_port: int = 8090
    parallelism: int = 4
    heartbeat_timeout: int = 60
    ads_schedule: str = ""  # the ads DAG's schedule on this stack; "": triggered only (no weekly run)

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def airflow_url(self) -> str:
        return f"http://127.0.0.1:{self.airflow_port}"

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    def worker_names(self) -> list[str]:
        return [f"worker-{i}" for i in range(1, self.workers + 1)]

    def service_names(self) -> list[str]:
        """In start order; ``down`` stops them in reverse."""
        return [
            "postgres",
            "redis",
            "mlflow",
            "airflow-api-server",
            "airflow-scheduler",
            "airflow-dag-processor",
            *self.worker_names(),
        ]


def base_env() -> dict[str, str]:
    """This environment without an operator's credentials (services get only what each one needs)."""
    return {k: v for k, v in os.environ.items() if k not in OPERATOR_CREDENTIALS}


# --- PostgreSQL -------------------------------------------------------------------------------------


def postgres_bin() -> Path:
    """The newest Debian PostgreSQL server binaries (/usr/lib/postgresql/<version>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise ServiceError("PostgreSQL is not installed: run deploy/install-services.sh (Debian packages)")
    return found[-1].parent


def postgres_user() -> str | None:
    """Postgres refuses to run as root: then it runs as Debian's ``postgres`` user."""
    return "postgres" if os.geteuid() == 0 else None


def start_postgres(config: StackConfig, credentials: Credentials) -> None:
    data, sockets = config.home / "postgres" / "data", config.home / "postgres" / "run"
    user = postgres_user()
    if not (data / "PG_VERSION").is_file():
        for folder in (data, sockets):
            folder.mkdir(parents=True, exist_ok=True)
            if user:
                shutil.chown(folder, user, user)
        initdb = [
            str(postgres_bin() / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--no-locale",
            "-E",
            "UTF8",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ]
        done = subprocess.run(initdb, capture_output=True, text=True, user=user, group=user, check=False)
        if done.returncode:
            raise ServiceError(
                f"initdb failed in {data}: {done.stderr.strip()[-800:]}\n(as root the data folder's parents must "
                "be traversable by user postgres: chmod o+x them or choose --home elsewhere)"
            )
    if not services.is_running(config.run_dir, "postgres"):
        sockets.chmod(0o700)  # local connections are trusted: only the owner (and root) may reach the socket
        argv = [
            str(postgres_bin() / "postgres"),
            "-D",
            str(data),
            "-p",
            str(config.postgres_port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"unix_socket_directories={sockets}",
            "-c",
            "unix_socket_permissions=0700",
            "-c",
            "max_connections=200",
        ]
        services.start(Service("postgres", argv, base_env(), user=user), config.run_dir)
    services.wait_until(
        lambda: _postgres_accepts(sockets, config.postgres_port),
        "accepting connections",
        60,
        config.run_dir,
        "postgres",
    )
    roles = {"airflow": credentials.postgres_airflow, "celery": credentials.postgres_celery}
    _ensure_databases(sockets, config.postgres_port, {**roles, "mlflow": credentials.postgres_mlflow})


def _postgres_accepts(sockets: Path, port: int) -> bool:
    import psycopg2

    try:
        psycopg2.connect(host=str(sockets), port=port, user="postgres", dbname="postgres").close()
    except psycopg2.OperationalError:
        return False
    return True


def _ensure_databases(sockets: Path, port: int, passwords: dict[str, str]) -> None:
    """One role per database (``passwords``: role -> its password), each owning its database, which no other
    role may connect to (PUBLIC's default CONNECT and TEMP are revoked)."""
    import psycopg2
    from psycopg2 import sql

    connection = psycopg2.connect(host=str(sockets), port=port, user="postgres", dbname="postgres")
    connection.autocommit = True  # CREATE DATABASE cannot run in a transaction (nor in `with connection`)
    try:
        cursor = connection.cursor()
        for name, password in passwords.items():
            role = sql.Identifier(name)
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
            verb = "ALTER" if cursor.fetchone() else "CREATE"
            cursor.execute(sql.SQL(verb + " ROLE {} LOGIN PASSWORD %s").format(role), (password,))
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if not cursor.fetchone():
                cursor.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(role, role))
            cursor.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(role))
    finally:
        connection.close()


def database_uri(config: StackConfig, role: str, password: str) -> str:
    """SQLAlchemy's URL of database ``role`` as role ``role`` (the password percent-encoded)."""
    return f"postgresql+psycopg2://{role}:{quote(password, safe='')}@127.0.0.1:{config.postgres_port}/{role}"


# --- Redis and MLflow -------------------------------------------------------------------------------


def start_redis(config: StackConfig, credentials: Credentials) -> None:
    if services.is_running(config.run_dir, "redis"):
        return
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("Redis is not installed: run deploy/install-services.sh (Debian package redis-server)")
    folder = config.home / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    conf = secrets_dir(config.home) / "redis.conf"  # holds the password: 0600, not on the command line
    password = credentials.redis.replace("\\", "\\\\").replace('"', '\\"')
    write_private(
        conf,
        f'bind 127.0.0.1\nport {config.redis_port}\nprotected-mode yes\nrequirepass "{password}"\n'
        f'dir "{folder}"\nsave ""\nappendonly no\ndaemonize no\n',
    )
    services.start(Service("redis", [server, str(conf)], base_env()), config.run_dir)
    services.wait_until(lambda: services.port_open(config.redis_port), "listening", 30, config.run_dir, "redis")


def broker_url(config: StackConfig, credentials: Credentials) -> str:
    return f"redis://:{quote(credentials.redis, safe='')}@127.0.0.1:{config.redis_port}/0"


def start_mlflow(config: StackConfig, credentials: Credentials, backend_store_uri: str | None = None) -> None:
    """The tracking server with MLflow's basic-auth app, then its non-admin user ``tasks`` (created, or its
    password reset to the one in <home>/secrets). ``backend_store_uri``: default, the Postgres db mlflow."""
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
    mlflow_auth.ensure_user(config.mlflow_url, credentials.mlflow_admin, mlflow_auth.TASKS, credentials.mlflow_tasks)


# --- Airflow ----------------------------------------------------------------------------------------


def airflow_env(config: StackConfig, credentials: Credentials) -> dict[str, str]:
    """The settings every Airflow process of the stack shares (each a real Airflow config key); workers get
    them less ``SERVER_ONLY`` (``worker_env``)."""
    home = config.home / "airflow"
    return {
        **base_env(),
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": str(REPO),  # deploy.worker_identity and the project, in task processes too
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(config.parallelism),
        "AIRFLOW__CORE__FERNET_KEY": credentials.fernet_key,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(secrets_dir(config.home) / "airflow-users.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.airflow_url}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_uri(config, "airflow", credentials.postgres_airflow),
        "AIRFLOW__CELERY__BROKER_URL": broker_url(config, credentials),
        # Celery's results in a database of their own: workers store results without the metadata DB's password
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database_uri(config, "celery", credentials.postgres_celery),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(config.airflow_port),
        "AIRFLOW__API__BASE_URL": config.airflow_url,
        "AIRFLOW__API_AUTH__JWT_SECRET": credentials.jwt_secret,
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(config.heartbeat_timeout),
        "AGPO_ADS_SCHEDULE": config.ads_schedule,
        # what the tasks need: the shared tracking server (its user: worker_env), no model hub
        "MLFLOW_TRACKING_URI": config.mlflow_url,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def worker_env(config: StackConfig, env: dict[str, str], name: str, credentials: Credentials) -> dict[str, str]:
    """A worker's settings: ``env`` less the server-only keys and any operator credential, plus its name,
    its share of the cores, and MLflow's task user. A worker keeps two secrets because it uses them: the
    broker URL's Redis password (it takes its tasks from there) and Celery's results role (it writes each
    task's result there); task code can read both (README, deployment)."""
    threads = max(1, len(os.sched_getaffinity(0)) // config.workers)
    withheld = (*SERVER_ONLY, *OPERATOR_CREDENTIALS)
    return {
        **{key: value for key, value in env.items() if key not in withheld},
        "AGPO_WORKER_NAME": name,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "deploy.worker_identity.hostname",
        "OMP_NUM_THREADS": str(threads),
        "MLFLOW_TRACKING_USERNAME": mlflow_auth.TASKS,
        "MLFLOW_TRACKING_PASSWORD": credentials.mlflow_tasks,
    }


def start_airflow(config: StackConfig, credentials: Credentials) -> None:
    env = airflow_env(config, credentials)
    # Airflow's simple auth manager reads this file at each login
    write_private(secrets_dir(config.home) / "airflow-users.json", json.dumps({ADMIN: credentials.airflow_admin}))
    run = config.run_dir
    migrate_log = services.log_file(run, "airflow-db-migrate")
    migrate_log.parent.mkdir(parents=True, exist_ok=True)
    with open(migrate_log, "ab") as out:  # idempotent: a no-op on an up-to-date database
        done = subprocess.run(
            [str(BIN / "airflow"), "db", "migrate"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            check=False,
            timeout=600,
        )
    if done.returncode:
        raise ServiceError(
            f"airflow db migrate failed; the end of {migrate_log}:\n{services.tail_log(run, 'airflow-db-migrate')}"
        )
    airflow = str(BIN / "airflow")
    commands = {
        "airflow-api-server": [
            airflow,
            "api-server",
            "--host",
            "127.0.0.1",
            "--port",
            str(config.airflow_port),
            "--workers",
            "1",
        ],
        "airflow-scheduler": [airflow, "scheduler"],
        "airflow-dag-processor": [airflow, "dag-processor"],
    }
    for name in config.worker_names():  # task logs are on the shared disk: no per-worker log server
        commands[name] = [
            airflow,
            "celery",
            "worker",
            "--celery-hostname",
            name,
            "--concurrency",
            "1",
            "--skip-serve-logs",
            "--pid",
            str(run / "pids" / f"{name}.celery.pid"),
        ]
    log_starts = {}  # where each started worker's output begins in its (appended) log
    for name, argv in commands.items():
        if not services.is_running(run, name):
            log_starts[name] = services.log_size(run, name)
            service_env = worker_env(config, env, name, credentials) if name.startswith("worker-") else env
            services.start(Service(name, argv, service_env, cwd=REPO), run)
    wait_ready(config, log_starts)


def wait_ready(config: StackConfig, log_starts: dict[str, int]) -> None:
    """Until the API answers, scheduler and DAG processor report healthy, the ads DAG is parsed and every
    worker has joined the broker (a restarted worker: said so in this start's part of its log)."""
    run = config.run_dir

    def healthy(component: str) -> bool:
        report = health(f"{config.airflow_url}/api/v2/monitor/health")
        return bool(report) and report.get(component, {}).get("status") == "healthy"

    services.wait_until(
        lambda: health(f"{config.airflow_url}/api/v2/monitor/health") is not None,
        "serving the API",
        240,
        run,
        "airflow-api-server",
    )
    services.wait_until(lambda: healthy("scheduler"), "a healthy scheduler", 240, run, "airflow-scheduler")
    services.wait_until(lambda: healthy("dag_processor"), "a healthy DAG processor", 240, run, "airflow-dag-processor")
    api = client(config)
    services.wait_until(lambda: api.dag_exists(ADS_DAG), f"DAG {ADS_DAG} parsed", 300, run, "airflow-dag-processor")
    for name in config.worker_names():
        joined = f"celery@{name} ready."
        services.wait_until(
            lambda name=name, joined=joined: joined in services.read_log(run, name, log_starts.get(name, 0)),
            "ready",
            240,
            run,
            name,
        )


# --- the stack --------------------------------------------------------------------------------------


def up(config: StackConfig, env: Mapping[str, str] | None = None) -> None:
    """Start every service that is not running, then wait until the stack can run DAGs. Secrets not yet in
    <home>/secrets are generated; ``$AGPO_STACK_ADMIN_PASSWORD`` (of ``env``), when set, is the Airflow admin's."""
    env = os.environ if env is None else env
    if env.get(ADMIN_PASSWORD):
        set_secret(config.home, SECRET_FILES["airflow_admin"], env[ADMIN_PASSWORD])
    credentials = Credentials.load(config.home)
    start_postgres(config, credentials)
    start_redis(config, credentials)
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
    """The graph of DAG run ``run_id`` in Airflow, and the teacher (``train``) runs of two pipeline runs
    side by side in MLflow."""
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
    return [graph, teachers]


def client(config: StackConfig) -> AirflowClient:
    """The stack's REST API as its admin (the password in <home>/secrets/airflow-admin.password)."""
    password = read_secret(secrets_dir(config.home) / SECRET_FILES["airflow_admin"])
    return AirflowClient(config.airflow_url, ADMIN, password)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.stack", description=__doc__.split("\n\n")[0])
    defaults = StackConfig()
    parser.add_argument("--home", type=Path, default=defaults.home, help="data, logs and pids (default: work/stack)")
    parser.add_argument("--workers", type=int, default=defaults.workers, help="Celery workers (default: 2)")
    for port in ("postgres_port", "redis_port", "mlflow_port", "airflow_port"):
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
            f"  Airflow UI and REST API: {config.airflow_url} (user {ADMIN}, password: {keys}/airflow-admin.password)\n"
            f"  MLflow UI: {config.mlflow_url} (user {mlflow_auth.ADMIN}, password: {keys}/mlflow-admin.password)\n"
            f"  log to it as the tasks do: MLFLOW_TRACKING_URI={config.mlflow_url} MLFLOW_TRACKING_USERNAME="
            f"{mlflow_auth.TASKS} MLFLOW_TRACKING_PASSWORD=$(cat {keys}/mlflow-tasks.password)\n"
            f"  stop it: python -m deploy.stack down"
        )
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
        run_id = api.trigger(ADS_DAG, json.loads(args.conf), args.run_id)
        print(f"triggered {ADS_DAG} run {run_id}; follow it at {config.airflow_url}/dags/{ADS_DAG}/runs/{run_id}")
        state = api.wait_for_run(ADS_DAG, run_id, args.timeout)
        print(api.format_task_table(ADS_DAG, run_id))
        print(f"run {run_id}: {state}; MLflow: {config.mlflow_url}")
        return 0 if state == "success" else 1
    elif args.command == "screenshots":
        for shot in take_screenshots(config, args.run_id, args.compare, args.out):
            print(f"wrote {shot.path}")
    elif args.command == "kill-worker":
        print(f"killed {args.name}: pids {kill_worker(config, args.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
