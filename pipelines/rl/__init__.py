"""The RL stage framework both pipelines' RL stages run on (stage) and the config fields they share
(stage_fields; engine_fields: the rollout engine's, also annotation's)."""
