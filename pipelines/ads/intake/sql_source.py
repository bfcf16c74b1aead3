"""Read query-ad pairs from a PostgreSQL query as the rows :mod:`pipelines.ads.intake.readers` yields for a file:
``input.path`` is the database URL (``postgresql://user@host:5432/db``), ``input.query`` the SQL. What it
guarantees:

- Streamed: the result comes through ADBC as Arrow batches of about ``READ_BYTES`` (the driver's batch size
  hint), cut into slices of at most ``batch_rows`` rows before they become Python rows, so memory does not grow
  with the result. The result must hold the required columns (alias them in the query, or map them with
  input.columns); only the kept ones become rows (select only what you need: the others still cross the wire).
- Read only: the query runs in a ``READ ONLY`` transaction that is never committed, so a write (``DELETE``,
  ``UPDATE``, ``CREATE``, a writing function) is refused by the server; no SQL is parsed here. It guards against
  a mistaken query, not a hostile one: give the role SELECT rights only.
- The password never in the URL: a URL holding one (``user:pw@`` or ``?password=``) is refused. libpq reads it
  from ``PGPASSWORD`` or ``~/.pgpass`` (``PGPASSFILE``), or this module from the file ``AGPO_SQL_PASSWORD_FILE``
  names (one line; it goes into the connection URI in memory only and wins over the others). Every error is one
  ContractError line naming the URL without its password (``describe``), the problem and the fix; a driver's
  message is passed through ``redact``.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import pyarrow as pa

from pipelines.ads.intake.arrow_rows import arrow_rows, check_file_columns, row_bytes, undecodable
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.intake.ingest import RawRow
from pipelines.config import REDACTED, is_secret_key, redact_urls

if TYPE_CHECKING:
    from adbc_driver_manager.dbapi import Cursor

SCHEMES = ("postgresql", "postgres")
PASSWORD_FILE_ENV = "AGPO_SQL_PASSWORD_FILE"  # a file holding the password, one line
READ_BYTES = 8 * 2**20  # ADBC's batch size hint: about this much of the result is decoded at a time
MAX_PROBLEM_CHARS = 400  # of a driver's message in an error
PASSWORD_FIX = f"set PGPASSWORD, a ~/.pgpass line (or PGPASSFILE), or {PASSWORD_FILE_ENV} (a file holding the password)"


def read_sql(url: str, query: str, batch_rows: int, wanted: list[str], keep: set[str]) -> Iterator[tuple[RawRow, int]]:
    """(row, bytes its values hold) for each row of ``query``'s result, numbered from 0, holding the ``keep``
    columns only; the result must have the ``wanted`` ones (else a ContractError naming them)."""
    number = 0
    for batch in query_batches(url, query, batch_rows, wanted, keep):
        for values, size in zip(arrow_rows(batch), row_bytes(batch), strict=True):
            yield RawRow(number, values, undecodable(values)), size
            number += 1


def query_batches(
    url: str, query: str, batch_rows: int, wanted: Collection[str] = (), keep: Collection[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """``query``'s result, streamed in Arrow batches of at most ``batch_rows`` rows, in a read-only transaction;
    ``keep``: the columns kept (default: all). The connection closes when the iterator ends or is closed."""
    from adbc_driver_manager import Error
    from adbc_driver_postgresql import StatementOptions, dbapi

    if not query.strip():
        raise ContractError(f"{describe(url)}: input.query is empty; set it, e.g. --set input.query='SELECT ...'")
    uri, password = _connection_uri(url)
    try:
        with dbapi.connect(uri) as connection, connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")  # autocommit is off: the transaction the query runs in
            cursor.adbc_statement.set_options(**{StatementOptions.BATCH_SIZE_HINT_BYTES.value: str(READ_BYTES)})
            yield from _stream(url, cursor, query, batch_rows, wanted, keep)
    except (Error, OSError, pa.ArrowException) as err:  # OSError: a failure mid-stream (libpq)
        raise ContractError(f"{describe(url)}: {redact(_one_line(err), password)}; {_fix(str(err))}") from None


def _stream(
    url: str, cursor: Cursor, query: str, batch_rows: int, wanted: Collection[str], keep: Collection[str] | None
) -> Iterator[pa.RecordBatch]:
    cursor.execute(query)
    reader = cursor.fetch_record_batch()  # a RecordBatchReader: read a batch at a time, as consumed
    names = reader.schema.names
    kept = set(names) if keep is None else set(keep) | set(wanted)
    check_file_columns(describe(url), names, list(wanted), kept)
    indices = [i for i, name in enumerate(names) if name in kept]
    for batch in reader:
        batch = batch.select(indices)
        for start in range(0, batch.num_rows, batch_rows):
            yield batch.slice(start, batch_rows)


def _connection_uri(url: str) -> tuple[str, str | None]:
    """(the URI to connect with, the password it holds, from ``AGPO_SQL_PASSWORD_FILE``, or None): a URL that is
    not postgresql:// or that holds a password itself is refused."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ContractError(f"{describe(url)} is not a PostgreSQL URL; write postgresql://user@host:5432/dbname")
    given = [key for key, _ in parse_qsl(parts.query, keep_blank_values=True) if key.lower() == "password"]
    if ":" in _user_info(url)[1] or given:  # an unquoted password may hold '/' or '@': to the URL's last '@'
        raise ContractError(
            f"{describe(url)}: the URL holds a password (or a ':' before an '@': write another '@' as %40), which "
            f"configs, logs and process lists would show; take it out and {PASSWORD_FIX}"
        )
    file = os.environ.get(PASSWORD_FILE_ENV)
    if not file:
        return url, None  # libpq reads PGPASSWORD or ~/.pgpass itself
    password = _read_password(Path(file))
    query = "&".join(part for part in (parts.query, f"password={quote(password, safe='')}") if part)
    return urlunsplit(parts._replace(query=query)), password


def _read_password(path: Path) -> str:
    try:
        password = path.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as err:
        raise ContractError(f"cannot read {PASSWORD_FILE_ENV}={path} ({type(err).__name__}); fix the path") from None
    if not password or "\n" in password:
        raise ContractError(f"{PASSWORD_FILE_ENV}={path} must hold the password on one line; fix the file")
    return password


def describe(url: str) -> str:
    """``url`` without its password or any secret query value (``sslpassword=``), for logs and messages:
    ``postgresql://ads@db:5432/pairs``. User info runs to the URL's last '@' (an unquoted password may hold
    '/', '?' or '@')."""
    if "://" not in url:
        return "(input.path, not a URL)"
    start, user_info, rest = _user_info(url)
    user = user_info.partition(":")[0]
    parts = urlsplit(start + (f"{user}@" if user else "") + rest)
    query = "&".join(
        f"{part.partition('=')[0]}={REDACTED}" if is_secret_key(part.partition("=")[0]) else part
        for part in parts.query.split("&")
        if part
    )
    return urlunsplit(parts._replace(query=query))


def _user_info(url: str) -> tuple[str, str, str]:
    """(scheme://, user info, the rest) of ``url``: the user info runs to its last '@'."""
    scheme, mark, rest = url.partition("://")
    user_info, at, after = rest.rpartition("@")
    return scheme + mark, user_info, after if at else rest


def redact(text: str, password: str | None = None) -> str:
    """``text`` (a URL or a driver's message) without URL user info, secret query values or ``password``."""
    text = redact_urls(text)
    if password:
        text = text.replace(password, REDACTED).replace(quote(password, safe=""), REDACTED)
    return text


def _one_line(err: BaseException) -> str:
    """The driver's message on one line, without the query it echoes (``LINE 1: ...``, ``Query was: ...``)."""
    text = " ".join(str(err).split("Query was:")[0].split("\nLINE ")[0].split()).removesuffix(".")
    return text[:MAX_PROBLEM_CHARS] or type(err).__name__


def _fix(message: str) -> str:
    if "read-only transaction" in message:
        return "input.query must only read (it runs in a read-only transaction): write a SELECT"
    if "password authentication failed" in message or "no password supplied" in message:
        return PASSWORD_FIX
    if "Failed to connect" in message:
        return "check the host, port, database and user in input.path, and that the server is up and reachable"
    return "fix input.query"
