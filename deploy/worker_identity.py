"""The hostname Airflow records for the task tries a Celery worker runs (``[core] hostname_callable``).

Airflow writes ``hostname_callable()`` into every task instance try. Several workers on one machine
would all record the same FQDN, so the stack gives each worker ``AGPO_WORKER_NAME`` and points
``hostname_callable`` here: the task-instance records then say which worker ran each try, the way
they would with one worker per machine.
"""

from __future__ import annotations

import os
import socket


def hostname() -> str:
    """``<worker name>@<fqdn>`` on a named worker, else the FQDN (Airflow's default)."""
    name = os.environ.get("AGPO_WORKER_NAME")
    return f"{name}@{socket.getfqdn()}" if name else socket.getfqdn()
