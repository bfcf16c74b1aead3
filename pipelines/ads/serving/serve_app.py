"""The scoring server ``agpo serve`` starts: MLflow's ``POST /invocations`` protocol and ``GET /ping`` for the pyfunc
student, with every request bounded before the model sees it.

Why our own app and not ``mlflow models serve``: MLflow's scoring server reads the whole body before looking at
it (``await request.body()``, no cap: one 20 MB ad title grew a worker from 300 MB to 3.3 GB), caps neither rows
nor text, answers its timeout with 504 while the prediction goes on in its thread, and returns errors with a
``stack_trace`` full of file paths. Here (``serving_app``), in this order:

- a ``Content-Length`` over ``max_request_bytes`` is answered 413 before a byte of the body is read; a body sent
  without one is read in pieces and refused at the first piece past the cap (413); the body must arrive within
  ``request_timeout_s`` (408);
- the body must be JSON, ``{"dataframe_split": {"columns": [...], "data": [[...]]}}`` or ``{"dataframe_records":
  [{...}]}``, with ``query`` and ``ad_title`` strings; more than ``max_rows`` pairs, or a text over ``max_text_chars``
  characters (the import's cap), is answered 422, as is anything malformed (415 for another content type);
- the model predicts ``CHUNK_ROWS`` pairs at a time in a worker thread, one chunk at a time per process (a
  capacity limiter of 1); past ``request_timeout_s`` the request is answered 504 and no further chunk of it runs,
  so a refused or timed-out request frees the worker within one chunk;
- every refusal or failure is one JSON line ``{"error_code": ..., "message": ...}`` with no stack trace and no
  path (a model failure's traceback goes to the server's log only).

The answer to a good request is MLflow's: ``{"predictions": [{"grade", "label", "p_0", ...}, ...]}``. uvicorn runs
it (``main``: ``python -m pipelines.ads.serving.serve_app``, settings in ``SETTINGS_ENV``), bound to 127.0.0.1,
with ``limit_concurrency`` (503 past it); each worker loads the model once, before it accepts a connection.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import pandas as pd
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

COLUMNS = ("query", "ad_title")
FORMATS = ("dataframe_split", "dataframe_records")
CHUNK_ROWS = 64  # pairs per model call: how long a timed-out request may still hold the worker
SETTINGS_ENV = "AGPO_SERVE_APP"  # JSON: model folder, host, port, workers, limits (what main reads)
HOW = 'give {"dataframe_split": {"columns": ["query", "ad_title"], "data": [[...]]}} or {"dataframe_records": [...]}'
SHOWN_CHARS = 40  # the most of a client's own value a message repeats
Predict = Callable[[pd.DataFrame], pd.DataFrame]
log = logging.getLogger("agpo.serve")


@dataclass(frozen=True)
class Limits:
    """What one request may ask (ServeConfig's keys of the same names)."""

    max_request_bytes: int
    max_rows: int
    max_text_chars: int
    request_timeout_s: float


class Refused(Exception):
    """A request answered with ``status`` and one line: ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def one_line(status: int, code: str, message: str) -> JSONResponse:
    """A refusal: one JSON line, and the connection closed after it (a body left unread is never read)."""
    body = {"error_code": code, "message": " ".join(message.split())}
    return JSONResponse(body, status_code=status, headers={"connection": "close"})


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}..."


async def read_body(request: Request, cap: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over ``cap`` bytes: by its Content-Length before
    reading, else at the first piece that passes it."""
    declared = request.headers.get("content-length")
    too_large = f"the body is over max_request_bytes ({cap:,} bytes): send fewer or shorter pairs per request"
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise Refused(413, "REQUEST_TOO_LARGE", too_large)
    pieces, size = [], 0
    async for piece in request.stream():
        size += len(piece)
        if size > cap:
            raise Refused(413, "REQUEST_TOO_LARGE", too_large)
        pieces.append(piece)
    return b"".join(pieces)


def table_rows(payload: object) -> list[list[object]]:
    """[query, ad_title] per pair of a ``dataframe_split`` or ``dataframe_records`` payload (422 otherwise)."""
    if not isinstance(payload, dict) or len(payload) != 1 or next(iter(payload)) not in FORMATS:
        keys = sorted(payload)[:5] if isinstance(payload, dict) else type(payload).__name__
        raise Refused(422, "MALFORMED_REQUEST", f"the body holds {shown(keys)}: {HOW}")
    ((form, table),) = payload.items()
    if form == "dataframe_records":
        if not isinstance(table, list) or not all(isinstance(r, dict) for r in table):
            raise Refused(422, "MALFORMED_REQUEST", f"dataframe_records must be a list of objects: {HOW}")
        missing = next((c for r in table for c in COLUMNS if c not in r), None)
        if missing is not None:
            raise Refused(422, "MALFORMED_REQUEST", f"a record has no {missing!r}: {HOW}")
        return [[r[c] for c in COLUMNS] for r in table]
    if not (isinstance(table, dict) and isinstance(table.get("columns"), list) and isinstance(table.get("data"), list)):
        raise Refused(422, "MALFORMED_REQUEST", f"dataframe_split needs a columns list and a data list: {HOW}")
    columns, data = table["columns"], table["data"]
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        raise Refused(422, "MALFORMED_REQUEST", f"columns {shown(columns)} lack {missing}: {HOW}")
    where = [columns.index(c) for c in COLUMNS]
    if not all(isinstance(row, list) and len(row) == len(columns) for row in data):
        raise Refused(422, "MALFORMED_REQUEST", f"every data row must be a list of {len(columns)} values: {HOW}")
    return [[row[i] for i in where] for row in data]


def pairs_frame(body: bytes, limits: Limits) -> pd.DataFrame:
    """The request's pairs as DataFrame[query, ad_title], refused (422) when malformed or over a row or text cap."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise Refused(422, "MALFORMED_REQUEST", f"the body is not JSON ({type(err).__name__})") from None
    rows = table_rows(payload)
    if len(rows) > limits.max_rows:
        raise Refused(
            422, "TOO_MANY_ROWS", f"{len(rows):,} pairs, over max_rows ({limits.max_rows:,}): split the request"
        )
    for number, row in enumerate(rows):
        for column, text in zip(COLUMNS, row, strict=True):
            if not isinstance(text, str):
                raise Refused(422, "MALFORMED_REQUEST", f"row {number}: {column} is not a string ({shown(text)})")
            if len(text) > limits.max_text_chars:
                raise Refused(
                    422,
                    "TEXT_TOO_LONG",
                    f"row {number}: {column} has {len(text):,} characters, over max_text_chars "
                    f"({limits.max_text_chars:,}, the import's cap)",
                )
    return pd.DataFrame(rows, columns=list(COLUMNS), dtype=object)


def serving_app(predict: Predict, limits: Limits) -> Starlette:
    """The ASGI app serving ``predict`` (DataFrame[query, ad_title] -> DataFrame of predictions) under ``limits``."""
    state: dict[str, Any] = {}

    async def ping(_request: Request) -> Response:
        return Response("\n", media_type="application/json")

    async def invocations(request: Request) -> Response:
        try:
            return JSONResponse({"predictions": await answer(request)})
        except Refused as refused:
            return one_line(refused.status, refused.code, refused.message)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it

    async def answer(request: Request) -> list[dict[str, Any]]:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(415, "UNSUPPORTED_MEDIA_TYPE", f"content type {shown(kind)}: send application/json")
        deadline = anyio.current_time() + limits.request_timeout_s
        try:
            with anyio.fail_after(limits.request_timeout_s):
                body = await read_body(request, limits.max_request_bytes)
        except TimeoutError:
            raise Refused(408, "REQUEST_TIMEOUT", f"the body took over {limits.request_timeout_s:g} s") from None
        frame = pairs_frame(body, limits)
        del body
        limiter = state.setdefault("limiter", anyio.CapacityLimiter(1))  # one chunk at a time in this process
        chunks = []
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                for start in range(0, len(frame), CHUNK_ROWS):
                    chunk = frame.iloc[start : start + CHUNK_ROWS].reset_index(drop=True)
                    chunks.append(await anyio.to_thread.run_sync(predict, chunk, limiter=limiter))
        except TimeoutError:
            raise Refused(
                504,
                "REQUEST_TIMEOUT",
                f"the request took over request_timeout_s ({limits.request_timeout_s:g} s) and was stopped: send "
                "fewer pairs per request",
            ) from None
        except Exception as err:  # the model's own failure: its traceback to the log, one line to the client
            log.exception("prediction failed")
            why = f"the model failed on this request ({type(err).__name__}); the server log says why"
            raise Refused(500, "INTERNAL_ERROR", why) from None
        if not chunks:
            return []
        return pd.concat(chunks, ignore_index=True).to_dict(orient="records")

    routes = [
        Route("/ping", ping, methods=["GET"]),
        Route("/health", ping, methods=["GET"]),
        Route("/invocations", invocations, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def settings_env(model: str, host: str, port: int, workers: int, max_concurrency: int, limits: Limits) -> str:
    """``SETTINGS_ENV``'s value for ``main``."""
    server = {"host": host, "port": port, "workers": workers, "max_concurrency": max_concurrency}
    return json.dumps({"model": model, **server, "limits": asdict(limits)})


def app_from_env() -> Starlette:
    """uvicorn's factory, in each worker: the pyfunc model of ``SETTINGS_ENV`` loaded, then served."""
    from pipelines.ads.serving.student_model import load_served_model

    settings = json.loads(os.environ[SETTINGS_ENV])
    model = load_served_model(settings["model"])
    return serving_app(model.predict, Limits(**settings["limits"]))


def main() -> None:
    import uvicorn

    settings = json.loads(os.environ[SETTINGS_ENV])
    uvicorn.run(
        "pipelines.ads.serving.serve_app:app_from_env",
        factory=True,
        host=settings["host"],
        port=settings["port"],
        workers=settings["workers"],
        limit_concurrency=settings["max_concurrency"],
        server_header=False,
        proxy_headers=False,
        log_level="info",
    )


if __name__ == "__main__":
    main()
