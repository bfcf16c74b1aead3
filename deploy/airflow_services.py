"""The stack's Airflow: API server, scheduler, DAG processor and the Celery workers, their settings and readiness.

Every Airflow process gets ``airflow_env``: real Airflow config keys, the CeleryExecutor with Redis as broker
and Celery's results in Postgres database ``celery``, Airflow's metadata in database ``airflow``, the API on
127.0.0.1, the task logs in a folder of their own, and the stack's cluster policy on the Python path
(deploy/airflow_settings: the register step goes to ``register_queue``). A worker runs task code, so it gets
that less ``SERVER_ONLY`` and any operator credential, plus its name (recorded as the task's hostname by
``deploy/worker_identity.py``), its share of the cores, an Airflow home of its role's own and its MLflow user
(``worker_env``): ``tasks`` for worker-1, worker-2, ..., ``registrar`` for the register worker, which also gets
the folder of the registration lock, a folder of its own. Every process writes DAG runs under the stack's output
root (``StackConfig.output_root``), not the checkout's work/. As root the workers run as the OS users of
deploy/isolation.py. Each worker runs one task at a time from its Celery queues
(``StackConfig.worker_queues``: the DAGs put accelerator work on one queue, the rest on Airflow's default;
the register worker takes only the register queue) and serves no logs (they are on the shared disk).
``start_airflow`` migrates the metadata DB, creates the DAGs' pools (``create_pools``: those
``dags/agpo_operations.py`` prints, sized to the workers), starts what is not running and returns once the stack
can run the ads DAG (``wait_ready``). ``client`` is the REST API as the Airflow user ``admin``.
"""

from __future__ import annotations

import json
import os
import subprocess

from deploy import isolation, mlflow_auth, object_store, services
from deploy.airflow_api import AirflowClient, health
from deploy.credentials import SECRET_FILES, Credentials, read_secret, secrets_dir, write_private
from deploy.datastores import broker_url, database_uri, unacked_keys
from deploy.services import Service, ServiceError
from deploy.stack_config import (
    ADS_DAG,
    BIN,
    OPERATOR_CREDENTIALS,
    OUTPUT_ROOT_ENV,
    REGISTRAR,
    REGISTRY_LOCK_ENV,
    REPO,
    StackConfig,
    base_env,
)

ADMIN = "admin"
POLICY = REPO / "deploy" / "airflow_settings"  # airflow_local_settings.py: the stack's cluster policy
# Airflow settings that only the API server, scheduler and DAG processor use; workers, which run task code,
# get none (with the JWT secret a task could mint API tokens; with the metadata DB's URL, rewrite any run)
SERVER_ONLY = (
    "AIRFLOW__API_AUTH__JWT_SECRET",
    "AIRFLOW__CORE__FERNET_KEY",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
)


def airflow_env(config: StackConfig, credentials: Credentials) -> dict[str, str]:
    """The settings every Airflow process of the stack shares (each a real Airflow config key); workers get
    them less ``SERVER_ONLY`` (``worker_env``)."""
    home = config.home / "airflow"
    return {
        **base_env(),
        "AIRFLOW_HOME": str(home),
        # deploy.worker_identity and the project, in task processes too; the cluster policy
        "PYTHONPATH": os.pathsep.join([str(REPO), str(POLICY)]),
        "AGPO_REGISTER_QUEUE": config.register_queue,
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(config.task_log_folder),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(config.parallelism),
        "AIRFLOW__CORE__FERNET_KEY": credentials.fernet_key,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(secrets_dir(config.home) / "airflow-users.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{config.airflow_url}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_uri(config, "airflow", credentials.postgres_airflow),
        "AIRFLOW__CELERY__BROKER_URL": broker_url(config, credentials),  # the scheduler's: workers get their own
        # no remote control: its broadcast channel would let a task command the register worker (shut it down, or
        # make it consume another queue); mingle and gossip, which use it, are off too (worker_command)
        "AIRFLOW__CELERY__WORKER_ENABLE_REMOTE_CONTROL": "False",
        # Celery's results in a database of their own: workers store results without the metadata DB's password
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + database_uri(config, "celery", credentials.postgres_celery),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(config.airflow_port),
        "AIRFLOW__API__BASE_URL": config.airflow_url,
        "AIRFLOW__API_AUTH__JWT_SECRET": credentials.jwt_secret,
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(config.heartbeat_timeout),
        "AGPO_ADS_SCHEDULE": config.ads_schedule,
        # the DAGs' queues (read when a DAG file is parsed) and the queue of a task that names none
        "AGPO_ACCELERATOR_QUEUE": config.accelerator_queue,
        "AGPO_CPU_QUEUE": config.cpu_queue,
        "AIRFLOW__OPERATORS__DEFAULT_QUEUE": config.cpu_queue,
        # the DAGs' pools (dags/agpo_operations.py), as many slots as workers unless the operator sets them; a lost
        # worker's accelerator task is retried after 30 s, not a GPU fleet's 5 min: the other worker is right here
        "AGPO_ACCELERATOR_POOL_SLOTS": os.environ.get("AGPO_ACCELERATOR_POOL_SLOTS", str(config.workers)),
        "AGPO_ANNOTATION_POOL_SLOTS": os.environ.get("AGPO_ANNOTATION_POOL_SLOTS", str(config.workers)),
        "AGPO_ACCELERATOR_RETRY_DELAY": os.environ.get("AGPO_ACCELERATOR_RETRY_DELAY", "30"),
        # what the tasks need: the stack's folder for DAG runs (pipelines.steps.dag_output_dir), the shared tracking
        # server (its user: worker_env), no model hub
        OUTPUT_ROOT_ENV: str(config.output_root),
        "MLFLOW_TRACKING_URI": config.mlflow_url,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def worker_env(config: StackConfig, env: dict[str, str], name: str, credentials: Credentials) -> dict[str, str]:
    """A worker's settings: ``env`` less the server-only keys and any operator credential, plus its name, its
    share of the cores, an Airflow home of its role's own (isolated: its HOME too) and its role's MLflow user
    (``registrar`` for the register worker, else ``tasks``) and broker user (the same names: it reaches only its
    own queues, deploy/datastores.py); the register worker also the folder of the registration lock
    (``isolation.registry_lock_folder``, its own), where no other worker's users can write. A worker keeps two
    secrets because it uses them: its broker user's Redis password (it takes its tasks from there) and Celery's
    results role (it writes each task's result there); task code can read both and its MLflow password
    (docs/operations.md, deployment). A task worker also gets the object store's ``agpo-tasks`` keys (the stack's
    bucket only); the register worker none."""
    threads = max(1, len(os.sched_getaffinity(0)) // config.workers)
    withheld = (*SERVER_ONLY, *OPERATOR_CREDENTIALS, REGISTRY_LOCK_ENV)
    folder = isolation.private_folder(config, isolation.role(name))
    if name == REGISTRAR:
        mlflow_user, broker_role = (mlflow_auth.REGISTRAR, credentials.mlflow_registrar), "registrar"
        own = {REGISTRY_LOCK_ENV: str(isolation.registry_lock_folder(config))}
    else:
        mlflow_user, broker_role = (mlflow_auth.TASKS, credentials.mlflow_tasks), "tasks"
        own = object_store.tasks_env(config, credentials)  # the stack's bucket, as identity agpo-tasks
    return {
        **{key: value for key, value in env.items() if key not in withheld},
        **({"HOME": str(folder)} if isolation.isolated() else {}),  # the operator's HOME is not its to read
        "AIRFLOW_HOME": str(folder / "airflow"),  # Airflow writes its airflow.cfg there
        "AGPO_WORKER_NAME": name,
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "deploy.worker_identity.hostname",
        "OMP_NUM_THREADS": str(threads),
        "MLFLOW_TRACKING_USERNAME": mlflow_user[0],
        "MLFLOW_TRACKING_PASSWORD": mlflow_user[1],
        "AIRFLOW__CELERY__BROKER_URL": broker_url(config, credentials, broker_role),
        **unacked_keys(broker_role),
        **own,
    }


def worker_command(config: StackConfig, name: str) -> list[str]:
    """A Celery worker named ``name``: one task at a time from its queues, no log server (the logs are on
    the shared disk), its pid file in its role's folder."""
    return [
        str(BIN / "airflow"),
        "celery",
        "worker",
        "--celery-hostname",
        name,
        "--queues",
        ",".join(config.worker_queues(name)),
        "--concurrency",
        "1",
        "--skip-serve-logs",
        "--without-mingle",
        "--without-gossip",
        "--pid",
        str(isolation.private_folder(config, isolation.role(name)) / f"{name}.celery.pid"),
    ]


def start_airflow(config: StackConfig, credentials: Credentials) -> None:
    env = airflow_env(config, credentials)
    # Airflow's simple auth manager reads this file at each login
    write_private(secrets_dir(config.home) / "airflow-users.json", json.dumps({ADMIN: credentials.airflow_admin}))
    run = config.run_dir
    airflow_command(config, env, "airflow-db-migrate", ["db", "migrate"], 600)  # a no-op on an up-to-date database
    create_pools(config, env)
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
    workers = [*config.worker_names(), REGISTRAR]
    log_starts = {}  # where each started worker's output begins in its (appended) log
    for name, argv in commands.items():
        if not services.is_running(run, name):
            services.start(Service(name, argv, env, cwd=REPO), run)
    for name in workers:
        if not services.is_running(run, name):
            log_starts[name] = services.log_size(run, name)
            services.start(worker_service(config, env, name, credentials), run)
    wait_ready(config, log_starts)


def create_pools(config: StackConfig, env: dict[str, str]) -> None:
    """The pools the DAGs name, as ``python dags/agpo_operations.py`` prints them from ``env`` (names, slots),
    created or resized with ``airflow pools import`` (idempotent): the scheduler queues no task of a missing pool."""
    run = config.run_dir
    printed = subprocess.run(
        [str(BIN / "python"), str(REPO / "dags" / "agpo_operations.py")],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=120,
    )
    if printed.returncode:
        raise ServiceError(f"dags/agpo_operations.py printed no pools: {printed.stderr[-2000:]}")
    pools = services.log_file(run, "airflow-pools").with_suffix(".json")  # in the operator's log folder
    pools.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pools.write_text(printed.stdout)
    airflow_command(config, env, "airflow-pools", ["pools", "import", str(pools)], 300)


def airflow_command(config: StackConfig, env: dict[str, str], log: str, arguments: list[str], timeout: int) -> None:
    """``airflow <arguments>`` with its output appended to the run folder's ``log``; a ServiceError with the log's
    end when it fails."""
    run = config.run_dir
    with services.open_log(run, log) as out:
        done = subprocess.run(
            [str(BIN / "airflow"), *arguments],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            check=False,
            timeout=timeout,
        )
    if done.returncode:
        command, where = " ".join(arguments[:2]), services.log_file(run, log)
        raise ServiceError(f"airflow {command} failed; the end of {where}:\n{services.tail_log(run, log)}")


def worker_service(config: StackConfig, env: dict[str, str], name: str, credentials: Credentials) -> Service:
    """Worker ``name`` as a service: as its role's OS user when isolated (deploy/isolation.py), with umask 002
    so that what one step writes the next (maybe another user of the group) can add to."""
    user = isolation.user(isolation.role(name))
    return Service(
        name,
        worker_command(config, name),
        worker_env(config, env, name, credentials),
        user=user,
        group=isolation.group(),
        umask=0o002 if user else -1,
        cwd=REPO,
    )


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
    for name in [*config.worker_names(), REGISTRAR]:
        joined = f"celery@{name} ready."
        services.wait_until(
            lambda name=name, joined=joined: joined in services.read_log(run, name, log_starts.get(name, 0)),
            "ready",
            240,
            run,
            name,
        )


def client(config: StackConfig) -> AirflowClient:
    """The stack's REST API as its admin (the password in <home>/secrets/airflow-admin.password)."""
    password = read_secret(secrets_dir(config.home) / SECRET_FILES["airflow_admin"])
    return AirflowClient(config.airflow_url, ADMIN, password)
