"""Progress and logs as a worker's log file receives them: no carriage-return frames, one format that names the
stage, run and shard."""

import io
import logging
import re
import sys

from pipelines import logs
from pipelines.logs import configure_logging
from pipelines.progress import LoggedProgress, progress_bar


def test_a_bar_in_a_log_is_log_lines_without_carriage_returns(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)  # not a terminal: what an Airflow task's stderr is
    monkeypatch.setenv("AGPO_PROGRESS_SECONDS", "3600")  # no line in between: the first and the last only
    configure_logging("annotate", "demo", 2)
    bar = progress_bar(total=500, desc="annotate", unit="pair")
    assert isinstance(bar, LoggedProgress)
    with bar:
        for _ in range(500):
            bar.update()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 2, lines  # at the start and at the end, not one frame per update
    assert re.fullmatch(
        r"\S+ \S+ INFO \[annotate run=demo shard=2\] agpo\.progress: annotate:   0%.* 0/500 .*", lines[0]
    )
    assert "100%" in lines[1] and "500/500" in lines[1]


def test_a_library_warning_names_its_stage_and_an_unmapped_task_has_no_shard(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    configure_logging("distil", "weekly-7", -1)  # Airflow's map_index of an unmapped task
    configure_logging("distil", "weekly-7", -1)  # twice in one process: still one handler
    logging.getLogger("pipelines.lease").warning("shard-00001: lease lost")
    [line] = log.getvalue().splitlines()
    assert line.endswith("WARNING [distil run=weekly-7 shard=-] pipelines.lease: shard-00001: lease lost")
    assert logging.getLogger("pipelines").propagate is False  # the root logger's handlers do not repeat it


def test_a_terminal_gets_tqdms_own_bar(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    bar = progress_bar(total=3, desc="x")
    assert not isinstance(bar, LoggedProgress)
    bar.close()


def teardown_module():  # leave the loggers as a library caller finds them
    logs._CONTEXT.update(stage="-", run="-", shard="-")
    for name in logs.LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not isinstance(h, logs._CurrentStderr)]
        logger.setLevel(logging.NOTSET)
        logger.propagate = True
