"""The ads DAGs' alerts (dags/agpo_operations.py) reach a real webhook on 127.0.0.1: a task that fails in a real
``airflow dags test`` run, and a run's missed deadline through Airflow's own callback runner; an unreachable or
refusing webhook is reported without its URL, which may hold a token."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import pytest
import structlog

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """An HTTP server on 127.0.0.1 that answers ``status`` to each POST and keeps the JSON bodies it got."""

    def __init__(self, status: int = 200) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.mark.integration
def test_a_task_that_fails_in_a_real_run_alerts_the_webhook(airflow_home, worker, receiver, tmp_path):
    """A run_name that breaks the path rules fails ``validate`` at once (no retry: a config error); the webhook
    gets one message naming the run, the task, the reason and the task's log, and the run fails."""
    _, env = airflow_home
    env = {**env, **worker, "AGPO_ALERT_WEBHOOK": f"{receiver.url}/hooks/secret-token"}
    airflow = Path(sys.executable).parent / "airflow"
    conf = {"run_name": "../escape"}
    done = subprocess.run(
        [str(airflow), "dags", "test", "ads_relevance_agpo", "--conf", json.dumps(conf)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert "state=failed" in output, output[-4000:]
    [(path, message)] = receiver.received
    assert path == "/hooks/secret-token"
    assert message["event"] == "task_failed"
    assert (message["dag_id"], message["task_id"]) == ("ads_relevance_agpo", "validate")
    assert message["run_id"].startswith("manual__") and message["run_id"] in output
    assert message["try_number"] == 1  # a config error is not retried
    assert message["reason"].startswith("AirflowFailException: the run's params make no valid config")
    assert "run_name '../escape'" in message["reason"]
    run = quote(message["run_id"])
    assert message["log_url"].endswith(f"/dags/ads_relevance_agpo/runs/{run}/tasks/validate?try_number=1")
    # where a deployment's worker writes the try's log (``dags test`` prints it instead)
    log = Path(message["log_file"])
    assert log.is_relative_to(Path(env["AIRFLOW_HOME"])) and log.parts[-2:] == ("task_id=validate", "attempt=1.log")
    assert message["text"].startswith(f"ads_relevance_agpo run {message['run_id']} task validate: AirflowFail")
    assert "secret-token" not in output


def deadline_context(dag_id: str) -> dict:
    """The context Airflow gives a deadline callback (airflow.models.deadline.Deadline.handle_miss)."""
    run = {"dag_id": dag_id, "dag_run_id": "scheduled__2026-12-06", "queued_at": "2026-12-06T00:00:00Z"}
    return {"dag_run": run, "deadline": {"id": "1", "deadline_time": "2026-12-08T00:00:00Z"}}


@pytest.mark.parametrize(("dag_id", "hours"), [("ads_relevance_agpo", 48), ("ads_scoring", 8)])
def test_a_missed_deadline_alerts_the_webhook_through_airflows_callback_runner(
    dagbag, receiver, monkeypatch, dag_id, hours
):
    from datetime import timedelta

    from airflow.sdk import DeadlineReference
    from airflow.sdk.execution_time.callback_supervisor import execute_callback

    [deadline] = dagbag.dags[dag_id].deadline
    assert deadline.reference == DeadlineReference.DAGRUN_QUEUED_AT and deadline.interval == timedelta(hours=hours)
    assert deadline.callback.path == "agpo_operations.AlertNotifier" and deadline.callback.kwargs == {}
    monkeypatch.setenv("AGPO_ALERT_WEBHOOK", f"{receiver.url}/deadline")
    context = deadline_context(dag_id)
    ok, error = execute_callback(deadline.callback.path, {"context": context}, "", None, structlog.get_logger())
    assert (ok, error) == (True, None)
    [(_, message)] = receiver.received
    assert message["event"] == "deadline_missed"
    assert (message["dag_id"], message["run_id"], message["task_id"]) == (dag_id, "scheduled__2026-12-06", None)
    assert message["reason"] == "deadline missed: not finished by 2026-12-08T00:00:00Z (queued 2026-12-06T00:00:00Z)"


@pytest.mark.parametrize("status", [500, None])
def test_a_refusing_or_unreachable_webhook_is_an_error_that_does_not_show_its_url(status):
    from agpo_operations import AlertError, post_json

    server = Receiver(status or 200)
    url = f"{server.url}/hooks/secret-token"
    if status is None:
        server.close()  # nothing listens there any more
    with pytest.raises(AlertError, match="AGPO_ALERT_WEBHOOK") as caught:
        post_json(url, {"text": "x"}, timeout=5)
    assert "secret-token" not in str(caught.value) and caught.value.__cause__ is None
    if status:
        server.close()


def test_a_webhook_that_is_no_url_is_an_error_that_does_not_show_it():
    from agpo_operations import AlertError, post_json

    with pytest.raises(AlertError, match="not an http") as caught:
        post_json("hooks.example/secret-token", {"text": "x"})
    assert "secret-token" not in str(caught.value)


def test_a_task_lost_with_its_worker_is_reported_as_lost():
    """A task whose process died (a lost worker, a heartbeat timeout) fails in the scheduler, and the DAG processor
    runs its callback with the task instance and no exception."""
    from agpo_operations import LOST, alert
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    ti = RuntimeTaskInstance.model_construct(
        dag_id="ads_relevance_agpo", task_id="annotate_shard", run_id="scheduled__1", try_number=3, map_index=1
    )
    message = alert({"ti": ti})
    assert (message["task_id"], message["map_index"], message["reason"]) == ("annotate_shard", 1, LOST)
    assert message["log_url"].endswith("/runs/scheduled__1/tasks/annotate_shard/mapped/1?try_number=3")
    assert message["log_file"].endswith("task_id=annotate_shard/map_index=1/attempt=3.log")
