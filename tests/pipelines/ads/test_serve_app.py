"""The scoring server's bounds, on a real uvicorn on 127.0.0.1 with a stand-in model (no model to load, so fast): an
oversized body is refused before it is read (by its Content-Length, or at the first piece past the cap when it has
none), too many rows or too long a text is 422, malformed input and a model failure are one line with no stack
trace or path, and a request past its timeout is 504 with the model stopped after its current chunk."""

import contextlib
import json
import socket
import threading
import time

import pandas as pd
import pytest
import uvicorn

from pipelines.ads.serving.serve_app import CHUNK_ROWS, Limits, serving_app
from pipelines.ads.serving.serve_config import IMPORT_TEXT_CHARS, ServeConfig

LIMITS = Limits(max_request_bytes=64 * 1024, max_rows=100, max_text_chars=IMPORT_TEXT_CHARS, request_timeout_s=5.0)


class StandIn:
    """A model that grades by text length, counts its calls, and sleeps ``seconds`` or raises when told."""

    def __init__(self, seconds: float = 0.0, fail: bool = False) -> None:
        self.seconds, self.fail, self.calls = seconds, fail, 0

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        self.calls += 1
        time.sleep(self.seconds)
        if self.fail:
            raise ValueError("/home/someone/model/student_pyfunc.py: broken")
        return pd.DataFrame({"grade": frame["ad_title"].str.len() % 4, "p_0": 0.25})


@pytest.fixture
def serve():
    """serve(model, limits) -> port of a uvicorn serving ``serving_app`` in a thread, stopped after the test."""
    servers = []

    def start(model, limits=LIMITS) -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(serving_app(model, limits), host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread))
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return port

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=10)


def exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 5.0) -> tuple[int, dict, float]:
    """Send ``head`` and ``body`` raw (the body may be cut short of what the head declares), then read the answer:
    (status, JSON body or {}, seconds)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head)
        with contextlib.suppress(OSError):  # the server answered and closed before the whole body went
            conn.sendall(body)
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except OSError:
            pass
    status = int(data.split(b" ", 2)[1])
    payload = data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""
    try:
        parsed = json.loads(payload) if payload.strip() else {}
    except ValueError:
        parsed = {"raw": payload.decode(errors="replace")}
    return status, parsed, time.monotonic() - started


def post(port: int, payload: object, content_type: str = "application/json") -> tuple[int, dict, float]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = (
        f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return exchange(port, head, body)


def split(rows) -> dict:
    return {"dataframe_split": {"columns": ["query", "ad_title"], "data": [list(r) for r in rows]}}


def one_line_without_trace(answer: dict) -> None:
    message = answer["message"]
    assert set(answer) == {"error_code", "message"}, answer
    assert "\n" not in message and "Traceback" not in message and ".py" not in message and "/home" not in message


def test_a_good_request_is_answered_as_mlflow_answers(serve):
    port = serve(StandIn())
    status, answer, _ = post(port, split([("red shoes", "abc"), ("mug", "abcd")]))
    assert status == 200 and answer == {"predictions": [{"grade": 3, "p_0": 0.25}, {"grade": 0, "p_0": 0.25}]}
    records = {"dataframe_records": [{"query": "red shoes", "ad_title": "abc"}]}
    assert post(port, records)[:2] == (200, {"predictions": [{"grade": 3, "p_0": 0.25}]})
    assert post(port, split([]))[:2] == (200, {"predictions": []})


def test_an_oversized_body_is_refused_by_its_length_before_it_is_read(serve):
    """The head declares 20 MiB and no body follows: the answer comes at once (a server that reads first waits)."""
    port = serve(StandIn())
    head = (
        f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {20 * 2**20}"
        "\r\n\r\n"
    ).encode()
    status, answer, seconds = exchange(port, head, b'{"dataframe_split": ')
    assert status == 413 and answer["error_code"] == "REQUEST_TOO_LARGE" and seconds < 2
    one_line_without_trace(answer)


def test_a_body_without_a_length_is_refused_at_the_first_piece_past_the_cap(serve):
    port = serve(StandIn())
    head = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b"Transfer-Encoding: chunked\r\n\r\n"
    piece = b"x" * 16384
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(6))  # 96 KiB, never terminated
    status, answer, seconds = exchange(port, head, chunks)
    assert status == 413 and seconds < 2
    one_line_without_trace(answer)


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        (split([("q", "a")] * 101), 422, "TOO_MANY_ROWS"),
        (split([("q", "a" * (IMPORT_TEXT_CHARS + 1))]), 422, "TEXT_TOO_LONG"),
        (b'{"dataframe_split": ', 422, "MALFORMED_REQUEST"),
        (b"\xff\xfe not text", 422, "MALFORMED_REQUEST"),
        (b"[" * 50_000, 422, "MALFORMED_REQUEST"),
        ({"dataframe_split": {"columns": ["query"], "data": [["q"]]}}, 422, "MALFORMED_REQUEST"),
        (split([("q", 7)]), 422, "MALFORMED_REQUEST"),
        ({"instances": [1]}, 422, "MALFORMED_REQUEST"),
    ],
    ids=["rows", "text", "truncated-json", "not-utf8", "deep-nesting", "no-ad-title", "number", "other-format"],
)
def test_a_request_over_a_cap_or_malformed_is_one_line_and_the_model_never_sees_it(serve, payload, status, code):
    model = StandIn()
    port = serve(model)
    got, answer, _ = post(port, payload)
    assert (got, answer["error_code"]) == (status, code), answer
    one_line_without_trace(answer)
    assert model.calls == 0
    assert post(port, split([("q", "a")]))[0] == 200  # the worker is free


def test_another_content_type_is_415(serve):
    got, answer, _ = post(serve(StandIn()), b"query,ad_title\nq,a\n", "text/csv")
    assert got == 415
    one_line_without_trace(answer)


def test_a_model_failure_is_one_line_without_its_trace_or_path(serve):
    got, answer, _ = post(serve(StandIn(fail=True)), split([("q", "a")]))
    assert (got, answer["error_code"]) == (500, "INTERNAL_ERROR") and "ValueError" in answer["message"]
    one_line_without_trace(answer)


def test_a_request_past_its_timeout_is_504_and_the_model_stops_after_its_chunk(serve):
    """20 chunks of 0.2 s with a 0.5 s timeout: 504 after about 0.6 s, and no chunk runs after it (MLflow's
    scoring server answers 504 too, but its thread goes on with the whole request)."""
    model = StandIn(seconds=0.2)
    limits = Limits(max_request_bytes=2**20, max_rows=CHUNK_ROWS * 20, max_text_chars=100, request_timeout_s=0.5)
    port = serve(model, limits)
    got, answer, seconds = post(port, split([("q", "a")] * (CHUNK_ROWS * 20)))
    assert (got, answer["error_code"]) == (504, "REQUEST_TIMEOUT") and seconds < 2
    one_line_without_trace(answer)
    calls = model.calls
    time.sleep(0.5)
    assert model.calls == calls <= 4  # stopped, not 20
    assert post(port, split([("q", "a")]))[0] == 200


def test_the_caps_are_config_keys_with_the_imports_text_cap():
    config = ServeConfig()
    assert (config.max_request_bytes, config.max_rows, config.max_text_chars) == (2**20, 1024, IMPORT_TEXT_CHARS)
    assert IMPORT_TEXT_CHARS == 1000
    with pytest.raises(ValueError, match="request_timeout_s"):
        ServeConfig(request_timeout_s=0)
