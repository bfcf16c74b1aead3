"""The stack's data stores, PostgreSQL and Redis: each started once, then brought to its wanted state.

PostgreSQL: the cluster is created under <home>/postgres on the first start (``initdb``, as Debian's
``postgres`` user when run as root). Every start writes its client authentication (``hba_text``,
``ident_text``): the superuser ``postgres`` logs in only through the owner-only socket folder, by peer
authentication, as the OS user that runs ``up`` (or ``postgres``), never over TCP; every other role only over
TCP, with its password (SCRAM), to the database of its own name. Nothing is trusted. Then it makes sure of one
role per database (``airflow``, ``celery``, ``mlflow``), each owning its database with the password in
<home>/secrets; no other role may connect to it. ``database_uri`` is SQLAlchemy's URL of one of them.

Redis: the Celery broker, no persistence, run as Debian's ``redis`` user when ``up`` runs as root. Its ACL
(``broker_acl``) has one user per role, each with a password of its own (their hashes in a 0600 config file in
Redis's own folder, never on the command line): the scheduler publishes to every queue, the workers and the
register worker reach only their own queues. ``broker_url`` is a role's Celery URL.

Both bind to 127.0.0.1 only and are Debian's packages (``deploy/install-services.sh`` installs them).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

from deploy import services
from deploy.credentials import Credentials, write_private
from deploy.services import Service, ServiceError
from deploy.stack_config import StackConfig, base_env

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
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
        ]
        done = subprocess.run(initdb, capture_output=True, text=True, user=user, group=user, check=False)
        if done.returncode:
            raise ServiceError(
                f"initdb failed in {data}: {done.stderr.strip()[-800:]}\n(as root the data folder's parents must "
                "be traversable by user postgres: chmod o+x them or choose --home elsewhere)"
            )
    owner = pwd.getpwuid(os.geteuid()).pw_name  # who runs `up`
    for name, text in (("pg_hba.conf", hba_text()), ("pg_ident.conf", ident_text(owner))):
        write_private(data / name, text)  # every start: a cluster made with other rules gets these
        if user:
            shutil.chown(data / name, user, user)
    if not services.is_running(config.run_dir, "postgres"):
        sockets.chmod(0o700)  # only the owner (and root) may reach the socket
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


def hba_text() -> str:
    """Postgres's pg_hba.conf: the superuser by peer through the socket (map ``stack``, ``ident_text``) and
    never over TCP; any other role over TCP only, to the database named like it, with its password."""
    return (
        "# written by deploy/datastores.py at every start of the stack's Postgres\n"
        "# TYPE  DATABASE  USER      ADDRESS       METHOD\n"
        "local   all       postgres                peer map=stack\n"
        "host    all       postgres  127.0.0.1/32  reject\n"
        "host    sameuser  all       127.0.0.1/32  scram-sha-256\n"
    )


def ident_text(owner: str) -> str:
    """Postgres's pg_ident.conf: the OS users who may log in as its superuser, ``owner`` (who runs ``up``)
    and ``postgres``, the server's own user."""
    return "# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\n" + "".join(
        f"stack  {name}  postgres\n" for name in dict.fromkeys([owner, "postgres"])
    )


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
        cursor.execute("SELECT pg_reload_conf()")  # a running server reads the client authentication written
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


# --- Redis ------------------------------------------------------------------------------------------


# Redis ACL users, one per role: ``scheduler`` publishes to every queue (the scheduler, API server and DAG
# processor); ``tasks`` (the workers) and ``registrar`` (the register worker) reach only their own queues
BROKER_ROLES = ("scheduler", "tasks", "registrar")
SEPARATOR = "\\x06\\x16"  # kombu's priority separator (a queue's lists: name, name + SEP + priority), as redis.conf
BINDINGS = ("binding", "binding_permanent")  # kombu's sets binding a queue to its exchange (one per queue here)
# what a worker's start-up check asks every worker (Airflow's duplicate-hostname check, an ``inspect``): its reply
# queue and bindings, kombu's binding deadlines, and the broadcast channel, which no worker listens to (remote
# control is off everywhere: airflow_services.airflow_env)
INSPECT_KEYS = (
    "*.reply.celery.pidbox",
    f"*.reply.celery.pidbox{SEPARATOR}*",
    *(f"_kombu.{kind}.reply.celery.pidbox" for kind in BINDINGS),
    "_kombu.binding_deadlines",
)
WORKER_CHANNELS = ("/0.celeryev/*", "/0.celery.pidbox")  # worker events; the inspect broadcast


def broker_acl(config: StackConfig, credentials: Credentials) -> str:
    """redis.conf ``user`` lines: the default user off (no anonymous access, no shared password); every user
    without Redis's dangerous commands (FLUSHALL, FLUSHDB, KEYS, CONFIG, DEBUG, SHUTDOWN, ACL, MONITOR, ...).
    ``scheduler`` reaches every key; a worker role only the keys of the queues it consumes (each queue, its
    priority lists, its kombu bindings), its own unacked-message keys (``unacked_keys``) and what a worker's
    start-up ``inspect`` uses (``INSPECT_KEYS``), and may publish only Celery's worker events and that inspect.
    So a task can neither publish to nor read the ``register`` queue, nor flush the broker. Passwords are
    written as their SHA-256 (``#``), so the file holds none."""
    queues = {"tasks": [config.accelerator_queue, config.cpu_queue], "registrar": [config.register_queue]}
    lines = ["user default off resetkeys resetchannels -@all"]
    for role in BROKER_ROLES:
        digest = hashlib.sha256(broker_password(credentials, role).encode()).hexdigest()
        if role == "scheduler":
            reach = "~* &*"
        else:
            keys = [
                pattern
                for queue in dict.fromkeys(queues[role])
                for pattern in (queue, f"{queue}{SEPARATOR}*", *(f"_kombu.{kind}.{queue}" for kind in BINDINGS))
            ]
            keys += [f"unacked-{role}*", *INSPECT_KEYS]
            reach = " ".join([*(f'"~{key}"' for key in keys), *(f"&{channel}" for channel in WORKER_CHANNELS)])
        lines.append(f"user {role} on #{digest} resetkeys resetchannels {reach} +@all -@dangerous")
    return "\n".join(lines) + "\n"


def broker_password(credentials: Credentials, role: str) -> str:
    return {"scheduler": credentials.redis, "tasks": credentials.redis_tasks, "registrar": credentials.redis_registrar}[
        role
    ]


def unacked_keys(role: str) -> dict[str, str]:
    """Airflow settings giving a worker role unacked-message keys of its own (kombu's transport options): by
    default every consumer shares ``unacked``, and a task could then read, or plant, a register message there."""
    prefix = "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__"
    return {
        f"{prefix}UNACKED_KEY": f"unacked-{role}",
        f"{prefix}UNACKED_INDEX_KEY": f"unacked-{role}-index",
        f"{prefix}UNACKED_MUTEX_KEY": f"unacked-{role}-mutex",
    }


def redis_user() -> str | None:
    """Redis runs as Debian's ``redis`` user when ``up`` runs as root (as Postgres runs as ``postgres``)."""
    return "redis" if os.geteuid() == 0 else None


def start_redis(config: StackConfig, credentials: Credentials) -> None:
    if services.is_running(config.run_dir, "redis"):
        return
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("Redis is not installed: run deploy/install-services.sh (Debian package redis-server)")
    folder, user = config.home / "redis", redis_user()
    conf = folder / "redis.conf"  # its users' password hashes: 0600, Redis's own folder, not on the command line
    write_private(
        conf,
        f'bind 127.0.0.1\nport {config.redis_port}\nprotected-mode yes\ndir "{folder}"\nsave ""\nappendonly no\n'
        f"daemonize no\n{broker_acl(config, credentials)}",
    )
    if user:
        for path in (folder, conf):
            shutil.chown(path, user, user)
    services.start(Service("redis", [server, str(conf)], base_env(), user=user), config.run_dir)
    services.wait_until(lambda: services.port_open(config.redis_port), "listening", 30, config.run_dir, "redis")


def broker_url(config: StackConfig, credentials: Credentials, role: str = "scheduler") -> str:
    """The Celery broker URL of ``role`` (``BROKER_ROLES``), its user and password percent-encoded."""
    password = quote(broker_password(credentials, role), safe="")
    return f"redis://{role}:{password}@127.0.0.1:{config.redis_port}/0"
