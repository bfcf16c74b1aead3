"""One log format for library code: every record of the project's loggers (``agpo``, ``pipelines``, ``student``,
``durable`` and below) carries the stage, the run and the shard it came from::

    2026-12-03 22:10:40,123 WARNING [annotate run=demo shard=2] pipelines.lease: shard-00002: ...

``configure_logging`` is called where a stage starts: ``agpo <stage>`` (pipelines.cli) and every Airflow task
(pipelines.steps.run_airflow_task, with the DAG run and the mapped index); where stderr is not a terminal it
also turns transformers' own progress bars off (``HF_HUB_DISABLE_PROGRESS_BARS``). Records go to the stderr of
the moment (an Airflow task's log captures it); the root logger is left alone, so nothing is written twice. Stage
summaries stay printed (pipelines.io.print_summary): they are for people at a terminal, and progress bars in a
log become log lines (pipelines.progress). Without ``configure_logging`` (a library caller), warnings still reach stderr
through Python's last-resort handler.
"""

from __future__ import annotations

import logging
import os
import sys

LOGGERS = ("agpo", "pipelines", "student", "durable")
FORMAT = "%(asctime)s %(levelname)s [%(stage)s run=%(run)s shard=%(shard)s] %(name)s: %(message)s"
_CONTEXT = {"stage": "-", "run": "-", "shard": "-"}


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.update(_CONTEXT)
        return True


class _CurrentStderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when a record is emitted (a task runner may swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(_ContextFilter())
        self.setFormatter(logging.Formatter(FORMAT))

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _) -> None:
        pass


def configure_logging(stage: str, run: str | None = None, shard: int | None = None) -> None:
    """Name the stage, run and shard on every later record, and give the project's loggers one stderr handler
    at INFO (once per process; a later call only changes the names)."""
    _CONTEXT.update(stage=stage, run=run or "-", shard="-" if shard is None or shard < 0 else str(shard))
    if not sys.stderr.isatty():  # transformers' own bars (loading weights, writing shards) would be frames too
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported
        if "transformers" in sys.modules:  # already imported: switch its bars off directly
            sys.modules["transformers"].utils.logging.disable_progress_bar()
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(handler, _CurrentStderr) for handler in logger.handlers):
            logger.addHandler(_CurrentStderr())
        logger.setLevel(logging.INFO)
        logger.propagate = False
