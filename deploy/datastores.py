"""The stack's data stores, PostgreSQL and Redis: each started once, then brought to its wanted state.

PostgreSQL: the cluster is created under <home>/postgres on the first start (``initdb``, as Debian's
``postgres`` user when run as root). Every start writes its client authentication (``hba_text``,
``ident_text``): the superuser ``postgres`` logs in only through the owner-only socket folder, by peer
authentication, as the OS user that runs ``up`` (or ``postgres``), never over TCP; every other role only over
TCP, with its password (SCRAM), to the database of its own name. Nothing is trusted. Then it makes sure of one
role per database (``airflow``, ``celery``, ``mlflow``), each owning its database with the password in
<home>/secrets; no other role may connect to it. ``database_uri`` is SQLAlchemy's URL of one of them.

Redis: the Celery broker, with its password in a 0600 config file (never on the command line), no
persistence. ``broker_url`` is Celery's URL of it.

Both bind to 127.0.0.1 only and are Debian's packages (``deploy/install-services.sh`` installs them).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote

from deploy import services
from deploy.credentials import Credentials, secrets_dir, write_private
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
