import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Airflow reads its config when first imported: point it at a private home before any test imports it
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="agpo-airflow-tests-"))
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
# the DAG files import dags/agpo_operations.py as Airflow lets them: it puts a DAG bundle's root on sys.path
if str(ROOT / "dags") not in sys.path:
    sys.path.append(str(ROOT / "dags"))


def airflow_env(home: Path) -> dict[str, str]:
    """A private Airflow home with a SQLite metadata DB, this project's dags/, no examples."""
    return {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }


def migrated_airflow_home(home: Path) -> tuple[Path, dict[str, str]]:
    """``home`` as a private Airflow home whose SQLite metadata DB is migrated; (home, its environment)."""
    env = airflow_env(home)
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return home, env


@pytest.fixture(scope="module")
def dagbag():
    """The DAG folder, parsed as Airflow's DAG processor parses it."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(ROOT / "dags"))


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    return migrated_airflow_home(tmp_path_factory.mktemp("airflow"))


@pytest.fixture
def fresh_airflow_home(tmp_path):
    """A private migrated Airflow home for one test, whose metadata DB holds its DAG run alone."""
    return migrated_airflow_home(tmp_path / "airflow")


@pytest.fixture(scope="session")
def dag_test():
    """``run_dag``, for the tests that run a whole DAG."""
    return run_dag


def run_dag(env: dict[str, str], dag_id: str, conf: dict, timeout: int) -> subprocess.CompletedProcess:
    """``airflow dags test <dag_id> --conf <conf>`` in the project root: the whole DAG run, in this environment;
    fails the test with the output's tail when the run fails."""
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run(
        [str(airflow), "dags", "test", dag_id, "--conf", json.dumps(conf)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


@pytest.fixture
def worker(tmp_path, monkeypatch):
    """``worker_settings`` in ``tmp_path``."""
    return worker_settings(tmp_path, monkeypatch)


@pytest.fixture(scope="session")
def settings_of_a_worker():
    """``worker_settings``, for a module's fixture."""
    return worker_settings


def worker_settings(folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What a deployment's worker decides, in ``folder``: where DAG runs write (``$AGPO_OUTPUT_ROOT``: the ads
    runs in ``folder/runs``), the MLflow store (``folder/mlflow``) and the registration lock. Set in this
    process too, so a test reads the run back as the worker wrote it. A DAG run's params cannot set any of them."""
    env = {
        "AGPO_OUTPUT_ROOT": str(folder),
        "MLFLOW_TRACKING_URI": f"sqlite:///{folder / 'mlflow' / 'mlflow.db'}",
        "AGPO_REGISTRY_LOCK_DIR": str(folder / "locks"),
    }
    (folder / "mlflow").mkdir(exist_ok=True)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env
