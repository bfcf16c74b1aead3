"""Deployment of the pipeline on real distributed services (``python -m deploy.stack --help``).

Sits beside ``dags/``: it starts the services the DAGs run on and talks to them over their APIs; it
imports nothing of ``pipelines``, ``agpo`` or ``student``.
"""
