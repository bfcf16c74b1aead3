"""The current run: whose folders a stage's default paths name when it runs on its own (``agpo annotate``, ``agpo
review export``, ``agpo score``, ...), so the commands after ``make demo`` find what the demo wrote.

A pipeline run keeps everything under ``work/runs/<run name>/`` (pipelines.ads.pipeline_config.Layout: ``data/``,
``teacher/sft``, ``teacher/rl``, ``annotate/``, ``student/``). A stage's default path is the same place in the
current run: ``agpo --run NAME <stage>``, else ``AGPO_RUN``, else ``demo`` (what ``make demo`` runs), e.g.
``annotate.out_dir`` = ``work/runs/demo/annotate``. The project's MLflow store, ``work/mlflow``, is shared by
every run and stays where it is. An explicit ``--set`` or ``--config`` value is used as given.
"""

from __future__ import annotations

import functools
import os
from dataclasses import field
from typing import Any

from pipelines.steps import check_path_name

RUN_ENV = "AGPO_RUN"
DEFAULT_RUN = "demo"
RUNS_DIR = "work/runs"


def current_run() -> str:
    """``AGPO_RUN`` (set by ``agpo --run NAME``), else ``demo``."""
    run = os.environ.get(RUN_ENV, "").strip() or DEFAULT_RUN
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
