"""``agpo serve`` as a user starts it, with its default caps (1 MiB, 1,024 rows, the import's 1,000 characters):
an oversized body is refused before it arrives, too many rows or too long a text is 422, a malformed request is one
line without a stack trace or path, and good requests are still answered with the model's grades (issue 58, item
3, and the serving "low" finding: MLflow's scoring server read any body whole, answered all of these 200 or with a
stack trace, and took 15.7 s and 3 GB for one 20 MB ad title)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from evaluation.lexical import LexicalMatcher

pytestmark = pytest.mark.integration
QUERIES, ADS = ["red shoes", "mug", "sofa"], ["red shoes nike", "mug", "blue hat"]


def raw(port: int, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    """Send ``head`` and ``body`` as they are, then read the answer until the server closes: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(head.encode() + body)
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except TimeoutError:
            pass
    assert data, f"no answer within {timeout} s"
    return int(data.split(b" ", 2)[1]), data.split(b"\r\n\r\n", 1)[-1]


def post(port: int, payload: object) -> tuple[int, bytes]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = f"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return raw(port, head + "Connection: close\r\n\r\n", body)


def split(rows) -> dict:
    return {"dataframe_split": {"columns": ["query", "ad_title"], "data": [list(r) for r in rows]}}


def one_line(body: bytes) -> str:
    text = body.decode()
    assert "Traceback" not in text and "stack_trace" not in text and ".py" not in text, text[:500]
    message = json.loads(text)["message"]
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``agpo serve --set model=<a lexical matcher's folder>`` on a free port, until the module is done."""
    root = tmp_path_factory.mktemp("serve-limits")
    matcher = LexicalMatcher(4).fit(QUERIES * 2, ADS * 2, [3, 3, 0, 0, 2, 1])
    folder = matcher.save(root / "lexical")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agpo = Path(sys.executable).parent / "agpo"
    command = [str(agpo), "serve", "--set", f"model={folder}", "--set", f"port={port}"]
    log = (root / "serve.log").open("w")
    process = subprocess.Popen(
        [*command, "--set", f"out_dir={root / 'serve'}"], stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy()
    )
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, (root / "serve.log").read_text()[-2000:]
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "agpo serve did not answer /ping within 90 s"
            time.sleep(0.3)
    yield port, matcher.predict_proba(QUERIES, ADS)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0
    log.close()


def test_a_body_declared_over_the_cap_is_refused_before_it_arrives(server):
    port, _ = server
    head = "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    started = time.monotonic()
    status, body = raw(port, head + f"Content-Length: {20 * 2**20}\r\n\r\n", b'{"dataframe_split": {')
    assert status == 413 and time.monotonic() - started < 5
    assert "max_request_bytes" in one_line(body)


@pytest.mark.parametrize(
    ("rows", "says"),
    [([("red shoes", "mug")] * 1025, "over max_rows (1,024)"), ([("red shoes", "x" * 1001)], "max_text_chars (1,000")],
    ids=["rows", "text"],
)
def test_too_many_rows_or_too_long_a_text_is_422(server, rows, says):
    status, body = post(server[0], split(rows))
    assert status == 422 and says in one_line(body)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"dataframe_split": {"columns": ["query", "ad_title"], "data": [["red', "not JSON"),
        (json.dumps({"dataframe_split": {"columns": ["query"], "data": [["red shoes"]]}}).encode(), "ad_title"),
        (json.dumps(split([(None, "mug")])).encode(), "row 0"),
    ],
    ids=["truncated-json", "missing-column", "null-text"],
)
def test_a_malformed_request_is_one_line_without_a_stack_trace_or_path(server, body, says):
    """MLflow's server answered these 400, with a message of several lines, or (a null text) with a "stack_trace"
    of the server's file paths."""
    status, answer = post(server[0], body)
    message = one_line(answer)
    assert status == 422 and says in message


def test_good_requests_are_still_answered_with_the_models_grades(server):
    port, expected = server
    status, body = post(port, split(zip(QUERIES, ADS, strict=True)))
    assert status == 200
    predictions = json.loads(body)["predictions"]
    served = np.array([[p[f"p_{k}"] for k in range(4)] for p in predictions])
    assert np.abs(served - expected).max() <= 1e-6
