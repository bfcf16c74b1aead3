"""The distributed deployment for real (deploy/stack.py): PostgreSQL, Redis, an MLflow tracking server and
Airflow with the CeleryExecutor, two workers and the register worker, all on 127.0.0.1.

In the README's order: the laptop's pipeline runs first, as the checkout's owner in the checkout's own work/
(as ``make demo`` does, at test size), then the stack comes up and its runs must reach a registered champion
though the workers' users cannot write the folders the laptop run made (its 0755 lock folders).

First the credentials: MLflow refuses anonymous requests, and its task user, not an admin, can log a run
(which secrets a worker gets is checked in test_services.py: Celery's setproctitle overwrites what
/proc/<pid>/environ would show). Then isolation (as root): every worker process runs as the workers' OS
user, and a process with a task's user, group and environment fails to read the secrets folder, any other
service's environment, and Postgres as superuser, while its own database and the run folders work; the task
user cannot move the champion alias. Then the AGPO run of the ads DAG is triggered through the REST API; while
one of its shard tasks is halfway through, that task's worker is SIGKILLed with everything it started. The
task must be retried on the other worker and resume from the committed chunks: every input pair labeled
exactly once, one MLflow run per task, all logged as MLflow's task user; each task went to its kind's Celery
queue; the teacher's RL ran as 2 torchrun ranks in one task. ``up`` then brings the lost worker back as a
CPU-only worker (the default queue alone), the UIs are photographed and checked, the champion alias is moved
by the register step's MLflow user and by no task, and ``down`` must leave no process behind.
"""

import dataclasses
import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from deploy import airflow_services, isolation, mlflow_auth, services, stack
from deploy.credentials import Credentials, write_private
from deploy.services import free_port
from deploy.stack_config import (
    ADMIN_PASSWORD,
    ADS_DAG,
    OUTPUT_ROOT_ENV,
    REGISTERED_MODEL,
    REGISTRAR,
    REGISTRY_LOCK_ENV,
    REPO,
    StackConfig,
)

pytestmark = [pytest.mark.integration, pytest.mark.minutes(10)]
ROOT = Path(__file__).resolve().parents[2]
DAG = ADS_DAG
SHARDS, CHUNK_PAIRS = 4, 25  # configs/pipeline/stack-test.yaml
ACCELERATOR_TASKS = {"teacher", "train", "annotate_shard", "distil", "evaluate"}  # the DAG's accelerator queue


def queue_of(task: str) -> str:
    if task == "register":  # the stack's cluster policy (deploy/airflow_settings)
        return "register"
    return "accelerator" if task in ACCELERATOR_TASKS else "default"


def conf(algorithm: str, run_name: str, *overrides: str) -> dict:
    """A DAG run's params; where it writes is the workers' (the stack's output root), as in `make stack-demo`."""
    return {
        "presets": ["configs/pipeline/stack-test.yaml"],
        "algorithm": algorithm,
        "run_name": run_name,
        "overrides": list(overrides),
    }


LAPTOP_LOCKS = (ROOT / "work" / "runs" / "locks", ROOT / "work" / "mlflow" / "locks")


def run_the_laptop_pipeline_first() -> float:
    """What `make demo` leaves in the checkout before `make stack-up` (the README's order): the ads pipeline run as
    the checkout's owner in the checkout's own work/ (runs folder, MLflow store, their lock folders, 0755), here
    at less than the DAG tests' size and under an experiment and registered model of its own, so that a developer's
    checkout keeps its champion. Returns its seconds."""
    name = f"stack-test-laptop-{os.getpid()}"
    laptop = {k: v for k, v in os.environ.items() if k not in (OUTPUT_ROOT_ENV, REGISTRY_LOCK_ENV)}
    laptop = {k: v for k, v in laptop.items() if not k.startswith("MLFLOW_TRACKING_")}  # the checkout's store
    agpo = [str(Path(sys.executable).parent / "agpo"), "pipeline", "--config", "configs/pipeline/tiny-test.yaml"]
    own = ["tracking.experiment=stack-test-laptop", "tracking.registered_model=stack-test-laptop"]
    # every step, register included, at the least work: it makes the folders, its figures do not matter here
    least = ["teacher.sft.epochs=2", "distil.training.epochs=1", "gold_student=false"]
    least += ["evaluate.baselines.names=[lexical]", "evaluate.bootstrap.samples=100"]
    started = time.monotonic()
    done = subprocess.run(
        [*agpo, "--set", f"run_id={name}", *(arg for key in own + least for arg in ("--set", key))],
        cwd=ROOT,
        env=laptop,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "registered as version" in done.stdout, done.stdout[-3000:]
    shutil.rmtree(ROOT / "work" / "runs" / name)
    # the lock of the demo's own model, where `make demo` leaves it: work/runs/locks at 98f4e83, work/mlflow/locks after
    for locks in LAPTOP_LOCKS:
        (locks / f"register-{REGISTERED_MODEL}").mkdir(parents=True, exist_ok=True)
    return time.monotonic() - started


@pytest.fixture(scope="module")
def deployment():
    home = Path(tempfile.mkdtemp(prefix="agpo-stack-"))
    home.chmod(0o755)  # Postgres runs as user postgres when the tests run as root: it must reach its folder
    ports = {name: free_port() for name in ("postgres", "redis", "s3", "mlflow", "airflow")}
    config = StackConfig(
        home=home,
        postgres_port=ports["postgres"],
        redis_port=ports["redis"],
        s3_port=ports["s3"],
        mlflow_port=ports["mlflow"],
        airflow_port=ports["airflow"],
    )
    # secrets an operator chose (written before the first `up`, with characters URLs and configs must escape);
    # the others are generated
    for name in ("postgres-airflow.password", "postgres-celery.password", "redis.password"):
        write_private(home / "secrets" / name, secrets.token_urlsafe(12) + "'\"@:/%")
    cli = [
        sys.executable,
        "-m",
        "deploy.stack",
        "--home",
        str(home),
        "--postgres-port",
        str(ports["postgres"]),
        "--redis-port",
        str(ports["redis"]),
        "--s3-port",
        str(ports["s3"]),
        "--mlflow-port",
        str(ports["mlflow"]),
        "--airflow-port",
        str(ports["airflow"]),
    ]
    env = {**os.environ, ADMIN_PASSWORD: secrets.token_urlsafe(12)}  # the Airflow admin's, as an operator sets it
    env["AGPO_ACCELERATOR_RETRY_DELAY"] = "5"  # the lost shard's retry waits for its heartbeat timeout, not 30 s more
    old = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    print(f"the laptop's pipeline first, in {ROOT / 'work'}: {run_the_laptop_pipeline_first():.0f} s")
    started = time.monotonic()
    try:
        up = subprocess.run([*cli, "up"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout + up.stderr
        said = up.stdout + up.stderr
        print(f"stack up in {time.monotonic() - started:.0f} s")
        credentials = Credentials.load(home)  # all written by now: loading generates nothing
        assert credentials.airflow_admin == env[ADMIN_PASSWORD]
        # the tests read MLflow as its admin (MLflow's client takes the user from the environment)
        os.environ.update(MLFLOW_TRACKING_USERNAME=mlflow_auth.ADMIN, MLFLOW_TRACKING_PASSWORD=credentials.mlflow_admin)
        yield config, cli, env, credentials, said
    finally:
        subprocess.run([*cli, "down"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        shutil.rmtree(home, ignore_errors=True)
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def stack_pids(config: StackConfig) -> list[int]:
    sids = [services.recorded_pid(config.run_dir, name) for name in config.service_names()]
    return [pid for sid in sids if sid for pid in services.session_processes(sid)]


def listening_addresses(pids: list[int]) -> set[str]:
    """The local addresses the processes ``pids`` listen on (TCP, IPv4 and IPv6), read from /proc."""
    inodes = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        for fd in fds.iterdir() if fds.exists() else []:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    addresses = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                host = fields[1].split(":")[0]
                addresses.add("127.0.0.1" if host == "0100007F" else host)
    return addresses


def worker_queues(config: StackConfig, name: str) -> list[str]:
    """The Celery queues worker ``name``'s running process was started with: its ``--queues`` argument, read
    from its command line (Celery's process title keeps the arguments, in parentheses)."""
    cmdline = Path(f"/proc/{services.recorded_pid(config.run_dir, name)}/cmdline").read_bytes().replace(b"\0", b" ")
    return sorted(re.search(r"--queues[ =]([\w,-]+)", cmdline.decode()).group(1).split(","))


def failure_report(client, config: StackConfig, run_id: str) -> str:
    """The run's task table and the end of each failed task's last log (the logs go with the stack's home)."""
    failed = {t["task_id"] for t in client.task_instances(DAG, run_id) if t["state"] == "failed"}
    logs = sorted(
        (p for p in config.task_log_folder.rglob("*.log") if any(f"task_id={task}" in str(p) for task in failed)),
        key=lambda path: path.stat().st_mtime,
    )
    tails = [f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-40:]) for path in logs[-2:]]
    return "\n".join([client.format_task_table(DAG, run_id), *tails])


def wait_for_a_half_done_shard(client, annotate: Path, run_id: str, timeout: float = 900):
    """The first (shard, worker, committed chunks) with a running task that has committed some but not all
    of its chunks to ``annotate``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for instance in client.task_instances(DAG, run_id):
            if instance["task_id"] != "annotate_shard" or instance["state"] != "running" or not instance["hostname"]:
                continue
            shard = instance["map_index"]
            committed = len(list((annotate / "work" / f"{shard:05d}").glob("chunk-*.done")))
            if committed >= 2 and not (annotate / "shards" / f"{shard:05d}.json").exists():
                return shard, instance["hostname"].split("@")[0], committed
        assert client.run_state(DAG, run_id) in ("queued", "running"), "the run ended before a shard was interrupted"
        time.sleep(0.3)
    raise AssertionError("no shard task was caught halfway within the timeout")


def http_status(url: str, user: tuple[str, str] | None = None, body: dict | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if user:
        headers["Authorization"] = mlflow_auth.basic_auth(*user)
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


def mlflow_admin_get(config: StackConfig, credentials: Credentials, path: str) -> dict:
    headers = {"Authorization": mlflow_auth.basic_auth(mlflow_auth.ADMIN, credentials.mlflow_admin)}
    with urllib.request.urlopen(urllib.request.Request(config.mlflow_url + path, headers=headers), timeout=60) as reply:
        return json.loads(reply.read())


def test_mlflow_refuses_anonymous_requests_and_workers_log_as_its_task_user(deployment, monkeypatch):
    config, _, _, credentials, _ = deployment
    search = f"{config.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
    tasks = (mlflow_auth.TASKS, credentials.mlflow_tasks)
    assert http_status(search) == 401
    assert http_status(search, (mlflow_auth.ADMIN, "not the password")) == 401
    assert http_status(search, tasks) == 200
    assert mlflow_admin_get(config, credentials, f"{mlflow_auth.USERS}/get?username=tasks")["user"]["is_admin"] is False

    # with what a worker holds (worker_env), a run can be logged; users cannot be made
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", tasks[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", tasks[1])
    mlflow = MlflowClient(config.mlflow_url)
    run = mlflow.create_run(mlflow.create_experiment("stack-auth-check")).info.run_id
    mlflow.log_metric(run, "checked", 1.0)
    mlflow.set_terminated(run)
    assert mlflow.get_run(run).data.metrics == {"checked": 1.0}
    intruder = {"username": "intruder", "password": secrets.token_urlsafe(12)}
    assert http_status(f"{config.mlflow_url}{mlflow_auth.USERS}/create", tasks, intruder) == 403


def owner(pid: int) -> int:
    """The real uid of process ``pid``."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def task_uid() -> int:
    """The OS user task code runs as: the workers' own when ``up`` ran as root, else the caller."""
    return pwd.getpwnam(isolation.USERS["tasks"]).pw_uid if os.geteuid() == 0 else os.geteuid()


# What task code can try, run as a task runs: the workers' user and group, the environment worker_env gives
PROBE = """
import json, os, sys
from urllib.parse import unquote, urlsplit
import psycopg2
targets, report = json.loads(sys.argv[1]), {}
for path in targets["files"]:
    try:
        open(path, "rb").read()
        report[path] = "read"
    except OSError as err:
        report[path] = type(err).__name__
for path in targets["folders"]:
    try:
        os.listdir(path)
        report[path] = "listed"
    except OSError as err:
        report[path] = type(err).__name__
celery = urlsplit(os.environ["AIRFLOW__CELERY__RESULT_BACKEND"].removeprefix("db+"))
own = {"user": celery.username, "password": unquote(celery.password), "host": "127.0.0.1"}
logins = {
    "superuser through the socket": {"host": targets["sockets"], "user": "postgres", "dbname": "postgres"},
    "superuser over TCP": {"host": "127.0.0.1", "user": "postgres", "dbname": "postgres", "password": ""},
    "the metadata DB with the results role": {**own, "dbname": "airflow"},
    "its own results DB": {**own, "dbname": "celery"},
}
for what, login in logins.items():
    try:
        psycopg2.connect(port=targets["port"], connect_timeout=10, **login).close()
        report[what] = "connected"
    except psycopg2.OperationalError as err:
        report[what] = " ".join(str(err).split())
written = os.path.join(targets["runs"], "probe-was-here")
open(written, "w").write("a task writes its run folder")
os.remove(written)
report["runs"] = "written"
print(json.dumps(report))
"""


def test_a_task_cannot_read_another_services_secret(deployment):
    config, _, _, credentials, said = deployment
    if os.geteuid() != 0:  # then nothing is claimed, and `up` says so
        assert "warning: not isolated: `up` ran as" in said and "task code can read every secret" in said
        pytest.skip("not root: the workers run as the caller (no isolation to check)")
    assert f"isolation: tasks run as OS user {isolation.USERS['tasks']}" in said

    # every process of a worker (Celery and its pool) is the workers' user's; no other service's is
    sessions = {name: services.recorded_pid(config.run_dir, name) for name in config.service_names()}
    owners = {name: {owner(pid) for pid in services.session_processes(sid)} for name, sid in sessions.items()}
    register_uid = pwd.getpwnam(isolation.USERS["register"]).pw_uid
    assert all(owners[name] == {task_uid()} for name in config.worker_names()), owners
    assert owners[REGISTRAR] == {register_uid}
    servers = [name for name in config.service_names() if name not in [*config.worker_names(), REGISTRAR]]
    assert not {task_uid(), register_uid} & set().union(*(owners[name] for name in servers))

    # a task's attempt at what the other services hold: the secrets folder, every other service's environment,
    # Postgres as superuser and the metadata DB; and the register worker's environment and folder once it has
    # a user of its own (deploy/isolation.py: it shares the tasks' while pipeline outputs are 0600)
    keys = config.home / "secrets"
    walled = [*servers, *([REGISTRAR] if register_uid != task_uid() else [])]
    environs = [f"/proc/{pid}/environ" for name in walled for pid in services.session_processes(sessions[name])]
    files = [str(path) for path in sorted(keys.iterdir())] + environs
    folders = [str(keys), *([str(isolation.private_folder(config, "register"))] if REGISTRAR in walled else [])]
    targets = {
        "files": files,
        "folders": folders,
        "sockets": str(config.home / "postgres" / "run"),
        "port": config.postgres_port,
        "runs": str(config.output_root / "runs"),
    }
    env = airflow_services.worker_env(
        config, airflow_services.airflow_env(config, credentials), "worker-1", credentials
    )
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(targets)],
        env=env,
        cwd=REPO,
        user=isolation.USERS["tasks"],
        group=isolation.GROUP,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout)
    assert len(environs) >= len(servers)  # every process of each: leaders, their children, Postgres's backends
    alive = [path for path in files if Path(path).exists()]  # a Postgres backend may have ended meanwhile
    refused = {path: report[path] for path in alive + folders}
    assert refused == dict.fromkeys(alive + folders, "PermissionError"), refused
    assert "Permission denied" in report["superuser through the socket"]
    assert "pg_hba.conf rejects connection" in report["superuser over TCP"]
    assert report["the metadata DB with the results role"] != "connected"
    assert report["its own results DB"] == "connected" and report["runs"] == "written"  # what a task needs works
    assert credentials.mlflow_registrar not in "".join(env.values())  # its environment: not the registrar's user

    # with its MLflow user, a task neither adds a version to the stack's registered model nor moves its alias
    tasks = (mlflow_auth.TASKS, credentials.mlflow_tasks)
    api = f"{config.mlflow_url}/api/2.0/mlflow"
    version = {"name": REGISTERED_MODEL, "source": "mlflow-artifacts:/0/none/artifacts/model"}
    assert http_status(f"{api}/model-versions/create", tasks, version) == 403
    alias = {"name": REGISTERED_MODEL, "alias": "champion", "version": "1"}
    assert http_status(f"{api}/registered-models/alias", tasks, alias) == 403


def test_a_task_reads_and_writes_the_stacks_bucket_and_nothing_else(deployment):
    """The workers' S3 keys (worker_env: identity agpo-tasks) read, write and list the stack's bucket only; the
    register worker holds none; the admin's secret is in no worker's environment."""
    import boto3
    from botocore.exceptions import ClientError

    config, _, env, credentials, _ = deployment
    worker = airflow_services.worker_env(config, dict(env), "worker-1", credentials)
    assert credentials.s3_admin not in "".join(worker.values())
    s3 = boto3.client(
        "s3",
        endpoint_url=worker["AWS_ENDPOINT_URL"],
        region_name=worker["AWS_REGION"],
        aws_access_key_id=worker["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=worker["AWS_SECRET_ACCESS_KEY"],
    )
    s3.put_object(Bucket=config.bucket, Key="checks/hello.txt", Body=b"from a task")
    assert s3.get_object(Bucket=config.bucket, Key="checks/hello.txt")["Body"].read() == b"from a task"
    with pytest.raises(ClientError, match="AccessDenied"):
        s3.create_bucket(Bucket="not-the-stacks")
    registrar = airflow_services.worker_env(config, dict(env), REGISTRAR, credentials)
    assert "AWS_SECRET_ACCESS_KEY" not in registrar


def test_a_task_cannot_publish_to_the_register_queue_nor_flush_the_broker(deployment):
    """With the broker URL its worker gives it (deploy/datastores.py: one Redis user per role), a task is refused
    the register queue and FLUSHALL, while the register worker's user takes from the register queue only; the
    DAG runs below go through these rules."""
    import redis

    config, _, _, credentials, _ = deployment
    env = airflow_services.airflow_env(config, credentials)
    urls = {
        name: airflow_services.worker_env(config, env, name, credentials)["AIRFLOW__CELERY__BROKER_URL"]
        for name in ("worker-1", REGISTRAR)
    }
    task, registrar = (redis.Redis.from_url(urls[name]) for name in ("worker-1", REGISTRAR))
    for refused in (lambda: task.lpush("register", "forged"), task.flushall, lambda: registrar.lpush("default", "x")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    assert registrar.llen("register") >= 0 and task.llen("default") >= 0  # their own queues


# A lease's first write, as the register step's lock makes it: a temporary file in the lock's folder
LOCK_PROBE = """
import json, os, sys, tempfile
report = {}
for folder in sys.argv[1:]:
    try:
        handle, path = tempfile.mkstemp(dir=folder, prefix=".gen-probe-", suffix=".tmp")
        os.close(handle)
        os.remove(path)
        report[folder] = "written"
    except OSError as err:
        report[folder] = type(err).__name__
print(json.dumps(report))
"""


def probe_as(name: str, folders: list[Path]) -> dict[str, str]:
    """Whether OS user ``name`` (group agpo-tasks, no other) can create a file in each of ``folders``."""
    done = subprocess.run(
        [sys.executable, "-c", LOCK_PROBE, *map(str, folders)],
        cwd=REPO,
        user=name,
        group=isolation.GROUP,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_stacks_runs_share_no_folder_with_the_laptops_that_its_users_cannot_write(deployment):
    """Every worker writes DAG runs under the stack's output root and the register worker takes the registration
    lock in a folder of its own; the laptop run's folders keep their owner and mode. At 98f4e83 the stack's runs
    went to the checkout's work/runs, and its register step, run as agpo-register, was refused the lock folder that
    `make demo` had made there: PermissionError on work/runs/locks/register-ads-relevance-student/.gen-....tmp."""
    config, _, _, credentials, said = deployment
    assert f"DAG runs write in {config.output_root}" in said
    env = airflow_services.airflow_env(config, credentials)
    workers = {
        name: airflow_services.worker_env(config, env, name, credentials)
        for name in (*config.worker_names(), REGISTRAR)
    }
    assert {worker[OUTPUT_ROOT_ENV] for worker in workers.values()} == {str(config.output_root)}
    locks = Path(workers[REGISTRAR][REGISTRY_LOCK_ENV])
    assert locks == isolation.registry_lock_folder(config)
    assert not any(REGISTRY_LOCK_ENV in workers[name] for name in config.worker_names())
    laptop = [folder / f"register-{REGISTERED_MODEL}" for folder in LAPTOP_LOCKS]
    for folder in laptop:  # as the laptop's run left them: its owner's, closed to other users (0755)
        assert folder.stat().st_uid == os.geteuid() and not folder.stat().st_mode & 0o022, folder
    if os.geteuid() != 0:
        pytest.skip("not root: the workers run as the caller, who owns the laptop's folders too")
    assert probe_as(isolation.USERS["register"], [*laptop, locks]) == {
        **{str(folder): "PermissionError" for folder in laptop},  # the reported failure, had the lock been there
        str(locks): "written",
    }
    assert probe_as(isolation.USERS["tasks"], [locks]) == {str(locks): "PermissionError"}  # a task cannot hold it
    assert (locks.owner(), locks.stat().st_mode & 0o7777) == (isolation.USERS["register"], 0o700)
    for folder in isolation.task_folders(config):
        assert (folder.group(), folder.stat().st_mode & 0o7777) == (isolation.GROUP, 0o2775), folder


def test_the_ads_dag_survives_losing_a_worker_mid_shard(deployment, tmp_path):
    config, cli, env, credentials, _ = deployment
    client = airflow_services.client(config)

    # every service listens on loopback only, and no secret is on a command line
    pids = stack_pids(config)
    assert listening_addresses(pids) == {"127.0.0.1"}
    every_secret = dataclasses.asdict(credentials).values()
    secrets_as_written = [form for secret in every_secret for form in (secret, quote(secret, safe=""))]
    for pid in pids:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        assert not any(secret in cmdline for secret in secrets_as_written), cmdline

    started = time.monotonic()
    two_ranks = ("train.processes=2", "train.deepspeed=configs/deepspeed/zero1.json")
    agpo = client.trigger(DAG, conf("agpo", "stack-agpo", *two_ranks), "stack-agpo")
    root = config.output_root / "runs" / "stack-agpo"
    shard, lost, committed = wait_for_a_half_done_shard(client, root / "annotate", agpo)
    running = services.session_processes(services.recorded_pid(config.run_dir, lost))
    assert {owner(pid) for pid in running} == {task_uid()}  # the task's processes too: the workers' user
    killed = stack.kill_worker(config, lost)
    killed_at = time.time()
    assert len(killed) >= 3  # the worker, its pool process, the task supervisor and task process
    assert client.wait_for_run(DAG, agpo, timeout=1200) == "success", failure_report(client, config, agpo)
    agpo_minutes = (time.monotonic() - started) / 60
    print(client.format_task_table(DAG, agpo))

    # the interrupted shard: failed on the lost worker, retried and finished on the other one
    tries = client.tries(DAG, agpo, "annotate_shard", shard)
    assert [t["try_number"] for t in tries] == [1, 2]
    assert tries[0]["hostname"].startswith(f"{lost}@") and tries[0]["state"] == "failed"
    survivor = next(name for name in config.worker_names() if name != lost)
    assert tries[1]["hostname"].startswith(f"{survivor}@") and tries[1]["state"] == "success"
    retry_after = datetime.fromisoformat(tries[1]["start_date"]).timestamp() - killed_at
    shard_hosts = {
        t["hostname"].split("@")[0] for s in range(SHARDS) for t in client.tries(DAG, agpo, "annotate_shard", s)
    }
    assert shard_hosts == set(config.worker_names())  # the mapped shards ran on both workers

    # exactly once: each unlabeled pair is in the merged labels once, or quarantined
    pairs = pq.read_table(root / "data" / "pairs.parquet").to_pylist()
    unlabeled = {r["pair_id"] for r in pairs if r["split"] == "unlabeled"}
    labeled = [
        pid
        for f in sorted((root / "annotate" / "labels").glob("*.parquet"))
        for pid in pq.read_table(f, columns=["pair_id"]).column("pair_id").to_pylist()
    ]
    quarantined = sum(pq.read_metadata(f).num_rows for f in (root / "annotate" / "quarantine").glob("*.parquet"))
    assert len(labeled) == len(set(labeled))
    assert set(labeled) <= unlabeled and len(labeled) + quarantined == len(unlabeled)
    manifest = json.loads((root / "annotate" / "shards" / f"{shard:05d}.json").read_text())
    assert manifest["labels"]["rows"] == manifest["rows_in"] > committed * CHUNK_PAIRS

    # the shared MLflow server holds one run per task; the retried shard's run was reused, not duplicated
    mlflow = MlflowClient(config.mlflow_url)
    experiment = mlflow.get_experiment_by_name(DAG).experiment_id
    stage_runs = mlflow.search_runs(
        [experiment], f"tags.`agpo.run_key` = '{DAG}/stack-agpo' and tags.`agpo.kind` = 'stage'"
    )
    stages = [r.data.tags["agpo.stage"] for r in stage_runs]
    assert len(stages) == len(set(stages)) == 9 + SHARDS
    # the tasks logged as MLflow's task user: it created the experiment, so MLflow granted it MANAGE there
    grants = mlflow_admin_get(config, credentials, "/api/3.0/mlflow/users/permissions/list?username=tasks")
    assert ("experiment", experiment, "MANAGE") in [
        (g["resource_type"], g["resource_pattern"], g["permission"]) for g in grants["permissions"]
    ]
    [retried] = [r for r in stage_runs if r.data.tags["agpo.stage"] == f"annotate-shard-{shard}"]
    assert retried.data.tags["try_number"] == "2" and retried.info.status == "FINISHED"
    assert retried.data.metrics["labels"] == manifest["rows_in"]

    # every task went to its kind's Celery queue (both workers took both queues, so the retry could fail over);
    # the register step to the register queue (the stack's cluster policy), where only the register worker ran it
    queues = {(t["task_id"], t["queue"]) for t in client.task_instances(DAG, agpo)}
    assert queues == {(task, queue_of(task)) for task, _ in queues}
    [register] = client.tries(DAG, agpo, "register", -1)
    assert register["hostname"].startswith(f"{REGISTRAR}@")
    # run as agpo-register after the laptop's pipeline made its lock folders (0755, root's), the register step took
    # the registration lock in its own folder and made the champion rule's candidate the stack's first champion
    decision = json.loads((root / "student" / "registration.json").read_text())
    assert decision["candidate"] and decision["version"] and decision["promoted"], decision
    first = MlflowClient(config.mlflow_url).get_model_version_by_alias(REGISTERED_MODEL, "champion")
    assert first.version == str(decision["version"]) and first.tags["promotion"] == "champion"
    # and registered the run's teacher, which passed its gates, as the teacher model's current version
    teacher_model = REGISTERED_MODEL + mlflow_auth.TEACHER_SUFFIX
    current = MlflowClient(config.mlflow_url).get_model_version_by_alias(teacher_model, "current")
    assert current.version == str(decision["teacher_registration"]["version"]), decision["teacher_registration"]

    # its teacher was trained by 2 torchrun ranks (DeepSpeed ZeRO-1) inside one task
    teacher = json.loads((root / "teacher" / "rl" / "summary.json").read_text())
    assert teacher["world_size"] == 2 and teacher["algorithm"] == "agpo"

    # `up` brings the lost worker back as a CPU-only worker: it takes the default queue alone, the survivor both
    # (the tasks' queues were checked above, so no accelerator task can reach the revived worker)
    stack.up(dataclasses.replace(config, accelerator_workers=(survivor,)), env)
    assert all(stack.status(config).values())
    assert worker_queues(config, lost) == ["default"] and worker_queues(config, survivor) == ["accelerator", "default"]

    # the workers wrote nothing in the checkout's own work/, where the laptop's pipeline ran (a stack of `make
    # stack-up` keeps its home in work/stack: not this test's)
    if os.geteuid() == 0:
        workers = {pwd.getpwnam(name).pw_uid for name in isolation.USERS.values()}
        laptop = [p for p in (ROOT / "work").rglob("*") if not p.is_relative_to(ROOT / "work" / "stack")]
        assert not [path for path in laptop if path.lstat().st_uid in workers]

    # the champion alias: the register step's MLflow user may move it, the tasks' may not
    champion = MlflowClient(config.mlflow_url).get_model_version_by_alias(REGISTERED_MODEL, "champion").version
    alias = {"name": REGISTERED_MODEL, "alias": "champion", "version": champion}
    api = f"{config.mlflow_url}/api/2.0/mlflow"
    assert http_status(f"{api}/registered-models/alias", (mlflow_auth.TASKS, credentials.mlflow_tasks), alias) == 403
    registrar = (mlflow_auth.REGISTRAR, credentials.mlflow_registrar)
    assert http_status(f"{api}/registered-models/alias", registrar, alias) == 200

    # the UIs as a user sees them
    pictures = Path(os.environ.get("AGPO_STACK_SCREENSHOTS", tmp_path))  # docs/operations.md's: =docs/images
    graph, teachers, card = stack.take_screenshots(config, agpo, ["stack-agpo"], pictures)
    assert all(shot.path.stat().st_size > 20_000 for shot in (graph, teachers, card))
    # the registry page of the newest student shows its model card (the version's description)
    assert all(fact in card.text for fact in ("0 irrelevant", "3 exact", "Max length", "macro_f1")), card.text[:3000]
    assert DAG in graph.text and "annotate_shard" in graph.text and "stack-agpo" in graph.text
    assert "trainer.algorithm" in teachers.text and "train · stack-agpo" in teachers.text

    sessions = [services.recorded_pid(config.run_dir, name) for name in config.service_names()]
    assert all(sessions)
    down = subprocess.run([*cli, "down"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert down.returncode == 0 and "no process left" in down.stdout, down.stdout + down.stderr
    assert not [pid for sid in sessions for pid in services.session_processes(sid)]
    assert not any(
        services.port_open(port)
        for port in (config.postgres_port, config.redis_port, config.mlflow_port, config.airflow_port)
    )
    print(
        f"AGPO run with a worker lost: {agpo_minutes:.1f} min; shard {shard} killed on {lost} after "
        f"{committed} committed chunks, retried on {survivor} {retry_after:.0f} s later; {len(labeled)} labels, "
        f"{quarantined} quarantined"
    )
