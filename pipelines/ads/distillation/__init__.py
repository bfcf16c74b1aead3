"""The student stages: distil (``agpo distil``), evaluate against the baselines a team has (evaluate, ``agpo
evaluate``; the baselines themselves are the student library's, student.baseline_registry) and the evidence that binds
what evaluate measured to bytes (evidence)."""
