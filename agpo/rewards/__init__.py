"""Verifiable rewards: plain callables ``(prompts, completions, **columns) -> list[float | None]``.

``None`` means "nothing to verify" (no gold for that row); the trainer drops such rows.
"""

from agpo.rewards.math import math_reward
from agpo.rewards.relevance import ESCI_GRADES, format_answer, parse_grade, relevance_reward

__all__ = ["ESCI_GRADES", "format_answer", "math_reward", "parse_grade", "relevance_reward"]
