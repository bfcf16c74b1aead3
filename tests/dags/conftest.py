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


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow")
    env = airflow_env(home)
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return home, env
