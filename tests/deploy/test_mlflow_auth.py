"""MLflow behind its basic-auth app (deploy/mlflow_auth.py): the config file as MLflow itself reads it, and a
real tracking server started by the stack's own code, on a SQLite backend (no Postgres needed): anonymous
requests refused, tasks log as a non-admin user, a rotated task password takes effect at the next up, and
only the register step's user creates versions of the stack's registered models (the students' and their teacher's)
and moves their aliases (``champion``, ``current``)."""

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.server.auth.config import read_auth_config

from deploy import mlflow_auth, services
from deploy.credentials import Credentials, write_private
from deploy.mlflow_auth import basic_auth
from deploy.mlflow_server import start_mlflow
from deploy.stack_config import REGISTERED_MODEL, StackConfig
from evaluation.lexical import LexicalMatcher
from pipelines.ads.serving.registry import Evaluation, register_student
from pipelines.ads.serving.student_model import ModelFilesChanged, load_registered_student
from pipelines.tracking import Tracker, TrackingConfig


def test_the_config_file_gives_mlflow_the_admin_password_and_a_user_store_under_home(tmp_path, monkeypatch):
    path = tmp_path / "mlflow-auth.ini"
    write_private(path, mlflow_auth.config_text(tmp_path / "mlflow" / "auth.db", "100% the admin's;#password"))
    monkeypatch.setenv("MLFLOW_AUTH_CONFIG_PATH", str(path))
    for name in ("MLFLOW_AUTH_ADMIN_USERNAME", "MLFLOW_AUTH_ADMIN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    config = read_auth_config()  # what `mlflow server --app-name basic-auth` reads
    assert config.admin_username == "admin" and config.admin_password == "100% the admin's;#password"
    assert config.database_uri == f"sqlite:///{tmp_path}/mlflow/auth.db"
    assert config.default_permission == "READ" and config.auth_cache_ttl_seconds == 300
    assert config.authorization_function == "mlflow.server.auth:authenticate_request_basic_auth"


def test_the_registrar_alone_changes_the_students_and_the_teachers_registered_models():
    wanted = mlflow_auth.grants("ads")
    models = [("registered_model", "ads"), ("registered_model", "ads-teacher")]
    assert wanted[mlflow_auth.TASKS] == dict.fromkeys(models, "READ")
    assert wanted[mlflow_auth.REGISTRAR] == {("experiment", "*"): "EDIT", **dict.fromkeys(models, "EDIT")}
    assert list(mlflow_auth.registered_models("ads")) == ["ads", "ads-teacher"]


def status(url, user=None, body=None, method=None):
    headers = {"Content-Type": "application/json"}
    if user:
        headers["Authorization"] = basic_auth(*user)
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.integration
def test_the_tracking_server_refuses_anonymous_requests_and_tasks_log_as_a_non_admin_user(tmp_path, monkeypatch):
    config = StackConfig(home=tmp_path, mlflow_port=services.free_port())
    credentials = Credentials.load(tmp_path)
    backend = f"sqlite:///{tmp_path}/mlflow.db"
    tasks = (mlflow_auth.TASKS, credentials.mlflow_tasks)
    search = f"{config.mlflow_url}/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        start_mlflow(config, credentials, backend_store_uri=backend)
        leader = services.recorded_pid(config.run_dir, "mlflow")
        assert b"\0--app-name\0basic-auth\0" in Path(f"/proc/{leader}/cmdline").read_bytes()
        assert status(search) == 401
        assert status(search, (mlflow_auth.TASKS, "a wrong password")) == 401
        assert status(search, tasks) == 200

        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", tasks[0])  # what a worker's environment holds
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", tasks[1])
        client = MlflowClient(config.mlflow_url)
        run = client.create_run(client.create_experiment("auth-check")).info.run_id
        client.log_metric(run, "labels", 3.0)
        (tmp_path / "summary.json").write_text("{}")
        client.log_artifact(run, str(tmp_path / "summary.json"))
        client.set_terminated(run)
        assert client.get_run(run).data.metrics == {"labels": 3.0}
        assert [a.path for a in client.list_artifacts(run)] == ["summary.json"]

        new_user = {"username": "intruder", "password": "x" * 16}
        assert status(f"{config.mlflow_url}{mlflow_auth.USERS}/create", tasks, new_user) == 403  # not an admin

        # a rotated task password: the next `up` resets it on the running server
        (tmp_path / "secrets" / "mlflow-tasks.password").unlink()
        rotated = Credentials.load(tmp_path)
        start_mlflow(config, rotated, backend_store_uri=backend)
        assert status(search, tasks) == 401 and status(search, (mlflow_auth.TASKS, rotated.mlflow_tasks)) == 200
    finally:
        services.stop(config.run_dir, "mlflow")


@pytest.mark.integration
def test_only_the_registrar_creates_versions_of_the_stacks_models_and_moves_their_aliases(tmp_path, monkeypatch):
    config = StackConfig(home=tmp_path, mlflow_port=services.free_port())
    credentials = Credentials.load(tmp_path)
    tasks, registrar = (
        (mlflow_auth.TASKS, credentials.mlflow_tasks),
        (mlflow_auth.REGISTRAR, credentials.mlflow_registrar),
    )
    api = f"{config.mlflow_url}/api/2.0/mlflow"
    try:
        start_mlflow(config, credentials, backend_store_uri=f"sqlite:///{tmp_path}/mlflow.db")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", tasks[0])  # a student logged by a task, as distil does
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", tasks[1])
        client = MlflowClient(config.mlflow_url)
        run = client.create_run(client.create_experiment("registry-check"))
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "MLmodel").write_text("flavors: {}\n")
        client.log_artifacts(run.info.run_id, str(tmp_path / "model"), "model")
        version = {"name": REGISTERED_MODEL, "source": f"{run.info.artifact_uri}/model", "run_id": run.info.run_id}
        alias = {"name": REGISTERED_MODEL, "alias": "champion", "version": "1"}

        assert status(f"{api}/model-versions/create", tasks, version) == 403
        assert status(f"{api}/model-versions/create", registrar, version) == 200  # the register step's user
        assert status(f"{api}/registered-models/alias", tasks, alias) == 403
        assert status(f"{api}/registered-models/alias", registrar, alias) == 200
        # the same for the teacher the register step registers as <model>-teacher and makes current (created by admin)
        teacher = REGISTERED_MODEL + mlflow_auth.TEACHER_SUFFIX
        current = {"name": teacher, "alias": "current", "version": "1"}
        assert status(f"{api}/model-versions/create", tasks, {**version, "name": teacher}) == 403
        assert status(f"{api}/model-versions/create", registrar, {**version, "name": teacher}) == 200
        assert status(f"{api}/registered-models/alias", tasks, current) == 403
        assert status(f"{api}/registered-models/alias", registrar, current) == 200
        assert status(f"{api}/registered-models/alias", tasks, {"name": teacher, "alias": "current"}, "DELETE") == 403
        # tasks read the champion (agpo score, the scoring DAG) but can neither move, drop nor delete it
        assert client.get_model_version_by_alias(REGISTERED_MODEL, "champion").version == "1"
        for path, body in (
            ("registered-models/alias", {"name": REGISTERED_MODEL, "alias": "champion"}),
            ("model-versions/delete", {"name": REGISTERED_MODEL, "version": "1"}),
            ("registered-models/delete", {"name": REGISTERED_MODEL}),
        ):
            assert status(f"{api}/{path}", tasks, body, "DELETE") == 403, path

        # a stack whose tasks created the model (MANAGE, as its creator) is narrowed to READ at the next up
        grant = {"username": mlflow_auth.TASKS, "resource_type": "registered_model", "resource_id": REGISTERED_MODEL}
        admin = (mlflow_auth.ADMIN, credentials.mlflow_admin)
        assert status(f"{config.mlflow_url}{mlflow_auth.GRANTS}/revoke", admin, grant) == 200
        assert status(f"{config.mlflow_url}{mlflow_auth.GRANTS}/grant", admin, {**grant, "permission": "MANAGE"}) == 200
        assert status(f"{api}/registered-models/alias", tasks, alias) == 200
        start_mlflow(config, credentials)  # running: only the users and grants
        assert status(f"{api}/registered-models/alias", tasks, alias) == 403

        # the register step's own code, as registrar: the version's files go to the registry experiment, where a
        # task may read them (agpo score) but neither upload nor delete (with the wildcard EDIT tasks had, both
        # passed); if they change anyway, loading refuses them
        lexical = LexicalMatcher(4).fit(["red shoes", "mug"], ["red shoes nike", "blue hat"], [3, 0])
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", registrar[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", registrar[1])
        tracking = TrackingConfig(
            tracking_uri=config.mlflow_url,
            experiment="registry-check",
            registered_model=REGISTERED_MODEL,
            lock_dir=str(tmp_path / "locks"),
            system_metrics_seconds=0,
        )
        tracker = Tracker(tracking, "stack/registry-check")
        with tracker.stage("register", {}) as log:
            decision = register_student(
                tracker,
                log,
                lexical.save(tmp_path / "lexical"),
                Evaluation({"roc_auc_relevant": 0.7}),
                name="lexical",
            )
        model_id = client.get_model_version(REGISTERED_MODEL, str(decision["version"])).source.removeprefix("models:/")
        stored = client.get_logged_model(model_id).artifact_location.removeprefix("mlflow-artifacts:/")
        assert stored.startswith(f"{tracker.registry_experiment_id()}/models/")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", tasks[0])
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", tasks[1])
        uri = f"models:/{REGISTERED_MODEL}/{decision['version']}"
        assert load_registered_student(uri, config.mlflow_url, tmp_path / "read").is_dir()  # tasks read it
        code = f"{config.mlflow_url}/api/2.0/mlflow-artifacts/artifacts/{stored}/student_pyfunc.py"
        assert status(code, tasks, {"rewritten": True}, "PUT") == 403
        assert status(code, tasks, None, "DELETE") == 403
        experiment = {"username": mlflow_auth.TASKS, "resource_type": "experiment"}
        grant = {**experiment, "resource_id": tracker.registry_experiment_id(), "permission": "EDIT"}
        assert status(f"{config.mlflow_url}{mlflow_auth.GRANTS}/grant", admin, grant) == 200  # as tasks once had
        assert status(code, tasks, {"rewritten": True}, "PUT") == 200
        with pytest.raises(ModelFilesChanged, match=r"student_pyfunc\.py \(changed\)"):
            load_registered_student(uri, config.mlflow_url, tmp_path / "rewritten")
        start_mlflow(config, credentials)  # the next up takes that grant back
        assert status(code, tasks, {"rewritten": True}, "PUT") == 403
    finally:
        services.stop(config.run_dir, "mlflow")
