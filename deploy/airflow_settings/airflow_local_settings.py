"""The stack's Airflow cluster policy: the register step runs on the register worker's queue, and only it.

Airflow imports ``airflow_local_settings`` from its Python path; the stack puts this folder there (its
processes' ``PYTHONPATH``, deploy/airflow_services.py) and names the queue in ``$AGPO_REGISTER_QUEUE``. The
DAG processor applies ``task_policy`` to every task it parses, so the register step of the ads DAG goes to
that queue whatever its DAG file says; the worker that takes it (``registrar``) runs as an OS user of its own
with the one MLflow identity that may move the ``champion`` alias (deploy/isolation.py). Without
``$AGPO_REGISTER_QUEUE`` (any Airflow but the stack's) the policy changes nothing.
"""

from __future__ import annotations

import os

REGISTER_STEPS = {("ads_relevance_agpo", "register")}  # (dag id, task id) of each step that registers a model


def task_policy(task) -> None:
    queue = os.environ.get("AGPO_REGISTER_QUEUE")
    if queue and (task.dag_id, task.task_id) in REGISTER_STEPS:
        task.queue = queue
