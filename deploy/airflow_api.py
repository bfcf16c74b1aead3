"""A small client of Airflow 3's REST API (``/api/v2``): what operators do from scripts.

Log in with user and password (``POST /auth/token`` gives a JWT, sent as a bearer token), unpause and
trigger a DAG with its params as the run's conf, wait for the run, and read the task-instance records
(state, try number, the hostname of the worker that ran each try). Standard library only.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

FINISHED = ("success", "failed")
GET_ATTEMPTS = 4


def health(url: str) -> dict[str, Any] | None:
    """The JSON (or ``{}``) a health endpoint answers with 200; None while it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return {}


class AirflowError(RuntimeError):
    """The API refused a request: the message has the method, the path, the status and Airflow's reason."""


class AirflowClient:
    def __init__(self, base_url: str, username: str, password: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._credentials = {"username": username, "password": password}
        self._token: str | None = None

    @property
    def token(self) -> str:
        """A JWT for this user (the UI accepts it as its ``_token`` cookie)."""
        if self._token is None:
            self._token = self._call("POST", "/auth/token", self._credentials, auth=False)["access_token"]
        return self._token

    def _call(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        attempts = GET_ATTEMPTS if method == "GET" else 1  # reads are retried: a busy server may drop one
        for attempt in range(1, attempts + 1):
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    raw = response.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as err:
                detail = err.read().decode(errors="replace")[:500]
                if err.code < 500 or attempt == attempts:
                    raise AirflowError(f"{method} {path}: HTTP {err.code} {detail}") from err
            except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
                if attempt == attempts:
                    raise AirflowError(f"{method} {path}: {err} ({self.base_url} not answering)") from err
            time.sleep(2 * attempt)
        raise AssertionError("unreachable")

    def dag_exists(self, dag_id: str) -> bool:
        try:
            self._call("GET", f"/api/v2/dags/{quote(dag_id)}")
        except AirflowError as err:
            if "HTTP 404" in str(err):
                return False
            raise
        return True

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str | None = None) -> str:
        """Unpause ``dag_id`` and start a run with ``conf``; returns the run id. Triggering a ``run_id``
        that exists already starts nothing and returns it (a rerun of the same command waits on that run)."""
        self._call("PATCH", f"/api/v2/dags/{quote(dag_id)}", {"is_paused": False})
        body: dict[str, Any] = {"logical_date": None, "conf": conf}
        if run_id:
            body["dag_run_id"] = run_id
        try:
            return self._call("POST", f"/api/v2/dags/{quote(dag_id)}/dagRuns", body)["dag_run_id"]
        except AirflowError as err:
            if run_id and "HTTP 409" in str(err):
                return run_id
            raise

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self._call("GET", f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}")["state"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float, poll: float = 5.0) -> str:
        """Poll until the run succeeds or fails; returns its state (raises TimeoutError past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                return state
            time.sleep(poll)
        raise TimeoutError(f"{dag_id} run {run_id} still {self.run_state(dag_id, run_id)} after {timeout:.0f} s")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}/taskInstances?limit=1000"
        return self._call("GET", path)["task_instances"]

    def tries(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> list[dict[str, Any]]:
        """Every try of one task instance (the current one included), oldest first."""
        path = f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id)}/taskInstances/{quote(task_id)}/{map_index}/tries"
        return sorted(self._call("GET", path)["task_instances"], key=lambda t: t["try_number"])

    def format_task_table(self, dag_id: str, run_id: str) -> str:
        """One line per try: task, map index, try, state, hostname (which worker ran it)."""
        lines = [f"{'task':16} {'map':>4} {'try':>4} {'state':12} hostname"]
        instances = sorted(  # in the order they ran, those not started yet last
            self.task_instances(dag_id, run_id),
            key=lambda t: (t["start_date"] is None, t["start_date"] or "", t["map_index"]),
        )
        for instance in instances:
            for one in self.tries(dag_id, run_id, instance["task_id"], instance["map_index"]):
                lines.append(
                    f"{one['task_id']:16} {one['map_index']:>4} {one['try_number']:>4} "
                    f"{one['state'] or '-':12} {one['hostname'] or '-'}"
                )
        return "\n".join(lines)
