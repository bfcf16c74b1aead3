"""Stage ``agpo serve``: a student behind MLflow's scoring server, bound to 127.0.0.1, until Ctrl-C.

``model`` is a registered model (``models:/ads-relevance-student@champion``, resolved once to its version, which the
summary names, downloaded into ``out_dir`` and served only when its files match the digest the registrar tagged:
pipelines.ads.serving.student_model.download_registered_model) or a student folder (``agpo distil``'s ``model/``),
written first as a local MLflow pyfunc model in ``out_dir`` (pipelines.ads.serving.student_model.save_student_model:
the same model ``register`` logs). The server is ``python -m mlflow models serve --env-manager local`` of this
interpreter, with this interpreter's ``bin/`` first on PATH (MLflow starts ``uvicorn`` by name, so a venv that is
not activated would fail with ``uvicorn: not found``). It answers ``POST /invocations`` with
``{"dataframe_split": {"columns": ["query", "ad_title"], "data": [[...], ...]}}``: one grade, its label and
``p_0..p_3`` per pair. SIGINT or SIGTERM stops it and its workers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from pipelines.ads.serving.score_config import REGISTRY_PREFIX
from pipelines.ads.serving.serve_config import LOOPBACK, ServeConfig
from pipelines.ads.serving.student_model import (
    download_registered_model,
    model_card,
    registered_version,
    save_student_model,
)
from pipelines.ads.serving.student_pyfunc import DEVICE_ENV
from pipelines.devices import use_device
from pipelines.errors import StageFailed
from pipelines.io import require_file
from student.lexical_config import STATE_FILE


def served_model(config: ServeConfig) -> tuple[str, str]:
    """(what ``mlflow models serve -m`` gets, what it is in words): a registry URI pinned to its version now, or
    the student folder saved as a pyfunc model."""
    if config.model.startswith(REGISTRY_PREFIX):  # resolved once, downloaded and its files verified, then served
        version = registered_version(config.model, config.tracking_uri)
        target = Path(config.out_dir) / "registered_model"
        shutil.rmtree(target, ignore_errors=True)
        local = download_registered_model(f"{REGISTRY_PREFIX}{version}", config.tracking_uri, target)
        return str(local), f"{config.model} (version {version.rsplit('/', 1)[1]}, files verified)"
    folder = Path(config.model)
    fix = "point model at agpo distil's model/ folder (or a baseline's, agpo evaluate's baselines/)"
    if not (folder / STATE_FILE).is_file():  # a lexical matcher has no graph: its state file is the model
        from student.export import ensure_onnx  # imports torch: only for a folder to serve

        require_file(ensure_onnx(folder), "student ONNX file", fix, StageFailed)
    target = Path(config.out_dir) / "student_model"
    shutil.rmtree(target, ignore_errors=True)  # a fresh copy of the folder as it is now
    save_student_model(folder.resolve(), target, model_card(folder, {}, {}))
    return str(target), f"the student folder {folder}"


def server_command(model: str, config: ServeConfig) -> list[str]:
    return [
        *(sys.executable, "-m", "mlflow", "models", "serve", "-m", model, "--env-manager", "local"),
        *("--host", LOOPBACK, "-p", str(config.port), "-w", str(config.workers)),
    ]


def run(config: ServeConfig) -> dict[str, Path]:
    model, what = served_model(config)
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env[DEVICE_ENV] = use_device(config).device
    url = f"http://{LOOPBACK}:{config.port}"
    print(
        f'serving {what} at {url}/invocations (POST {{"dataframe_split": {{"columns": ["query", '
        f'"ad_title"], "data": [[...]]}}}}); {url}/ping answers once it is up; Ctrl-C stops it',
        flush=True,
    )
    server = subprocess.Popen(server_command(model, config), env=env, start_new_session=True)

    def stop(signum: int, _frame: object) -> None:
        os.killpg(server.pid, signal.SIGTERM)  # the server and its workers: its own session

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = server.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
        raise StageFailed(f"mlflow models serve exited with {code}; its output above says why")
    return {}
