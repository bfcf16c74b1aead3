"""The dependency direction of DESIGN.md: dags -> pipelines -> {agpo, student}; mlflow only in tracking."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "agpo": {"student", "pipelines", "dags", "mlflow", "airflow"},
    "student": {"agpo", "pipelines", "dags", "mlflow", "airflow"},
    "pipelines": {"dags", "airflow"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_downstream(package):
    for path in (ROOT / package).rglob("*.py"):
        bad = imported_roots(path) & FORBIDDEN[package]
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
        if package == "pipelines" and path.name != "tracking.py":
            assert "mlflow" not in imported_roots(path), f"{path.relative_to(ROOT)}: only tracking.py imports mlflow"
