"""The math RLVR path: loaders (data), the synthetic arithmetic task, and the stages math-train, math-eval,
math-compare and math-pipeline."""
