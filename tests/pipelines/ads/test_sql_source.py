"""The SQL source against a real PostgreSQL: a throwaway cluster in a temporary folder (as Debian's ``postgres``
user when the tests run as root), on a free port of 127.0.0.1, its role logging in with a SCRAM password."""

import json
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pyarrow.parquet as pq
import pytest

from deploy.datastores import postgres_bin, postgres_user
from deploy.services import ServiceError, free_port
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.sql_source import PASSWORD_FILE_ENV, READ_BYTES, describe, query_batches, read_sql, redact

pytestmark = pytest.mark.integration

try:
    BIN = postgres_bin()
except ServiceError:
    pytest.skip(
        "PostgreSQL server binaries are not installed (/usr/lib/postgresql/*/bin): run deploy/install-services.sh",
        allow_module_level=True,
    )

ROWS = 5000
PASSWORD = "p@ss:w/rd%&=? x"  # characters a URI must quote
KEPT = {"query", "product_title", "relevance"}


@dataclass(frozen=True)
class Database:
    url: str  # no password: the tests set it the ways a team would
    sockets: Path
    port: int

    def superuser(self, database: str = "pairs"):
        return psycopg2.connect(host=str(self.sockets), port=self.port, user="postgres", dbname=database)


@pytest.fixture(scope="module")
def database():
    user = postgres_user()
    home = Path(tempfile.mkdtemp(prefix="agpo-sql-"))  # under /tmp: user postgres must reach it (pytest's is 0700)
    data, sockets = home / "data", home / "run"
    for folder in (home, data, sockets):
        folder.mkdir(exist_ok=True)
        if user:
            shutil.chown(folder, user, user)
    initdb = [str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--no-locale", "-E", "UTF8"]
    initdb += ["--auth-local=trust", "--auth-host=scram-sha-256"]  # the socket folder is 0700: only its owner
    subprocess.run(initdb, cwd=home, user=user, group=user, capture_output=True, check=True)
    port = free_port()
    argv = [str(BIN / "postgres"), "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
    argv += ["-c", f"unix_socket_directories={sockets}", "-c", "unix_socket_permissions=0700", "-c", "fsync=off"]
    log = (home / "postgres.log").open("w")
    server = subprocess.Popen(argv, cwd=home, user=user, group=user, stdout=log, stderr=subprocess.STDOUT)
    db = Database(f"postgresql://ads@127.0.0.1:{port}/pairs", sockets, port)
    try:
        _wait_for(server, db, home / "postgres.log")
        _create_pairs(db)
        yield db
    finally:
        server.send_signal(signal.SIGINT)  # a fast shutdown
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
        shutil.rmtree(home, ignore_errors=True)


def _wait_for(server: subprocess.Popen, db: Database, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"postgres exited with {server.returncode}: {log.read_text()[-2000:]}")
        try:
            db.superuser("postgres").close()
            return
        except psycopg2.OperationalError:
            time.sleep(0.1)
    pytest.fail(f"postgres did not accept connections in 60 s: {log.read_text()[-2000:]}")


def _create_pairs(db: Database) -> None:
    """Role ``ads`` (password PASSWORD) owning database ``pairs``, whose table ``pairs`` holds ROWS query-ad pairs
    (id i: query 'query i', product_title 'title i' but NULL for id 7, relevance i % 4, notes 'note i')."""
    admin = db.superuser("postgres")
    admin.autocommit = True  # CREATE DATABASE cannot run in a transaction
    admin.cursor().execute("CREATE ROLE ads LOGIN PASSWORD %s", (PASSWORD,))
    admin.cursor().execute("CREATE DATABASE pairs OWNER ads")
    admin.close()
    with db.superuser() as connection, connection.cursor() as cursor:
        cursor.execute("SET ROLE ads")
        cursor.execute("CREATE TABLE pairs (id int, query text, product_title text, relevance int, notes text)")
        cursor.execute(
            "INSERT INTO pairs SELECT i, 'query ' || i, CASE WHEN i = 7 THEN NULL ELSE 'title ' || i END, mod(i, 4), "
            "'note ' || i FROM generate_series(0, %s) AS i",
            (ROWS - 1,),
        )
    connection.close()


@pytest.fixture(autouse=True)
def no_password(monkeypatch, tmp_path):
    """No password reaches libpq but the one a test sets (nor a ~/.pgpass of whoever runs the tests)."""
    for name in ("PGPASSWORD", PASSWORD_FILE_ENV, "PGOPTIONS", "PGSERVICE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


def password_file(folder: Path) -> str:
    path = folder / "password"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return str(path)


def pgpass(folder: Path) -> str:
    path = folder / "pgpass"
    escaped = PASSWORD.replace("\\", "\\\\").replace(":", "\\:")
    path.write_text(f"127.0.0.1:*:pairs:ads:{escaped}\n")
    path.chmod(0o600)  # libpq ignores a pgpass file others may read
    return str(path)


@pytest.mark.parametrize("way", ["PGPASSWORD", "PGPASSFILE", PASSWORD_FILE_ENV])
def test_rows_stream_out_in_order_with_their_values(database, monkeypatch, tmp_path, way):
    value = {"PGPASSWORD": PASSWORD, "PGPASSFILE": pgpass(tmp_path), PASSWORD_FILE_ENV: password_file(tmp_path)}
    monkeypatch.setenv(way, value[way])
    query = "SELECT query, product_title, relevance, notes FROM pairs ORDER BY id"
    rows = [row for row, _ in read_sql(database.url, query, 500, ["query", "product_title"], KEPT)]
    assert [row.number for row in rows] == list(range(ROWS))
    assert all(row.problem is None and set(row.values) == KEPT for row in rows)  # notes is never kept
    assert rows[7].values == {"query": "query 7", "product_title": None, "relevance": 3}
    assert rows[4321].values == {"query": "query 4321", "product_title": "title 4321", "relevance": 1}


def test_the_password_file_wins_over_a_wrong_pgpassword(database, monkeypatch, tmp_path):
    monkeypatch.setenv("PGPASSWORD", "not-the-password")
    monkeypatch.setenv(PASSWORD_FILE_ENV, password_file(tmp_path))
    assert next(read_sql(database.url, "SELECT query FROM pairs", 10, ["query"], {"query"}))[0].number == 0


def test_batches_hold_at_most_batch_rows_and_the_kept_columns(database, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    batches = list(query_batches(database.url, "SELECT * FROM pairs ORDER BY id", 128, ["query"], {"relevance"}))
    assert [batch.num_rows for batch in batches] == [128] * (ROWS // 128) + [ROWS % 128]
    assert {tuple(batch.schema.names) for batch in batches} == {("query", "relevance")}


def test_a_large_result_is_never_held_whole(database, monkeypatch):
    """200,000 rows of ~210 bytes (~40 MiB) in batches of 1,000: each batch is a slice of an Arrow batch of
    about READ_BYTES (its buffers, which a slice shares, are what it holds), never of the whole result."""
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    query = "SELECT 'query ' || i AS query, repeat('x', 200) || i AS product_title FROM generate_series(1, 200000) i"
    batches = query_batches(database.url, query, 1000, ["query", "product_title"])
    rows = held = largest = 0
    for batch in batches:  # consumed one at a time: nothing keeps a batch once the next arrives
        assert batch.num_rows <= 1000
        rows += batch.num_rows
        held = max(held, batch.get_total_buffer_size())
        largest = max(largest, batch.nbytes)
    assert rows == 200_000
    assert held <= 1.5 * READ_BYTES < 40 * 2**20 // 2
    assert largest < 300_000  # 1,000 rows of ~220 bytes


def test_a_missing_column_names_it(database, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with pytest.raises(ContractError, match=r"has no column\(s\) \['ad_title'\].*input.columns") as err:
        next(read_sql(database.url, "SELECT query FROM pairs", 10, ["query", "ad_title"], {"query", "ad_title"}))
    assert describe(database.url) in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://ads:hunter2-x@{host}",
        "postgresql://ads:hun/ter?2@-x@{host}",  # unquoted: '/', '?' and '@' in the password
        "postgresql://ads@{host}?sslmode=prefer&password=hunter2-x",
    ],
)
def test_a_url_holding_a_password_is_refused_without_showing_it(database, url):
    host = f"127.0.0.1:{database.port}/pairs"
    with pytest.raises(ContractError, match="holds a password.*PGPASSWORD.*" + PASSWORD_FILE_ENV) as err:
        next(read_sql(url.format(host=host), "SELECT query FROM pairs", 10, [], {"query"}))
    message = str(err.value)
    assert "hunter" not in message and "ter" not in message and message.startswith(f"postgresql://ads@{host}")


def test_a_wrong_password_fails_in_one_line_without_it(database, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "wrong-secret-42")
    with pytest.raises(ContractError) as err:
        next(read_sql(database.url, "SELECT query FROM pairs", 10, [], {"query"}))
    message = str(err.value)
    assert "\n" not in message and "wrong-secret-42" not in message and PASSWORD not in message
    assert message.startswith(database.url) and 'password authentication failed for user "ads"' in message
    assert PASSWORD_FILE_ENV in message  # the fix


@pytest.mark.parametrize(
    ("query", "problem", "fix"),
    [
        ("SELECT query FROM no_such_table", 'relation "no_such_table" does not exist', "fix input.query"),
        ("SELEC query FROM pairs", 'syntax error at or near "SELEC"', "fix input.query"),
        ("   ", "input.query is empty", "set it"),
        ("SELECT 'q' || (1 / (i - 3)) AS query FROM generate_series(0, 5) i", "division by zero", "fix input.query"),
    ],
)
def test_a_bad_query_fails_in_one_line(database, monkeypatch, tmp_path, query, problem, fix):
    monkeypatch.setenv(PASSWORD_FILE_ENV, password_file(tmp_path))
    with pytest.raises(ContractError) as err:
        list(read_sql(database.url, query, 10, ["query"], {"query"}))
    message = str(err.value)
    assert "\n" not in message and PASSWORD not in message and message.startswith(database.url)
    assert problem in message and fix in message


def test_a_server_that_is_not_there_fails_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(PASSWORD_FILE_ENV, password_file(tmp_path))
    url = f"postgresql://ads@127.0.0.1:{free_port()}/pairs"
    with pytest.raises(ContractError, match=r"Connection refused.*check the host, port") as err:
        next(read_sql(url, "SELECT 1 AS query", 10, ["query"], {"query"}))
    assert "\n" not in str(err.value) and PASSWORD not in str(err.value) and str(err.value).startswith(url)


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM pairs RETURNING *",
        "UPDATE pairs SET query = 'changed' RETURNING id",
        "WITH gone AS (DELETE FROM pairs RETURNING *) SELECT * FROM gone",
        "DROP TABLE pairs",
        "CREATE TABLE copied AS SELECT * FROM pairs",
    ],
)
def test_a_write_is_refused_by_the_read_only_transaction(database, monkeypatch, statement):
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    with pytest.raises(ContractError, match=r"read-only transaction.*must only read") as err:
        list(read_sql(database.url, statement, 10, [], {"query"}))
    assert "\n" not in str(err.value)
    with database.superuser() as connection, connection.cursor() as cursor:
        cursor.execute("SELECT count(*), count(*) FILTER (WHERE query = 'changed') FROM pairs")
        assert cursor.fetchone() == (ROWS, 0)
        cursor.execute("SELECT to_regclass('copied')")
        assert cursor.fetchone() == (None,)
    connection.close()


def test_describe_and_redact_drop_passwords():
    assert (
        describe("postgresql://ads:pw@db:5432/pairs?sslmode=require")
        == "postgresql://ads@db:5432/pairs?sslmode=require"
    )
    assert describe("postgres://db/pairs?sslpassword=k") == "postgres://db/pairs?sslpassword=***"
    assert describe("postgresql://h1:1,h2:2/pairs") == "postgresql://h1:1,h2:2/pairs"
    message = 'cannot reach postgresql://ads:pw@db/pairs: "s3 cr%et" refused'
    assert redact(message, "s3 cr%et") == 'cannot reach postgresql://***@db/pairs: "***" refused'
    assert describe("postgresql://ads:p@ss/w?rd@db/pairs") == "postgresql://ads@db/pairs"  # an unquoted password
    assert describe("host=db password=pw") == "(input.path, not a URL)"


def test_data_import_reads_a_query_end_to_end(database, monkeypatch, tmp_path, capsys):
    """`agpo data import` with a postgresql:// input.path and input.query: every row accounted for (the NULL title
    quarantined), the pairs written, the password in no output."""
    from pipelines.cli import main

    monkeypatch.setenv(PASSWORD_FILE_ENV, password_file(tmp_path))
    args = ["data", "import", "--set", f"input.path={database.url}"]
    args += ["--set", "input.query=SELECT id, query, product_title, relevance FROM pairs WHERE id < 400"]
    args += ["--set", "input.columns={ad_title: product_title, gold_grade: relevance}"]
    args += ["--set", f"out_dir={tmp_path / 'out'}"]
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads((tmp_path / "out" / "data_summary.json").read_text())
    assert summary["rows"]["in"] == 400 and summary["quarantined_by_reason"] == {"missing_field": 1}
    assert summary["rows"]["pairs"] + summary["rows"]["quarantined"] + summary["rows"]["filtered"] == 400
    assert PASSWORD not in captured.out + captured.err


def test_score_reads_a_query_end_to_end(database, monkeypatch, tmp_path, capsys):
    """`agpo score` with a postgresql:// input.path and input.query (the annotation stage reads its input through
    the same InputConfig): each row scored or quarantined (the NULL title), in the query's order, the password in
    no output."""
    from pipelines.cli import main
    from student.model import RelevanceStudent, StudentConfig

    texts = [f"query {i} title {i}" for i in range(50)]
    RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts).save(tmp_path / "student")
    monkeypatch.setenv(PASSWORD_FILE_ENV, password_file(tmp_path))
    args = ["score", "--set", f"input.path={database.url}", "--set", f"model={tmp_path / 'student'}"]
    args += ["--set", "input.query=SELECT id AS pair_id, query, product_title AS ad_title FROM pairs WHERE id < 120"]
    args += ["--set", f"out_dir={tmp_path / 'out'}", "--set", "threads=1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    scored = [r for p in sorted((out / "scores").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert (summary["rows_in"], summary["scored"], summary["quarantined"]) == (120, 119, 1)
    assert [r["pair_id"] for r in scored] == [str(i) for i in range(120) if i != 7]
    assert PASSWORD not in captured.out + captured.err
