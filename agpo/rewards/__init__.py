"""Verifiable rewards: plain callables ``(prompts, completions, **columns) -> list[float | None]``.

``None`` means "nothing to verify" (no gold for that row); the trainer drops such rows. The math reward lives
here; the relevance reward is the ads pipeline's (pipelines.ads.teacher.relevance_reward).
"""

from agpo.rewards.math import math_reward

__all__ = ["math_reward"]
