"""student: the small relevance model distilled from the teacher's labels (arrives with the distillation stage).

It never imports ``agpo``, ``pipelines``, mlflow or airflow (see docs/design.md).
"""
