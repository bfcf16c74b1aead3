"""How the ads DAGs run in operations: pools, retries sized per task, a failure alert and a deadline alert.

Pools: the accelerator tasks run in ``AGPO_ACCELERATOR_POOL`` (``agpo_accelerator``,
``AGPO_ACCELERATOR_POOL_SLOTS`` slots, default 1: one GPU), the annotation shards in ``AGPO_ANNOTATION_POOL``
(``agpo_annotation``, ``AGPO_ANNOTATION_POOL_SLOTS``, default ``AGPO_PARALLEL_SHARDS``). The deployment creates
them (deploy/stack.py ``up``) and so does ``make demo`` (``python dags/agpo_operations.py`` prints them for
``airflow pools import``). The scheduler never queues a task whose pool is missing ("will not be scheduled");
``airflow dags test`` runs tasks without an executor and ignores pools, so its tests need none.

Retries (``retry_exponential_backoff`` is a multiplier in Airflow 3: 2.0 doubles each delay, capped by
``max_retry_delay``): ``QUICK`` for CPU tasks of seconds to minutes, 3 retries from 10 s (5 min cap);
``ACCELERATOR`` for GPU tasks of hours, 2 retries from ``AGPO_ACCELERATOR_RETRY_DELAY`` seconds (300: a lost
worker's task waits for a machine, not a blip), capped at 1 h; ``LONG`` for the day-long ``train``, one retry
(it resumes from its checkpoint; a second would pass the run's deadline). Config and contract errors fail
without retrying (pipelines/steps.py), whatever the profile.

``AlertNotifier`` (Airflow's ``BaseNotifier``) is each task's ``on_failure_callback`` and the callback of the
run's ``DeadlineAlert`` (``run_deadline``: queued-at plus ``AGPO_<DAG>_DEADLINE_HOURS``). Its message names the
DAG run, the task, the reason (the exception) and where the log is (the task's log URL in the UI and the log
file under ``[logging] base_log_folder``); it POSTs it as JSON to ``AGPO_ALERT_WEBHOOK``, read when it sends, so
the URL (often a secret) is in no DAG, callback kwargs or log line; unset, it only logs the message. Task
callbacks run in the worker's task process, or in the DAG processor for a task whose process was lost (``LOST``):
both need the webhook.

DAG files import this module from the DAG folder, which Airflow puts on ``sys.path`` (a bundle's root); it
imports only Airflow and the standard library, so parsing stays fast.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

from airflow.sdk import BaseNotifier, DeadlineAlert, DeadlineReference, SyncCallback

ALERT_WEBHOOK = "AGPO_ALERT_WEBHOOK"
# the reason of a failure with no exception: the scheduler found the task gone, and the DAG processor runs the callback
LOST = "failed with no exception recorded: its process was lost, killed or stopped heartbeating (see its log)"
ACCELERATOR_POOL = os.environ.get("AGPO_ACCELERATOR_POOL", "agpo_accelerator")
ANNOTATION_POOL = os.environ.get("AGPO_ANNOTATION_POOL", "agpo_annotation")
# annotation shards that may run at once; each divides the worker's CPUs by this (pipelines.threads)
PARALLEL_SHARDS = int(os.environ.get("AGPO_PARALLEL_SHARDS", "2"))

QUICK = {
    "retries": 3,
    "retry_delay": timedelta(seconds=10),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=5),
}
ACCELERATOR = {
    "retries": 2,
    "retry_delay": timedelta(seconds=float(os.environ.get("AGPO_ACCELERATOR_RETRY_DELAY", "300"))),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(hours=1),
}
LONG = {**ACCELERATOR, "retries": 1}


def pools() -> dict[str, dict]:
    """The pools the DAGs use, sized from the environment, in ``airflow pools import``'s format."""
    return {
        ACCELERATOR_POOL: {
            "slots": int(os.environ.get("AGPO_ACCELERATOR_POOL_SLOTS", "1")),
            "description": "ads-relevance accelerator tasks: teacher, RL, distil, evaluate, scoring",
            "include_deferred": False,
        },
        ANNOTATION_POOL: {
            "slots": int(os.environ.get("AGPO_ANNOTATION_POOL_SLOTS", PARALLEL_SHARDS)),
            "description": "ads-relevance annotation shards (the teacher labels pairs)",
            "include_deferred": False,
        },
    }


class AlertError(RuntimeError):
    """The webhook refused or could not be reached; the message holds no part of its URL."""


class AlertNotifier(BaseNotifier):
    """Sends ``alert(context)``: a task's failure (its callback context) or a run's missed deadline."""

    def notify(self, context) -> None:
        message = alert(context)
        target = os.environ.get(ALERT_WEBHOOK)
        if not target:
            self.log.warning("no %s set; the alert: %s", ALERT_WEBHOOK, json.dumps(message))
            return
        post_json(target, message)
        self.log.info("alert sent to $%s: %s", ALERT_WEBHOOK, message["text"])


def alert(context) -> dict:
    """The alert for ``context``: run, task, reason and log location, and a one-line ``text`` of them."""
    if "ti" not in context:  # a deadline callback's context: the run (as the REST API shows it) and the deadline
        run, deadline = context.get("dag_run") or {}, context.get("deadline") or {}
        reason = f"deadline missed: not finished by {deadline.get('deadline_time')} (queued {run.get('queued_at')})"
        message = {"event": "deadline_missed", "dag_id": run.get("dag_id"), "run_id": run.get("dag_run_id")}
        message |= {"task_id": None, "reason": reason, "log_url": None, "log_file": None}
    else:
        ti, error = context["ti"], context.get("exception")
        reason = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error or LOST)
        message = {"event": "task_failed", "dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id}
        message |= {"map_index": ti.map_index, "try_number": ti.try_number, "reason": reason}
        message |= {"log_url": ti.log_url, "log_file": log_file(ti)}
    where = f" task {message['task_id']}" if message["task_id"] else ""
    log = f"; log: {message['log_url']}" if message["log_url"] else ""
    message["text"] = f"{message['dag_id']} run {message['run_id']}{where}: {reason}{log}"
    return message


def log_file(ti) -> str | None:
    """The task try's log file, as ``[logging] log_filename_template`` names it under ``base_log_folder``."""
    import jinja2
    from airflow.sdk.configuration import conf

    folder = conf.get("logging", "base_log_folder", fallback=None)
    template = conf.get("logging", "log_filename_template", fallback=None)
    if not folder or not template:
        return None
    return os.path.join(folder, jinja2.Template(template).render(ti=ti, try_number=ti.try_number))


def post_json(url: str, message: dict, timeout: float = 10) -> None:
    """POST ``message`` as JSON to ``url``; an error names the variable, never the URL (it may hold a token)."""
    headers = {"Content-Type": "application/json"}
    try:
        request = urllib.request.Request(url, data=json.dumps(message).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
    except urllib.error.HTTPError as err:
        raise AlertError(f"the alert webhook (${ALERT_WEBHOOK}) answered HTTP {err.code}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise AlertError(f"the alert webhook (${ALERT_WEBHOOK}) is unreachable: {type(reason).__name__}") from None
    except ValueError:  # urllib's message quotes the URL
        raise AlertError(f"${ALERT_WEBHOOK} is not an http(s) URL") from None


def run_deadline(variable: str, default_hours: float) -> DeadlineAlert | None:
    """An alert when a run is not done ``$variable`` hours (``default_hours``) after it was queued; None under
    ``airflow dags test`` (``make demo``): its runs are never queued, so no deadline would start, and Airflow 3.3.2's
    ``dags test`` fails a DAG with a deadline once its run succeeds (``DagRun.update_state`` looks the alerts up by
    id, and ``dags test``'s DAG holds them in their serialized form: ``'dict' object has no attribute 'hex'``)."""
    if Path(sys.argv[0]).name == "airflow" and sys.argv[1:3] == ["dags", "test"]:
        return None
    hours = float(os.environ.get(variable, default_hours))
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(hours=hours),
        callback=SyncCallback(AlertNotifier),
    )


if __name__ == "__main__":  # make demo: python dags/agpo_operations.py > pools.json; airflow pools import pools.json
    print(json.dumps(pools(), indent=2))
