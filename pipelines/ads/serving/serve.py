"""Stage ``agpo serve``: a student behind our scoring server (pipelines.ads.serving.serve_app), bound to 127.0.0.1,
until Ctrl-C.

``model`` is a registered model (``models:/ads-relevance-student@champion``, resolved once to its version, which the
summary names) or a student folder (``agpo distil``'s ``model/``, written first as the pyfunc model ``register`` logs:
pipelines.ads.serving.student_model.save_student_model). Either way the model is written into a private folder
(pipelines.ads.serving.private_folder: 0700, under a parent no other user can rename it out of), a registered one
verified there against the digest the registrar tagged (download_registered_model), and the server loads it from
there; the folder is removed when the server stops. Before, the version was verified in ``out_dir`` and loaded again
by path from it, and on the distributed stack ``work/runs`` is group-writable: a line appended to the served code
after the check ran in the server (issue 58). ``out_dir`` now holds only ``serving.json``: what is served, its
version and files digest, the url, the limits and the ``backend``: the graph and runtime the server runs
(student.graph_runtimes: onnxruntime or OpenVINO, fp32 or int8; ``auto``: evaluation.backend_choice's pick for the
served folder on this machine).

Why our own server rather than ``mlflow models serve``: MLflow's scoring server reads any body whole, caps neither
rows nor text, keeps predicting after its 504, and answers errors with stack traces and file paths. serve_app speaks
the same protocol (``POST /invocations`` with ``{"dataframe_split": {"columns": ["query", "ad_title"], "data":
[[...], ...]}}``, ``GET /ping``; one grade, its label and ``p_0..p_3`` per pair) and refuses an oversized body (413,
before reading it), too many rows or too long a text (422, the import's text cap), in one line each, and stops
working on a request past ``request_timeout_s`` (504). It runs as ``python -m pipelines.ads.serving.serve_app`` of
this interpreter, in its own session; SIGINT or SIGTERM stops it and its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from durable.fileio import files_digest, folder_files
from evaluation.baseline_registry import saved_baseline
from pipelines.ads.serving.private_folder import private_folder
from pipelines.ads.serving.score_config import REGISTRY_PREFIX
from pipelines.ads.serving.serve_app import SETTINGS_ENV, Limits, settings_env
from pipelines.ads.serving.serve_config import LOOPBACK, ServeConfig
from pipelines.ads.serving.student_model import (
    NOT_HASHED,
    download_registered_model,
    model_card,
    registered_version,
    save_student_model,
    student_folder,
)
from pipelines.ads.serving.student_pyfunc import BACKEND_ENV, DEVICE_ENV
from pipelines.devices import use_device
from pipelines.errors import StageFailed
from pipelines.io import require_file, write_json_atomic


def served_model(config: ServeConfig, folder: Path) -> tuple[Path, dict[str, str]]:
    """(the pyfunc model to serve, written into ``folder``, what it is): a registry URI pinned to its version now,
    downloaded and verified in ``folder``, or the student folder saved there as a pyfunc model. ``folder`` must be
    one no other user can write (``private_folder``): the server loads what was verified from it."""
    if config.model.startswith(REGISTRY_PREFIX):
        version = registered_version(config.model, config.tracking_uri)
        local = download_registered_model(f"{REGISTRY_PREFIX}{version}", config.tracking_uri, folder / "model")
        what = f"{config.model} (version {version.rsplit('/', 1)[1]}, files verified)"
        return local, {"model": config.model, "version": version, "what": what}
    student = Path(config.model)
    fix = "point model at agpo distil's model/ folder (or a baseline's, agpo evaluate's baselines/)"
    if saved_baseline(student) is None:  # a baseline saved as its own kind has no graph: its state is the model
        from student.export import ensure_onnx  # imports torch: only for a folder to serve

        require_file(ensure_onnx(student), "student ONNX file", fix, StageFailed)
    local = save_student_model(student.resolve(), folder / "model", model_card(student, {}, {}))
    return local, {"model": str(student), "version": "folder", "what": f"the student folder {student}"}


def served_backend(config: ServeConfig, model: Path) -> str:
    """The graph backend the server runs: ``config.backend``, ``auto`` resolved for the served student's folder on
    this machine (evaluation.backend_choice; a folder without graphs, a baseline's, has no backend: onnx)."""
    if config.backend != "auto":
        return config.backend
    from evaluation.backend_choice import auto_backend

    chosen = auto_backend(student_folder(model))
    return "onnx" if chosen == "torch" else chosen


def limits_of(config: ServeConfig) -> Limits:
    return Limits(config.max_request_bytes, config.max_rows, config.max_text_chars, config.request_timeout_s)


def run(config: ServeConfig) -> dict[str, Path]:
    server: subprocess.Popen | None = None

    def stop(signum: int, _frame: object) -> None:
        if server is None:  # not started yet: unwind, so the private folder is removed
            raise KeyboardInterrupt
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers: its own session

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with private_folder("agpo-serve-") as folder:
            model, served = served_model(config, folder)
            url, limits = f"http://{LOOPBACK}:{config.port}", limits_of(config)
            digest = files_digest(folder_files(model, leave_out=NOT_HASHED))
            backend = served_backend(config, model)
            record = {**served, "backend": backend, "files_sha256": digest, "url": url, "limits": asdict(limits)}
            write_json_atomic(Path(config.out_dir) / "serving.json", record)
            env = {**os.environ, DEVICE_ENV: use_device(config).device, BACKEND_ENV: backend}
            env[SETTINGS_ENV] = settings_env(
                str(model), LOOPBACK, config.port, config.workers, config.max_concurrency, limits
            )
            print(
                f'serving {served["what"]} at {url}/invocations (POST {{"dataframe_split": {{"columns": ["query", '
                f'"ad_title"], "data": [[...]]}}}}; at most {config.max_rows:,} pairs, {config.max_request_bytes:,} '
                f"bytes, {config.max_text_chars:,} characters a text); {url}/ping answers once it is up; Ctrl-C "
                "stops it",
                flush=True,
            )
            command = [sys.executable, "-m", "pipelines.ads.serving.serve_app"]
            server = subprocess.Popen(command, env=env, start_new_session=True)
            code = server.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
        raise StageFailed(f"the scoring server exited with {code}; its output above says why")
    return {"serving": Path(config.out_dir) / "serving.json"}
