"""The object store on a real SeaweedFS (``deploy/object_store.py``): what pyarrow writes there reads back equal,
signed or anonymous; a wrong secret, an anonymous write to a closed bucket and a reader's write are refused;
``If-None-Match: *`` never overwrites; stop() ends the process. One store per session (``s3_store``), one more
here for anonymous access and one for stop()."""

from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from deploy import services
from deploy.object_store import Identity, default_identities, start_object_store

OPEN = "open-to-all"  # the bucket the ``anonymous`` identity of ``open_store`` may read, write and list


def s3(env: dict[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 filesystem signed with ``env``'s keys (``ObjectStore.env``)."""
    return pafs.S3FileSystem(
        access_key=env["AWS_ACCESS_KEY_ID"],
        secret_key=env["AWS_SECRET_ACCESS_KEY"],
        endpoint_override=env["AWS_ENDPOINT_URL"],
        region=env["AWS_REGION"],
    )


def write(filesystem: pafs.FileSystem, path: str, data: bytes) -> None:
    with filesystem.open_output_stream(path) as out:
        out.write(data)


def read(filesystem: pafs.FileSystem, path: str) -> bytes:
    with filesystem.open_input_stream(path) as stream:
        return stream.read()


@pytest.fixture(scope="module")
def open_store(tmp_path_factory):
    """A store whose ``anonymous`` identity may read, write and list bucket ``OPEN`` only."""
    anonymous = Identity("anonymous", "", "", (f"Read:{OPEN}", f"Write:{OPEN}", f"List:{OPEN}"))
    store = start_object_store(tmp_path_factory.mktemp("open-store"), [*default_identities(), anonymous])
    store.create_bucket(OPEN)
    yield store
    store.stop()


def test_a_parquet_file_of_100k_rows_round_trips_signed(s3_env):
    table = pa.table({"id": pa.array(range(100_000)), "text": pa.array([f"row {i}" for i in range(100_000)])})
    # pyarrow 25 reads AWS_ENDPOINT_URL only through from_uri; S3FileSystem() would go to AWS itself
    filesystem, path = pafs.FileSystem.from_uri(f"s3://{s3_env}/rows.parquet")
    assert pafs.S3FileSystem().__reduce__()[1][0]["endpoint_override"] == ""
    pq.write_table(table, path, filesystem=filesystem)
    assert pq.read_table(path, filesystem=filesystem).equals(table)
    write(filesystem, f"{s3_env}/raw.bin", bytes(range(256)) * 1000)
    assert read(filesystem, f"{s3_env}/raw.bin") == bytes(range(256)) * 1000


def test_anonymous_requests_round_trip_only_in_the_open_bucket(open_store, monkeypatch):
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")  # read when the filesystem is made
    anonymous = pafs.S3FileSystem(anonymous=True, endpoint_override=open_store.endpoint, region="us-east-1")
    write(anonymous, f"{OPEN}/plain.bin", b"hello anonymous")
    assert read(anonymous, f"{OPEN}/plain.bin") == b"hello anonymous"
    open_store.create_bucket("closed")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        write(anonymous, "closed/plain.bin", b"hello")
    # Without it the SDK's default (when_supported) sends an unsigned body as aws-chunked with a trailing CRC64,
    # and SeaweedFS 4.48 stores that framing as the object's bytes: reads give back the chunk header, the data,
    # the terminating chunk and the trailer. Signed uploads are decoded right either way.
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    chunked = pafs.S3FileSystem(anonymous=True, endpoint_override=open_store.endpoint, region="us-east-1")
    write(chunked, f"{OPEN}/chunked.bin", b"hello anonymous")
    assert read(chunked, f"{OPEN}/chunked.bin").startswith(b"F\r\nhello anonymous\r\n0\r\nx-amz-checksum-")
    signed = s3(open_store.env("admin"))
    write(signed, f"{OPEN}/signed.bin", b"hello signed")
    assert read(signed, f"{OPEN}/signed.bin") == b"hello signed"


def test_a_wrong_secret_is_refused(s3_store, s3_env):
    write(s3(s3_store.env("admin")), f"{s3_env}/kept.bin", b"kept")
    wrong = s3({**s3_store.env("admin"), "AWS_SECRET_ACCESS_KEY": "0" * 40})
    with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH"):
        write(wrong, f"{s3_env}/forged.bin", b"forged")
    with pytest.raises(OSError, match="ACCESS_DENIED during HeadObject"):  # a HEAD's answer has no body to say why
        read(wrong, f"{s3_env}/kept.bin")


def test_if_none_match_never_overwrites(s3_env):
    client = boto3.client("s3")  # from s3_env's environment
    client.put_object(Bucket=s3_env, Key="once", Body=b"first")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3_env, Key="once", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=s3_env, Key="once")["Body"].read() == b"first"
    client.put_object(Bucket=s3_env, Key="new", Body=b"new", IfNoneMatch="*")
    assert client.get_object(Bucket=s3_env, Key="new")["Body"].read() == b"new"


def test_the_reader_reads_but_may_not_write(s3_store, s3_env):
    write(s3(s3_store.env("admin")), f"{s3_env}/shared.bin", b"shared")
    reader = s3(s3_store.env("reader"))
    assert read(reader, f"{s3_env}/shared.bin") == b"shared"
    assert [info.path for info in reader.get_file_info(pafs.FileSelector(s3_env))] == [f"{s3_env}/shared.bin"]
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        write(reader, f"{s3_env}/mine.bin", b"mine")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        reader.delete_file(f"{s3_env}/shared.bin")
    assert read(reader, f"{s3_env}/shared.bin") == b"shared"


def test_stop_ends_the_process_while_another_store_runs_on(s3_store, tmp_path):
    second = start_object_store(tmp_path / "second")
    port = int(second.endpoint.rsplit(":", 1)[1])
    assert second.endpoint != s3_store.endpoint and services.port_open(port)
    secret = second.identities["admin"].secret_key
    assert secret not in Path(f"/proc/{second.pid}/cmdline").read_text() and secret not in repr(second)
    assert (tmp_path / "second" / "identities.json").stat().st_mode & 0o777 == 0o600
    second.stop()
    assert services.session_processes(second.pid) == [] and services.recorded_pid(tmp_path / "second", "weed") is None
    assert not services.port_open(port)
    assert secret not in (tmp_path / "second" / "logs" / "weed.log").read_text()
    assert services.port_open(int(s3_store.endpoint.rsplit(":", 1)[1]))  # the session's store is untouched
