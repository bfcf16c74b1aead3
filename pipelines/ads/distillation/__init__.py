"""Stage 3, the student: distil (``agpo distil``), evaluate against the baselines a team has (evaluate, ``agpo
evaluate``; the baselines, metrics, intervals and the champion rule are the evaluation room's: evaluation/), the
evidence that binds what evaluate measured to bytes (evidence) and the run's report page (report_page)."""
