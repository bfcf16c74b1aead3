"""The ads-relevance pipeline, in rooms by capability: ``intake`` (pairs in: data, import, readers, contracts),
``teacher`` (the LLM teacher: SFT, RL, prompts, answer format, reward, gate), ``annotation`` (labeling at scale
and human review), ``student`` (distil, evaluate, baselines, evidence), ``serving`` (registry, score, serve, the
MLflow model) and ``studies`` (experiments over the stages); ``pipeline`` runs the stages as one job."""
