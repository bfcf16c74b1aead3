"""Rollout engines: ``hf`` (a lean decode loop over a transformers model, the CPU default) and ``vllm``
(imported lazily)."""

from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP, Rollout, RolloutEngine, encode_prompts
from agpo.rollout.hf import HFRolloutEngine

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "HFRolloutEngine", "Rollout", "RolloutEngine", "encode_prompts"]
