"""Idempotent, tracked pipeline steps: what every DAG task runs through.

A step is ``work(log) -> dict of output paths``. ``run_step`` runs it once per run folder: it leaves
``<steps_dir>/<name>_SUCCESS.json`` with the outputs, and a rerun or an Airflow retry of a finished step
returns them without redoing the work or logging again (an interrupted step simply runs again and
resumes from its own checkpoints). The work is recorded as the step's child run in MLflow
(pipelines.tracking), with its params, and ``log`` is None when that child run already finished.
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
    cls: type, params: Mapping[str, Any], dag_run_id: str, keys: tuple[str, ...], algorithm_section: str
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


def tracker(tracking: TrackingConfig, caller: Caller, run_id: str, tags: Mapping[str, str]) -> Tracker:
    """The MLflow runs of one pipeline run, keyed like its output folder (a rerun attaches to them)."""
    all_tags = {"dag_id": caller.dag_id, "dag_run_id": caller.dag_run_id, "try_number": str(caller.try_number),
                "run_id": run_id, **tags}  # fmt: skip
    return Tracker(tracking, f"{caller.dag_id}/{run_id}", all_tags)


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
