"""evaluation: how a relevance model is judged, and against what (docs/design.md, the evaluation room).

- ``metrics``: the offline figures (accuracy, macro-F1, kappa, ROC-AUC and PR-AUC of "relevant", NDCG@k,
  calibration) and ``validation_scores``, what a student's training early-stops on (``student.training``
  takes it as its ``score``: the student library never decides what "better" means);
- ``bootstrap``: paired query-bootstrap intervals of the difference between two models on the same pairs;
- ``baseline_registry``: a baseline is one registered class (fit on gold, score pairs, save and load a folder,
  serve, a card); ``lexical`` and ``bm25`` register their own, ``zero_shot`` is the untrained sentence encoder
  read as a bi student, and ``baselines_config`` names the ones a run compares;
- ``comparison``: the comparison vocabulary (names, titles, interval figures) and the champion rule;
- ``predictors``: any saved model folder (a student or a baseline) back as a predictor, and ``backend_choice``,
  the serving backend a folder gets (``backend=auto``: the fastest that keeps quality).

It imports the student library (a student is what it scores; the zero-shot baseline is one) and never
``agpo``, ``pipelines``, mlflow or airflow; the student library never imports it.
"""
