"""Config resolution is fast: every stage's config module builds its config without importing torch or the
other heavy libraries, and ``agpo STAGE --print-config`` and config errors never import them (issue 36).

Each check runs in a fresh interpreter: this test process has imported them long ago."""

import json
import subprocess
import sys

import pytest

from pipelines.cli import STAGES

HEAVY = (
    "torch",
    "transformers",
    "mlflow",
    "sklearn",
    "scipy",
    "pandas",
    "onnxruntime",
    "sentence_transformers",
    "datasets",
    "airflow",
)

# Imports the config modules one after the other, each building its default config, and reports every heavy
# library under the first module after whose import it was loaded.
IMPORT_CONFIGS = """
import importlib, json, sys
from pipelines.config import load_config
heavy, stages = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pulled = {}
for module, config_class in stages:
    load_config(getattr(importlib.import_module(module), config_class))
    seen = {name for names in pulled.values() for name in names}
    new = [name for name in heavy if name in sys.modules and name not in seen]
    if new:
        pulled[module] = new
print(json.dumps(pulled))
"""

# Runs the agpo command in-process and reports its exit code and the heavy libraries loaded by then.
RUN_MAIN = """
import contextlib, io, json, sys
from pipelines.cli import main
heavy, argv = json.loads(sys.argv[1]), json.loads(sys.argv[2])
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(argv)
print(json.dumps({"code": code, "heavy": [name for name in heavy if name in sys.modules]}))
"""


def run_python(code: str, *args: object) -> object:
    done = subprocess.run(
        [sys.executable, "-c", code, *(json.dumps(a) for a in args)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_stage_config_builds_without_heavy_imports():
    stages = sorted({(stage.config_module, stage.config_class) for stage in STAGES.values()})
    pulled = run_python(IMPORT_CONFIGS, HEAVY, stages)
    assert not pulled, f"config modules that import heavy libraries (module: what it loaded first): {pulled}"


@pytest.mark.parametrize(
    ("argv", "code"), [(["pipeline", "--print-config"], 0), (["pipeline", "--set", "nosuchkey=1"], 2)]
)
def test_print_config_and_config_errors_import_no_torch(argv, code):
    assert run_python(RUN_MAIN, HEAVY, argv) == {"code": code, "heavy": []}
