"""A DAG run's params cannot steer the register step (issue 58, item 1): Airflow lets any task trigger any DAG
with any conf, so a run that names another tracking URI, another registered model's name by override, a lock
folder or an output folder is refused by name, before any step contacts MLflow, and the register step never
sends the worker's credentials anywhere but the worker's own store.

Each test here fails on 98f4e83's code, where ``overrides`` reached every config key and
``tracking.tracking_uri`` won over the worker's ``MLFLOW_TRACKING_URI``."""

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException
from mlflow import MlflowClient

from pipelines.ads import pipeline as ads_pipeline
from pipelines.steps import run_airflow_task

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ["tracking.registered_model=stolen", "tracking.lock_dir=/tmp", "out_dir=/tmp/elsewhere"]


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections made to it and reads what they send: where a
    hostile tracking URI would have sent the register worker's Basic-auth header."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(1)
                try:
                    self.received.append(connection.recv(65536))
                except OSError:
                    self.received.append(b"")

    def close(self) -> list[bytes]:
        self.stop.set()
        self.thread.join()
        self.server.close()
        return self.received


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


class TaskInstance:
    try_number = 1
    map_index = -1


class Dag:
    dag_id = "ads_relevance_agpo"


@pytest.mark.parametrize("override", ["tracking.tracking_uri", *(o.partition("=")[0] for o in HOSTILE)])
def test_the_register_task_refuses_a_run_that_names_a_key_the_worker_decides(override, listener, worker, tmp_path):
    value = f"http://127.0.0.1:{listener.port}/" if override == "tracking.tracking_uri" else "stolen"
    params = {"presets": ["configs/pipeline/tiny-test.yaml"], "overrides": [f"{override}={value}"], "run_name": "r"}
    context = {"params": params, "dag": Dag(), "run_id": "manual__1", "ti": TaskInstance()}
    with pytest.raises(AirflowFailException, match=rf"override '{override}' is not a key a DAG run may set.*data\.\*"):
        run_airflow_task(ads_pipeline, "register", context, AirflowFailException)
    assert listener.close() == []  # nothing was sent anywhere
    assert not (tmp_path / "runs").exists()  # and nothing written


def test_a_registered_model_name_that_could_reach_into_a_filter_is_refused(worker):
    params = {"registered_model": "x' or name != '", "run_name": "r"}
    context = {"params": params, "dag": Dag(), "run_id": "manual__1", "ti": TaskInstance()}
    with pytest.raises(AirflowFailException, match=r"registered_model .* is not a registered model name"):
        run_airflow_task(ads_pipeline, "register", context, AirflowFailException)


@pytest.mark.integration
def test_a_triggered_run_with_hostile_overrides_sends_nothing_and_registers_nothing(
    fresh_airflow_home, listener, worker, tmp_path
):
    """The whole chain through real Airflow: `airflow dags test` with a conf naming a listener as the tracking URI
    and another registered model. The run fails at its first task, naming the key; the listener hears nothing,
    and the worker's store holds no model of either name."""
    _, env = fresh_airflow_home
    conf = {
        "presets": ["configs/pipeline/tiny-test.yaml"],
        "overrides": [f"tracking.tracking_uri=http://registrar:pw@127.0.0.1:{listener.port}/", *HOSTILE],
        "run_name": "hostile",
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "airflow"),
            "dags",
            "test",
            "ads_relevance_agpo",
            "--conf",
            json.dumps(conf),
        ],
        cwd=ROOT,
        env={**env, **worker},
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert "override 'tracking.tracking_uri' is not a key a DAG run may set" in log, log[-3000:]
    assert "registrar:pw" not in log  # the URL's credentials are not echoed either
    assert listener.close() == []
    assert not (tmp_path / "runs" / "hostile").exists() and not Path("/tmp/elsewhere").exists()
    client = MlflowClient(worker["MLFLOW_TRACKING_URI"])
    assert [m.name for m in client.search_registered_models()] == []
