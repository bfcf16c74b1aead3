"""Idempotent, tracked pipeline steps: what every DAG task runs through, for every pipeline.

A pipeline module (pipelines.ads.pipeline, pipelines.math.pipeline) describes one run as a ``PipelineRun``
(its folder, run id, MLflow settings, tags and caller) and each of its steps as ``work(log) -> dict of
output paths``. ``PipelineRun.once`` runs a step once per run folder: it leaves
``<root>/steps/<name>_SUCCESS.json`` with the outputs, and a rerun or an Airflow retry of a finished step
returns them without redoing the work or logging again (an interrupted step simply runs again and resumes
from its own checkpoints). The work is recorded as the step's child run in MLflow (pipelines.tracking),
with its params, and ``log`` is None when that child run already finished. ``from_airflow`` turns a DAG
run's params into a pipeline config and its caller; ``check_run_id`` is the run id rule of every pipeline.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.config import load_config, to_dict
from pipelines.io import write_json_atomic
from pipelines.tracking import StageRun, Tracker, TrackingConfig

SUCCESS = "_SUCCESS.json"
PROJECT_ROOT = Path(__file__).resolve().parents[1]  # where configs/ lives in a checkout


@dataclass(frozen=True)
class Caller:
    """Who runs a step: the Airflow DAG run and try, or the CLI."""

    dag_id: str = "cli"
    dag_run_id: str = "local"
    try_number: int = 1


CLI = Caller()  # a step run from the command line


RUN_ID = re.compile(r"[A-Za-z0-9_.\-]+")


def check_run_id(run_id: str) -> None:
    """A run id names a folder and MLflow runs: letters, digits, '_', '.', '-' only."""
    if not RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id must use letters, digits, '_', '.', '-' only, got {run_id!r}")


def safe_run_id(airflow_run_id: str) -> str:
    """An Airflow run id (``manual__2026-11-30T10:00:00+00:00``) as a folder name."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", airflow_run_id).strip("-")


def preset(entry: str) -> str:
    """``[SECTION=]FILE.yaml`` with FILE found from the working folder, else from the project's root."""
    section, sep, path = entry.rpartition("=") if "=" in entry else ("", "", entry)
    if not Path(path).is_file() and (PROJECT_ROOT / path).is_file():
        path = str(PROJECT_ROOT / path)
    return f"{section}{sep}{path}"


def config_from_params(
    cls: type, params: Mapping[str, Any], dag_run_id: str, keys: Mapping[str, str], algorithm_section: str = "train"
):
    """A pipeline config from DAG params: ``presets``, ``algorithm`` (its preset mounted under
    ``algorithm_section``), each param of ``keys`` (param name -> config key) when set, ``overrides``; the
    run id is ``run_name`` or the Airflow run id."""
    presets = [preset(p) for p in params.get("presets") or []]
    if params.get("algorithm"):
        presets.append(preset(f"{algorithm_section}=configs/train/{params['algorithm']}.yaml"))
    sets = [f"run_id={params.get('run_name') or safe_run_id(dag_run_id)}"]
    sets += [f"{key}={params[name]}" for name, key in keys.items() if params.get(name) is not None]
    sets += list(params.get("overrides") or [])
    return load_config(cls, presets, sets)


def from_airflow(
    cls: type, params: Mapping[str, Any], dag_id: str, dag_run_id: str, try_number: int, keys: Mapping[str, str]
) -> tuple[Any, Caller]:
    """The config of a DAG run (``config_from_params``) and who runs it."""
    return config_from_params(cls, params, dag_run_id, keys), Caller(dag_id, dag_run_id, int(try_number))


@dataclass(frozen=True)
class PipelineRun:
    """One run of a pipeline as its steps see it: its folder, its MLflow runs and who runs it."""

    root: Path
    run_id: str
    tracking: TrackingConfig
    caller: Caller
    tags: Mapping[str, str]

    def tracker(self) -> Tracker:
        """The MLflow runs of this run, keyed like its output folder (a rerun attaches to them)."""
        caller = self.caller
        all_tags = {
            "dag_id": caller.dag_id,
            "dag_run_id": caller.dag_run_id,
            "try_number": str(caller.try_number),
            "run_id": self.run_id,
            **self.tags,
        }
        return Tracker(self.tracking, f"{caller.dag_id}/{self.run_id}", all_tags)

    def once(self, name: str, params: Any, work: Callable[[StageRun | None], dict[str, Any]]) -> dict[str, str]:
        """Step ``name`` of this run (``run_step`` in ``<root>/steps``)."""
        return run_step(self.root / "steps", self.tracker, self.caller, name, params, work)


def run_step(
    steps_dir: Path,
    make_tracker: Callable[[], Tracker],
    caller: Caller,
    name: str,
    params: Any,
    work: Callable[[StageRun | None], dict[str, Any]],
) -> dict[str, str]:
    """Run ``work`` as step ``name`` unless it already succeeded; record it in MLflow; return its paths."""
    marker = steps_dir / f"{name}{SUCCESS}"
    if marker.is_file():
        return json.loads(marker.read_text())["outputs"]
    started = time.perf_counter()
    with make_tracker().stage(name, to_dict(params), caller.try_number) as log:
        outputs = {k: str(v) for k, v in work(log).items()}
        if log is not None:
            log.log_metrics({"step_seconds": time.perf_counter() - started})
    write_json_atomic(marker, {"step": name, "outputs": outputs, "try_number": caller.try_number})
    return outputs


def log_training(log: StageRun, paths: Mapping[str, Any]) -> None:
    """A training stage's outputs into its child run: every line of ``metrics.jsonl`` at its step, the
    summary's figures, and the summary and curves files."""
    rows = [json.loads(line) for line in Path(paths["metrics"]).read_text().splitlines() if line.strip()]
    log.log_step_metrics(rows)
    log.log_metrics(read_json(paths["summary"]))
    for name in ("summary", "curves"):
        if name in paths:
            log.log_artifact(paths[name])


def read_json(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
