"""Progress bars that suit where their output goes.

On a terminal, tqdm's bar, redrawn in place. Anywhere else (an Airflow task log, a file, CI) tqdm would
write the same carriage-return frames (``\\r``), which a log keeps as one line of thousands of characters;
there ``progress_bar`` gives a ``LoggedProgress`` instead: the same counts and rates as one ``logging``
line (logger ``agpo.progress``) at the start, at most every ``LOG_EVERY_SECONDS`` (``AGPO_PROGRESS_SECONDS``
overrides it) and at the end. ``quiet_library_bars`` turns off, there, the bars libraries draw themselves.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from tqdm import tqdm

LOG_EVERY_SECONDS = 30.0
LOGGER = logging.getLogger("agpo.progress")


def log_every_seconds() -> float:
    value = os.environ.get("AGPO_PROGRESS_SECONDS", "").strip()
    try:
        return float(value) if value else LOG_EVERY_SECONDS
    except ValueError:
        raise ValueError(f"AGPO_PROGRESS_SECONDS={value!r} must be a number of seconds") from None


class LoggedProgress(tqdm):
    """tqdm that logs a line instead of redrawing: every ``mininterval`` seconds (``log_every_seconds``), and
    once when it closes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["mininterval"] = max(float(kwargs.get("mininterval") or 0.0), log_every_seconds())
        kwargs["maxinterval"] = kwargs["mininterval"]  # tqdm's monitor must not force a line sooner
        kwargs["file"] = _Discard()  # display logs instead; tqdm's closing newline goes nowhere
        kwargs["ascii"], kwargs["ncols"] = True, 100  # a bar of # that any log viewer shows alike
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        LOGGER.info(msg if msg is not None else self.format_meter(**self.format_dict))
        return True


class _Discard:
    def write(self, _: str) -> None:
        pass

    def flush(self) -> None:
        pass


def quiet_library_bars() -> None:
    """Off a terminal, switch off the bars libraries draw on their own, which would spill the same redraw frames
    into the log: MLflow's artifact download bar (``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``, read at each
    download). A value the environment already sets wins."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def progress_bar(*args: Any, **kwargs: Any) -> tqdm:
    """tqdm's bar when stderr is a terminal, else a ``LoggedProgress`` with the same arguments."""
    return tqdm(*args, **kwargs) if sys.stderr.isatty() else LoggedProgress(*args, **kwargs)
