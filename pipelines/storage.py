"""Where a team's data is: a local path or a URI, read and written through one seam (pyarrow's filesystems).

``locate`` turns what a team names (pairs, an import's input, join and unlabeled tables and ``out_dir``, the
inputs and published outputs of annotation and scoring) into a ``Location``:

- a local path or ``file://`` URI: the local disk;
- ``s3://bucket/key``: AWS S3 or any S3-compatible store. Credentials and endpoint come from the standard AWS
  environment, as every AWS tool reads them: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and
  ``AWS_SESSION_TOKEN``), ``AWS_PROFILE``, an instance role; ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for
  an S3-compatible store; ``AWS_REGION``. A URI may name its endpoint in its query (``?endpoint_override=
  host:port&scheme=http``), never a key: a URI that carries credentials is refused;
- ``gs://``, ``hdfs://``, ``abfs://`` and the other schemes pyarrow has a filesystem for; a scheme pyarrow lacks
  goes through fsspec (when its package for that scheme is installed).

What goes wrong is a one-line ``StorageError`` naming the URI, the problem (no such bucket, a refused key, access
denied, nothing there, an unreachable endpoint) and the fix. No secret reaches one: the SDK's own words are cut
to their first line, which holds none, and URIs with credentials never get this far.

A folder or prefix is a dataset: ``parts`` lists its data files in path order, each with its hive partition
values (``dt=2026-12-01/`` -> ``{"dt": "2026-12-01"}``), kept by a ``partitions`` filter; names starting with
``_`` or ``.`` (``_SUCCESS``, a manifest, temp files) are not data.

Writes: ``upload`` replaces a file whole (local: temp file and rename; an object store: one PUT, which it shows
whole or not at all), ``create_exclusive`` creates a file only where none is (local: ``os.link``; S3: a
PUT with ``If-None-Match: *``, through boto3 since pyarrow has no conditional write) and raises
``FileExistsError`` otherwise: the commit step where there is no atomic rename.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from durable.fileio import sha256_file
from pipelines.config import is_secret_key, redact_urls
from pipelines.errors import StageFailed
from pipelines.io import write_atomic

READ_BUFFER = 2**20  # bytes a stream from an object store is read ahead by
NOT_DATA = ("_", ".")  # a part whose name starts so is not data
MANIFEST = "_manifest.json"  # a published dataset's row counts and checksums, written last
CLAIM = "_claim.json"  # a publish's first object: the result (its files' checksums) that owns the prefix


class StorageError(StageFailed):
    """A location that cannot be used as asked: one line, no secret, with the fix."""


@dataclass(frozen=True)
class Location:
    """A file or folder on ``filesystem`` at ``path`` (the filesystem's own path); ``uri`` as the team wrote it."""

    filesystem: pafs.FileSystem
    path: str
    uri: str
    endpoint: str | None = None  # an S3 endpoint the URI named (boto3 needs it too)

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def child(self, name: str) -> Location:
        uri = self.uri if not self.uri.endswith("/") else self.uri[:-1]
        base, _, query = uri.partition("?")
        return Location(
            self.filesystem,
            f"{self.path.rstrip('/')}/{name}",
            f"{base}/{name}" + (f"?{query}" if query else ""),
            self.endpoint,
        )

    def info(self) -> pafs.FileInfo:
        return guarded(self, lambda: self.filesystem.get_file_info(self.path))

    def exists(self) -> bool:
        return self.info().type != pafs.FileType.NotFound

    def open_binary(self) -> IO[bytes]:
        """A buffered binary stream of the file (``readline`` works, for the line-based readers)."""
        if self.is_local:
            return open(self.path, "rb")
        return io.BufferedReader(guarded(self, lambda: self.filesystem.open_input_stream(self.path)), READ_BUFFER)

    def open_random(self) -> Any:
        """The file for random access (a Parquet footer is at its end): a path locally, a NativeFile elsewhere."""
        if self.is_local:
            return self.path
        return guarded(self, lambda: self.filesystem.open_input_file(self.path))

    def read_bytes(self) -> bytes:
        with self.open_binary() as handle:
            return handle.read()


def locate(uri: str | Path) -> Location:
    """``uri`` (a local path or a URI) as a Location; a StorageError for a URI with credentials in it, or a scheme
    nothing can read."""
    text = str(uri)
    parts = urlsplit(text)
    if len(parts.scheme) <= 1:  # a local path (a one-letter scheme is a Windows drive)
        return Location(pafs.LocalFileSystem(), str(Path(text).absolute()), text)
    if parts.scheme == "file":
        return Location(pafs.LocalFileSystem(), parts.path, text)
    shown = redact(text)
    secrets = sorted(k for k in parse_qs(parts.query) if is_secret_key(k))
    if parts.password is not None or secrets:
        raise StorageError(
            f"{shown} carries credentials ({'a password' if parts.password is not None else ', '.join(secrets)}); "
            "take them out of the URI: they come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            "AWS_PROFILE or an instance role)"
        )
    if parts.scheme == "s3":
        return _s3_location(parts, text)
    try:
        filesystem, path = pafs.FileSystem.from_uri(text)
    except (pa.ArrowException, OSError, ValueError) as err:
        return _fsspec_location(text, shown, err)
    return Location(filesystem, path, text)


def _s3_location(parts: Any, text: str) -> Location:
    """S3 through pyarrow, configured as the AWS tools are: the SDK's credential chain reads the keys, the
    profile or the instance role itself; the endpoint and region are read here, so that an S3-compatible store
    works whatever pyarrow's version reads of them."""
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    endpoint = (
        query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    options: dict[str, Any] = {"allow_bucket_creation": False, "allow_bucket_deletion": False}
    region = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    if endpoint:
        split = urlsplit(endpoint if "://" in endpoint else f"{query.get('scheme', 'https')}://{endpoint}")
        options["endpoint_override"] = split.netloc
        options["scheme"] = split.scheme
        endpoint = f"{split.scheme}://{split.netloc}"
    if os.environ.get("AWS_PROFILE") and not os.environ.get("AWS_ACCESS_KEY_ID"):
        options["profile"] = os.environ["AWS_PROFILE"]
    try:
        filesystem = pafs.S3FileSystem(**options)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise StorageError(f"{redact(text)}: cannot set up S3 ({first_line(err)}); check AWS_* settings") from None
    path = f"{parts.netloc}{parts.path}".rstrip("/") or parts.netloc
    if not parts.netloc:
        raise StorageError(f"{redact(text)} names no bucket; write s3://<bucket>/<prefix>")
    return Location(filesystem, path, text, endpoint)


def _fsspec_location(text: str, shown: str, err: Exception) -> Location:
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(text)
    except (ImportError, ValueError, OSError) as fsspec_err:
        raise StorageError(
            f"{shown}: no filesystem reads this scheme (pyarrow: {first_line(err)}; fsspec: {first_line(fsspec_err)}); "
            "use a local path, s3://, gs:// or hdfs://, or install the fsspec package for the scheme"
        ) from None
    return Location(pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path, text)


def redact(uri: str) -> str:
    """``uri`` without its user info or secret query values, for messages and logs (``config.redact_urls``)."""
    return redact_urls(uri)


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def guarded(location: Location, action: Any) -> Any:
    """``action()``, with the filesystem's error turned into a one-line StorageError that says what to fix."""
    try:
        return action()
    except FileNotFoundError:
        raise StorageError(f"{redact(location.uri)} does not exist; fix the path or URI") from None
    except (OSError, pa.ArrowException) as err:
        raise StorageError(f"{redact(location.uri)}: {explain(err, location)}") from None


AWS_PROBLEMS = (  # (what the SDK's message holds, what to say)
    ("NO_SUCH_BUCKET", "the bucket {bucket!r} does not exist; create it or fix the URI"),
    ("NoSuchBucket", "the bucket {bucket!r} does not exist; create it or fix the URI"),
    ("INVALID_ACCESS_KEY_ID", "the store does not know this access key; check AWS_ACCESS_KEY_ID or AWS_PROFILE"),
    ("InvalidAccessKeyId", "the store does not know this access key; check AWS_ACCESS_KEY_ID or AWS_PROFILE"),
    ("SIGNATURE_DOES_NOT_MATCH", "the store refused the secret key; check AWS_SECRET_ACCESS_KEY or AWS_PROFILE"),
    ("SignatureDoesNotMatch", "the store refused the secret key; check AWS_SECRET_ACCESS_KEY or AWS_PROFILE"),
    ("ACCESS_DENIED", "access denied: this identity may not do that here; ask for read (or write) on the bucket"),
    ("AccessDenied", "access denied: this identity may not do that here; ask for read (or write) on the bucket"),
    ("NETWORK_CONNECTION", "cannot reach the store at {endpoint}; check AWS_ENDPOINT_URL and that it is up"),
)


def explain(err: BaseException, location: Location) -> str:
    """The store's problem in words with its fix. A HEAD request's 403 has no body, so the SDK cannot tell a
    refused key from a missing grant: one listing call asks the store which it was."""
    text = str(err)
    bucket = location.path.split("/", 1)[0]
    if "ACCESS_DENIED" in text and isinstance(location.filesystem, pafs.S3FileSystem):
        text = _denied_why(location, bucket) or text
    for marker, said in AWS_PROBLEMS:
        if marker in text:
            return said.format(bucket=bucket, endpoint=location.endpoint or "AWS")
    return f"{first_line(err)}; check the path or URI and its permissions"


def _denied_why(location: Location, bucket: str) -> str | None:
    """The error code of a one-key listing of ``bucket`` (``InvalidAccessKeyId``, ``SignatureDoesNotMatch``,
    ``AccessDenied``), or None where the listing works or fails otherwise."""
    try:
        client = s3_client(location)
    except StorageError:
        return None  # no boto3 to ask with: the SDK's own words stand
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.list_objects_v2(Bucket=bucket, MaxKeys=1)
    except ClientError as err:
        return str(err.response.get("Error", {}).get("Code", ""))
    except BotoCoreError:
        return None
    return None


def missing(location: Location) -> str:
    """Why nothing is at ``location``: its bucket does not exist, or the key or folder does not."""
    if isinstance(location.filesystem, pafs.S3FileSystem):
        bucket = location.path.split("/", 1)[0]
        if guarded(location, lambda: location.filesystem.get_file_info(bucket)).type == pafs.FileType.NotFound:
            return f"{redact(location.uri)}: the bucket {bucket!r} does not exist; create it or fix the URI"
    return f"{redact(location.uri)} does not exist; fix the path or URI"


@dataclass(frozen=True)
class Part:
    """One data file of a dataset, with the hive partition values its folders name."""

    location: Location
    partition: dict[str, str] = field(default_factory=dict)
    size: int = 0
    mtime_ns: int = 0


def kept(partition: dict[str, str], partitions: dict[str, str]) -> bool:
    """Whether a part's ``partition`` values pass the filter: key -> ``a,b,c`` (one of those values) or
    ``first..last`` (inclusive, compared as text: ISO dates sort as they read); a part without the key fails."""
    for key, spec in partitions.items():
        value = partition.get(key)
        if value is None:
            return False
        spec = str(spec)
        if ".." in spec:
            first, last = spec.split("..", 1)
            if not first <= value <= last:
                return False
        elif value not in spec.split(","):
            return False
    return True


def parts(location: Location, partitions: dict[str, str] | None = None) -> list[Part]:
    """The data files of a folder or prefix, in path order, with their partition values, kept by ``partitions``
    (key -> ``a,b`` or ``first..last``); a StorageError when the folder holds no data file or none is kept."""
    selector = pafs.FileSelector(location.path, recursive=True)
    infos = guarded(location, lambda: location.filesystem.get_file_info(selector))
    found: list[Part] = []
    for info in sorted(infos, key=lambda i: i.path):
        relative = info.path[len(location.path.rstrip("/")) + 1 :].split("/")
        if info.type != pafs.FileType.File or any(name.startswith(NOT_DATA) for name in relative):
            continue
        partition = dict(folder.split("=", 1) for folder in relative[:-1] if "=" in folder)
        found.append(Part(location.child("/".join(relative)), partition, info.size or 0, info.mtime_ns or 0))
    chosen = [part for part in found if kept(part.partition, partitions or {})]
    if not chosen:
        which = f" in partitions {partitions}" if partitions and found else ""
        raise StorageError(
            f"{redact(location.uri)} holds no data file{which} ({len(found)} in all); fix the URI or the filter"
        )
    return chosen


def digest(found: list[Part]) -> str:
    """What identifies a dataset's content: one local file's SHA-256 (a regenerated identical file is the same
    input); else the SHA-256 of each part's name with its content's SHA-256 (local) or its size and modification
    time (an object store's: reading every byte twice to hash it would double the cost of the read)."""
    if len(found) == 1 and found[0].location.is_local and not found[0].partition:
        return sha256_file(found[0].location.path)
    lines = (
        f"{part.location.uri}\t"
        + (sha256_file(part.location.path) if part.location.is_local else f"{part.size}:{part.mtime_ns}")
        for part in found
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def upload(source: Path, location: Location) -> None:
    """Copy the local file ``source`` to ``location`` whole (an object store shows it once complete)."""
    if location.is_local:
        Path(location.path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(location.path, source.read_bytes())
        return
    guarded(location, lambda: pafs.copy_files(str(source), location.path, pafs.LocalFileSystem(), location.filesystem))


def remove(location: Location) -> None:
    """Delete the file at ``location``; nothing there is fine."""
    if location.exists():
        guarded(location, lambda: location.filesystem.delete_file(location.path))


def publish(folder: Path, names: list[str], dest: Location, manifest: dict[str, Any]) -> Location:
    """Publish the files ``names`` of ``folder`` (paths relative to it) under ``dest`` exactly once, then
    ``_manifest.json`` (``manifest`` plus each file's SHA-256), last: a reader waits for the manifest. Every file is
    created only where none is (``create_exclusive``); where one is, it must hold the same bytes (a retry, a kill
    mid-publish, a second publisher of the same result) and is left as it is, else a StorageError: another
    result was published there. So a rerun completes a killed publish with no object written twice, and the
    published objects equal the run's files byte for byte. Before anything is written, ``dest`` may hold only
    objects of this result: an object it does not name (part files are named by their content, so another result's
    have other names) stops the publish with a StorageError, and ``dest`` is left as it was. Two different results
    published at the same moment can both pass that check, so the first object written is ``_claim.json`` (the
    files' checksums), created the same way: one result's claim wins, the other publish fails on it before writing
    any part, and only a retry of the winning result (the same claim, byte for byte) goes on."""
    shas = {name: sha256_file(folder / name) for name in names}
    _refuse_other_objects(dest, set(names) | {CLAIM, MANIFEST})
    claim = json.dumps({"files": shas}, indent=2, sort_keys=True).encode() + b"\n"
    _create_or_match(claim, dest.child(CLAIM), hashlib.sha256(claim).hexdigest())
    for name in names:
        _create_or_match(folder / name, dest.child(name), shas[name])
    body = json.dumps({**manifest, "files": shas}, indent=2, sort_keys=True).encode() + b"\n"
    _create_or_match(body, dest.child(MANIFEST), hashlib.sha256(body).hexdigest())
    return dest.child(MANIFEST)


def _refuse_other_objects(dest: Location, ours: set[str]) -> None:
    if not dest.exists():
        return
    selector = pafs.FileSelector(dest.path, recursive=True)
    infos = guarded(dest, lambda: dest.filesystem.get_file_info(selector))
    root = dest.path.rstrip("/") + "/"
    others = sorted(
        i.path[len(root) :] for i in infos if i.type == pafs.FileType.File and i.path[len(root) :] not in ours
    )
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise StorageError(
            f"{redact(dest.uri)} holds another result ({shown}); publish to a fresh URI, or remove the old dataset "
            "first"
        )


def _create_or_match(source: Path | bytes, location: Location, sha: str) -> None:
    try:
        create_exclusive(location, source)
    except FileExistsError:
        with location.open_binary() as handle:
            there = hashlib.file_digest(handle, "sha256").hexdigest()
        if there != sha:
            raise StorageError(
                f"{redact(location.uri)} holds another result (SHA-256 {there[:12]}, this run's {sha[:12]}); "
                "publish to a fresh URI, or remove the old dataset first"
            ) from None


def create_exclusive(location: Location, data: bytes | Path) -> None:
    """Create the file at ``location`` holding ``data``, only where no file is; ``FileExistsError`` where one is
    (another writer's commit came first). Local disk: a hard link; S3: ``If-None-Match: *`` (412 where the key
    exists)."""
    if location.is_local:
        Path(location.path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(location.path, data.read_bytes() if isinstance(data, Path) else data, exclusive=True)
        return
    if not isinstance(location.filesystem, pafs.S3FileSystem):
        raise StorageError(f"{redact(location.uri)}: exactly-once commits need a local disk or S3")
    client = s3_client(location)
    from botocore.exceptions import BotoCoreError, ClientError  # boto3's own: there once s3_client is

    bucket, key = location.path.split("/", 1)
    try:
        if isinstance(data, Path):
            with data.open("rb") as body:  # streamed from the file, never read whole
                client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
        else:
            client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as err:
        if err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            raise FileExistsError(redact(location.uri)) from None
        raise StorageError(f"{redact(location.uri)}: {explain(err, location)}") from None
    except BotoCoreError as err:
        raise StorageError(f"{redact(location.uri)}: {explain(err, location)}") from None


def s3_client(location: Location) -> Any:
    """A boto3 S3 client with the AWS environment's credentials and the location's endpoint. Checksums only where
    the API requires them: S3-compatible stores do not all read the aws-chunked bodies newer SDKs send."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StorageError(
            f"{redact(location.uri)}: writing to S3 exactly once needs boto3; install the data extra: "
            "pip install -c constraints.txt -e '.[data]'"
        ) from None
    config = Config(request_checksum_calculation="when_required", response_checksum_validation="when_required")
    return boto3.session.Session().client("s3", endpoint_url=location.endpoint, config=config)
