"""The dependency direction of DESIGN.md, read from the source: dags -> pipelines -> {agpo, student} ->
durable, with deploy/ beside dags importing none of them; agpo and student never import each other, and
only pipelines/tracking.py imports mlflow."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "durable": {"agpo", "student", "pipelines", "dags", "mlflow", "airflow"},
    "agpo": {"student", "pipelines", "dags", "mlflow", "airflow"},
    "student": {"agpo", "pipelines", "dags", "mlflow", "airflow"},
    "pipelines": {"dags", "airflow", "deploy"},
    # the deployment drives services through their CLIs and REST APIs, beside dags/
    "deploy": {"agpo", "student", "pipelines", "dags", "mlflow"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_downward(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    wrong = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) & FORBIDDEN[package])
        for f in files
        if imported_packages(f) & FORBIDDEN[package]
    }
    assert not wrong, wrong


def test_only_the_tracking_module_imports_mlflow():
    importers = [
        str(f.relative_to(ROOT))
        for package in ("agpo", "student", "durable", "pipelines")
        for f in (ROOT / package).rglob("*.py")
        if "mlflow" in imported_packages(f)
    ]
    assert set(importers) <= {"pipelines/tracking.py"}, importers
