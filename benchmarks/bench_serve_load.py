"""Load test of ``agpo serve``: good requests' latency and the server's memory, alone and under a stream of oversized
and malformed requests mixed in, on 127.0.0.1, bounded in count and time.

1. A model folder: a tiny cross student (BPE vocab 300, hidden 32, untrained: its speed is what counts; ONNX graph;
   ``--model tiny``) or a lexical matcher (``--model lexical``), served by ``agpo serve --set model=<folder>`` with
   its default caps (1 MiB a body, 1,024 rows, 1,000 characters a text, 30 s a request) on a free port.
2. Phase ``good``: ``--requests`` good requests of ``--pairs`` synthetic pairs each, from ``--clients`` threads.
3. Phase ``abusive``: as many good requests again, each followed by one abusive request, in turn: a body declared as
   20 MiB (its head and 64 KiB sent), a chunked body sent past 1 MiB, 1,025 rows, a 20,000-character ad title,
   truncated JSON, a missing column. ``flat`` sets its figures beside phase ``good``'s.
4. Phase ``largest_allowed``: ``--largest`` of the largest request the caps let through (1,024 pairs of ~900
   characters: legitimate, timed on their own), each followed by six good ones: what a heavy client costs others.
5. Per phase: p50 / p99 of the good requests (ms), their statuses, the abusive ones' statuses by kind, and the
   scoring server's resident memory (VmRSS of ``agpo serve``'s children, summed, sampled every 0.1 s): at
   the start, the peak and the end. A phase stops dispatching after ``--max-seconds``.
Run: ``.venv/bin/python benchmarks/bench_serve_load.py`` (writes results/serve_load.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psutil
from common import write_results

from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.serving.serve_config import ServeConfig

ABUSIVE = ("declared_20MiB", "chunked_past_cap", "rows_1025", "text_20k_chars", "truncated_json", "missing_column")
LARGEST_EVERY = 6  # good requests after each largest allowed one, in the last phase


def exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 60.0) -> int:
    """Send ``head`` + ``body`` raw (the server may close before all of it went) and return the answer's status
    (0: no answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        with contextlib.suppress(OSError):
            conn.sendall(head + body)
        data = b""
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                data += chunk
                if b"\r\n" in data and len(data) > 12:
                    break
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def json_request(port: int, payload: object | bytes) -> int:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = (
        "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return exchange(port, head, body)


def split(rows: list[tuple[str, str]]) -> dict:
    return {"dataframe_split": {"columns": ["query", "ad_title"], "data": [list(r) for r in rows]}}


def abusive(kind: str, port: int) -> int:
    post = b"POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if kind == "declared_20MiB":
        return exchange(port, post + f"Content-Length: {20 * 2**20}\r\n\r\n".encode(), b"[" * 65536)
    if kind == "chunked_past_cap":
        piece = b"x" * 65536
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(18))  # 1.1 MiB, never ended
        return exchange(port, post + b"Transfer-Encoding: chunked\r\n\r\n", chunks)
    if kind == "rows_1025":
        return json_request(port, split([("red shoes", "nike running shoes")] * 1025))
    if kind == "text_20k_chars":
        return json_request(port, split([("red shoes", "nike " * 4000)]))
    if kind == "truncated_json":
        return json_request(port, b'{"dataframe_split": {"columns": ["query", "ad_title"], "data": [["red')
    if kind == "missing_column":
        return json_request(port, {"dataframe_split": {"columns": ["query"], "data": [["red shoes"]]}})
    raise ValueError(kind)


class MemoryWatch:
    """VmRSS of a process's children (MB, summed: the scoring server ``agpo serve`` starts, which every request
    reaches), sampled every 0.1 s in a thread."""

    def __init__(self, pid: int) -> None:
        self.process, self.samples, self.running = psutil.Process(pid), [], True
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def rss_mb(self) -> float:
        total = 0
        for process in self.process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return round(total / 2**20, 1)

    def watch(self) -> None:
        while self.running:
            self.samples.append(self.rss_mb())
            time.sleep(0.1)

    def phase(self, work: Callable[[], dict]) -> dict:
        start, self.samples = self.rss_mb(), []
        result = work()
        peak = max([start, *self.samples])
        return {**result, "rss_mb": {"start": start, "peak": peak, "end": self.rss_mb()}}


def run_phase(port: int, jobs: list[tuple[str, Callable[[], int]]], clients: int, max_seconds: float) -> dict:
    """Run ``jobs`` (kind, call -> status) from ``clients`` threads; latencies of the good and largest requests."""
    todo: queue.Queue = queue.Queue()
    for job in jobs:
        todo.put(job)
    latencies, statuses, lock = defaultdict(list), defaultdict(Counter), threading.Lock()
    deadline = time.monotonic() + max_seconds

    def client() -> None:
        while time.monotonic() < deadline:
            try:
                kind, call = todo.get_nowait()
            except queue.Empty:
                return
            started = time.perf_counter()
            status = call()
            with lock:
                latencies[kind].append(1000 * (time.perf_counter() - started))
                statuses[kind][str(status)] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = {"seconds": round(time.monotonic() - started, 1), "statuses": {k: dict(v) for k, v in statuses.items()}}
    for kind in ("good", "largest_allowed"):
        if latencies[kind]:
            p50, p99 = np.percentile(latencies[kind], [50, 99])
            result[kind] = {"requests": len(latencies[kind]), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1)}
    result["abusive_ms_max"] = {k: round(max(v), 1) for k, v in latencies.items() if k in ABUSIVE}
    return result


def model_folder(kind: str, root: Path, rows: list[dict]) -> Path:
    queries, ads = [r["query"] for r in rows], [r["ad_title"] for r in rows]
    if kind == "lexical":
        from evaluation.lexical import LexicalMatcher

        return LexicalMatcher(4).fit(queries, ads, [r["gold_grade"] for r in rows]).save(root / "lexical")
    from student.export import export_onnx
    from student.model import RelevanceStudent, StudentConfig

    config = StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=96)
    student = RelevanceStudent.build(config, texts=[f"{q} {a}" for q, a in zip(queries, ads, strict=True)])
    folder = student.save(root / "tiny")
    export_onnx(student, folder)
    return folder


def start_server(folder: Path, root: Path) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agpo = Path(sys.executable).parent / "agpo"
    sets = [f"model={folder}", f"port={port}", f"out_dir={root / 'serve'}"]
    log = (root / "serve.log").open("w")
    command = [str(agpo), "serve", *[a for s in sets for a in ("--set", s)]]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        if server.poll() is not None:
            raise RuntimeError((root / "serve.log").read_text()[-2000:])
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).close()
            return server, port
        if time.monotonic() > deadline:
            raise RuntimeError("agpo serve did not answer /ping within 120 s")
        time.sleep(0.3)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("tiny", "lexical"), default="tiny")
    parser.add_argument("--requests", type=int, default=300, help="good requests per phase")
    parser.add_argument("--pairs", type=int, default=32, help="pairs per good request")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--largest", type=int, default=8, help="largest allowed requests in the last phase")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="a phase stops dispatching after this")
    args = parser.parse_args()
    rows = generate_pairs(SyntheticConfig(train=max(200, args.pairs), audit=0, unlabeled=0, test=0, seed=5))
    pairs = [(r["query"], r["ad_title"]) for r in rows]
    good_body = split(pairs[: args.pairs])
    largest = split([(pairs[i % len(pairs)][0][:20], ("nike running shoes " * 48)[:900]) for i in range(1024)])
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        folder = model_folder(args.model, root, rows)
        server, port = start_server(folder, root)
        try:
            watch = MemoryWatch(server.pid)
            watch.thread.start()
            good = [("good", lambda: json_request(port, good_body))] * args.requests
            phases = {"good": watch.phase(lambda: run_phase(port, good, args.clients, args.max_seconds))}
            mixed = []
            for i in range(args.requests):
                kind = ABUSIVE[i % len(ABUSIVE)]
                mixed += [("good", lambda: json_request(port, good_body)), (kind, lambda k=kind: abusive(k, port))]
            phases["abusive"] = watch.phase(lambda: run_phase(port, mixed, args.clients, args.max_seconds))
            heavy = []
            for _ in range(args.largest):
                heavy += [("largest_allowed", lambda: json_request(port, largest))]
                heavy += [("good", lambda: json_request(port, good_body))] * LARGEST_EVERY
            phases["largest_allowed"] = watch.phase(lambda: run_phase(port, heavy, args.clients, args.max_seconds))
            watch.running = False
        finally:
            server.terminate()
            server.wait(timeout=30)
    defaults = ServeConfig()
    good_phase, mixed_phase = phases["good"], phases["abusive"]
    report = {
        "model": args.model,
        "caps": {
            "max_request_bytes": defaults.max_request_bytes,
            "max_rows": defaults.max_rows,
            "max_text_chars": defaults.max_text_chars,
            "request_timeout_s": defaults.request_timeout_s,
        },
        "requests_per_phase": args.requests,
        "pairs_per_good_request": args.pairs,
        "clients": args.clients,
        "phases": phases,
        "flat": {
            "good_p50_ms": [good_phase["good"]["p50_ms"], mixed_phase["good"]["p50_ms"]],
            "good_p99_ms": [good_phase["good"]["p99_ms"], mixed_phase["good"]["p99_ms"]],
            "rss_mb_start_peak_end": [
                good_phase["rss_mb"]["start"],
                max(good_phase["rss_mb"]["peak"], mixed_phase["rss_mb"]["peak"]),
                mixed_phase["rss_mb"]["end"],
            ],
            "refused": {k: v for k, v in mixed_phase["statuses"].items() if k in ABUSIVE},
        },
    }
    print(json.dumps(report["flat"], indent=1))
    write_results("serve_load", report)
    return report


if __name__ == "__main__":
    main()
