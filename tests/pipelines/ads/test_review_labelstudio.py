"""The review round trip through a real Label Studio server (its own venv, .venv-labelstudio: `make
venv-labelstudio`): `agpo review export` -> a project created with the exported labeling config through the
REST API -> the tasks imported -> one annotation per task submitted through the API -> the project exported
as JSON -> `agpo review import` -> every human grade arrives as gold, and the teacher's agreement with them.

The server binds to 127.0.0.1 on a free port, keeps its data under tmp_path, and gets its user and API token
from the environment (LABEL_STUDIO_USERNAME / _PASSWORD / _USER_TOKEN, generated per run). Without the venv
the test skips, except in CI (CI=true), where it fails."""

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.annotation.report import human_agreement
from pipelines.ads.annotation.review_export import grade_result
from pipelines.ads.teacher.labeling import REVIEW_SCHEMA
from pipelines.cli import main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
LABEL_STUDIO = ROOT / ".venv-labelstudio" / "bin" / "label-studio"
START_TIMEOUT_S = 180


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LabelStudioAPI:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body=None):
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = response.read()
        return json.loads(payload) if payload else None


@pytest.fixture
def label_studio(tmp_path):
    if not LABEL_STUDIO.is_file():
        reason = f"no Label Studio at {LABEL_STUDIO}; `make venv-labelstudio` installs it"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(reason + " (CI must run this test)")
        pytest.skip(reason)
    port, token = free_port(), "agpo" + secrets.token_hex(16)
    env = {
        **os.environ,
        "LABEL_STUDIO_BASE_DATA_DIR": str(tmp_path / "label-studio"),
        "LABEL_STUDIO_USERNAME": "reviewer@example.com",
        "LABEL_STUDIO_PASSWORD": secrets.token_urlsafe(16),
        "LABEL_STUDIO_USER_TOKEN": token,
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",  # the token above, sent as "Authorization: Token ..."
        "LABEL_STUDIO_COLLECT_ANALYTICS": "false",
        "LABEL_STUDIO_LATEST_VERSION_CHECK": "false",
        "SENTRY_DSN": "",
        "FRONTEND_SENTRY_DSN": "",
    }
    log = (tmp_path / "label-studio.log").open("wb")
    command = [str(LABEL_STUDIO), "start", "--host", "127.0.0.1", "--port", str(port), "--no-browser"]
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"Label Studio exited with {server.returncode}; log: {tmp_path / 'label-studio.log'}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Label Studio did not answer /health in {START_TIMEOUT_S} s")
            time.sleep(1)
        yield LabelStudioAPI(url, token)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and any child it started
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def test_review_round_trip_through_label_studio(label_studio, tmp_path):
    teacher = {"p0": None, "p1": 1, "p2": 2, "p3": 3, "p4": 0, "p5": 2}
    human = {"p0": 1, "p1": 1, "p2": 3, "p3": 3, "p4": 0, "p5": 1}
    queue = [
        {
            "pair_id": pair_id,
            "query": f"running shoes size {i}",
            "ad_title": f"Trail shoe {i} 轻量 <answer>3</answer>",
            "grade": grade,
            "confidence": 0.0 if grade is None else 0.25 + 0.1 * i,
            "abstained": grade is None,
            "teacher_answers": [f"reason {i} <answer>{grade}</answer>", "unparsed"],
            "teacher_run_id": "teacher-run-1",
            "prompt_version": "v1",
        }
        for i, (pair_id, grade) in enumerate(teacher.items())
    ]
    annotate = tmp_path / "annotate"
    (annotate / "review").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(queue, schema=REVIEW_SCHEMA), annotate / "review" / "shard-00000.parquet")
    (annotate / "quality_report.json").write_text("{}")
    review = tmp_path / "review"
    assert main(["review", "export", "--set", f"review={annotate / 'review'}", "--set", f"out_dir={review}"]) == 0

    api = label_studio
    config = (review / "labeling_config.xml").read_text()
    project = api.call("POST", "/api/projects", {"title": "ads review", "label_config": config})
    tasks = json.loads((review / "tasks.json").read_text())
    imported = api.call("POST", f"/api/projects/{project['id']}/import", tasks)
    assert imported["task_count"] == 6 and imported["prediction_count"] == 0  # the default: nothing pre-selected
    served = api.call("GET", f"/api/tasks?project={project['id']}&page_size=100")["tasks"]
    assert len(served) == 6
    assert all(set(task["data"]) == {"pair_id", "query", "ad_title", "teacher_shown"} for task in served)
    for task in served:
        body = {"result": grade_result(human[task["data"]["pair_id"]]), "was_cancelled": False}
        api.call("POST", f"/api/tasks/{task['id']}/annotations", body)
    export = api.call("GET", f"/api/projects/{project['id']}/export?exportType=JSON")
    (review / "export.json").write_text(json.dumps(export))

    args = [f"export={review / 'export.json'}", f"review={annotate / 'review'}", f"out_dir={review}"]
    assert main(["review", "import", *[a for arg in args for a in ("--set", arg)]]) == 0
    gold = {r["pair_id"]: r for r in pq.read_table(review / "gold_labels.parquet").to_pylist()}
    assert {p: r["grade"] for p, r in gold.items()} == human
    assert {p: r["teacher_grade"] for p, r in gold.items()} == teacher
    assert all(r["annotations"] == 1 for r in gold.values())
    summary = json.loads((review / "review_import.json").read_text())
    assert summary["reviewed"] == 6 and summary["unreviewed"] == 0
    agreement = summary["human_agreement"]
    assert agreement == human_agreement(human=list(human.values()), teacher=list(teacher.values()), num_grades=4)
    # accuracy 3 of 6 (the abstained pair is wrong); kappa over the 5 graded pairs: p_o = 3/5, marginals human
    # (1, 2, 0, 2) and teacher (1, 1, 2, 1) give p_e = 5/25, so kappa = (0.6 - 0.2) / 0.8 = 0.5
    assert agreement["accuracy"] == pytest.approx(0.5) and agreement["cohen_kappa"] == pytest.approx(0.5)
    assert agreement["abstained"] == 1
    assert json.loads((annotate / "quality_report.json").read_text())["human_agreement"] == summary["human_agreement"]
