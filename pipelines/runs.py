"""The current run: whose folders a stage's default paths name when it runs on its own (``agpo annotate``, ``agpo
review export``, ``agpo score``, ...), so the commands after ``make demo`` find what the demo wrote.

A pipeline run keeps everything under ``work/runs/<run name>/`` (pipelines.ads.pipeline_config.Layout: ``data/``,
``teacher/sft``, ``teacher/rl``, ``annotate/``, ``student/``). A stage's default path is the same place in the
current run: ``agpo --run NAME <stage>``, else ``AGPO_RUN``, else ``demo`` (what ``make demo`` runs), e.g.
``annotate.out_dir`` = ``work/runs/demo/annotate``. The project's MLflow store, ``work/mlflow``, is shared by
every run and stays where it is. An explicit ``--set`` or ``--config`` value is used as given.

A pipeline's own ``run_id`` (``agpo pipeline``, ``agpo math-pipeline``: ``<out_dir>/<run_id>/``) follows the same
``--run`` / ``AGPO_RUN``, else ``local``: a pipeline run from the command line never writes into the demo's folder
(``make demo`` runs the DAG, which sets ``run_id`` itself). ``--run NAME`` beside an explicit ``run_id`` that names
another run is a config error (``check_run_agrees``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import field
from typing import Any

from pipelines.steps import check_path_name

RUN_ENV = "AGPO_RUN"
DEFAULT_RUN = "demo"
PIPELINE_DEFAULT_RUN = "local"
RUNS_DIR = "work/runs"


def current_run(default: str = DEFAULT_RUN) -> str:
    """``AGPO_RUN`` (set by ``agpo --run NAME``), else ``default`` (``demo``)."""
    run = os.environ.get(RUN_ENV, "").strip() or default
    check_path_name(RUN_ENV, run)
    return run


def run_path(relative: str) -> str:
    """``relative`` inside the current run's folder: ``work/runs/<run>/<relative>``."""
    return f"{RUNS_DIR}/{current_run()}/{relative}"


def run_path_field(relative: str, help: str) -> Any:
    """A config field whose default is ``run_path(relative)``, taken when the config is made (after ``--run``)."""
    return field(
        default_factory=functools.partial(run_path, relative),
        metadata={"help": f"{help}; default in the current run's folder (agpo --run NAME, AGPO_RUN, else demo)"},
    )


def run_id_field() -> Any:
    """A pipeline's ``run_id`` field: the current run (``agpo --run NAME``, ``AGPO_RUN``), else ``local``."""
    return field(
        default_factory=functools.partial(current_run, PIPELINE_DEFAULT_RUN),
        metadata={"help": "run id: outputs go to <out_dir>/<run_id>/; default agpo --run NAME, AGPO_RUN, else local"},
    )


def check_run_agrees(run: str | None, config: object) -> None:
    """``agpo --run NAME`` and a config whose ``run_id`` (``--set``, ``--config``) names another run: ValueError."""
    run_id = getattr(config, "run_id", None)
    if run is not None and run_id is not None and run_id != run:
        raise ValueError(
            f"--run {run!r} and run_id {run_id!r} name different runs: drop the run_id setting (--set or --config) "
            f"to write {run!r}, or drop --run to write {run_id!r}"
        )
