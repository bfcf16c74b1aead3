"""agpo: the RL library (advantage estimators, policy loss, adaptive controllers, evaluation).

It never imports ``student``, ``pipelines``, mlflow or airflow (see docs/design.md).
"""

__version__ = "0.1.0"
