"""The math reward: math-verify with the GSM8K fallback (agpo.rewards.math)."""

from agpo.rewards import math_reward
from agpo.rewards.math import gsm8k_final_answer


def test_math_reward_uses_math_verify_and_gsm8k_fallback():
    completions = [
        "so the answer is \\boxed{72}",
        "Natalia sold 48 + 24 = 72 clips.\n#### 72",
        "\\boxed{\\frac{1}{2}}",
        "\\boxed{0.5}",
        "\\boxed{71}",
        "#### 1,234",
        "I do not know",
    ]
    gold = ["72", "72", "0.5", "\\frac{1}{2}", "72", "1234", "3"]
    assert math_reward(["q"] * 7, completions, answer=gold) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    assert math_reward(["q"], ["\\boxed{1}"], answer=[None]) == [None]
    assert gsm8k_final_answer("a #### 5\n b #### 1,000") == "1000"
