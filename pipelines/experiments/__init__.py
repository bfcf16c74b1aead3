"""Cross-run experiments: train-compare (algorithms at an equal token budget), toy (the estimators on a
controlled toy policy) and compare (the pipeline runs of an MLflow experiment)."""
