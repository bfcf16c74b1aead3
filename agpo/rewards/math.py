"""The math reward: math-verify equivalence of the final answer, with a GSM8K ``#### n`` fallback.

The gold answer is a string (``"72"``, ``"\\frac{1}{2}"``). The completion's final answer is read by
math-verify (``\\boxed{}`` first, then plain LaTeX / expressions); when math-verify finds nothing, a GSM8K
style ``#### n`` line is compared numerically. The reward is 1.0 for an equivalent answer, else 0.0.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from fractions import Fraction

from math_verify import parse, verify

TIMEOUT_SECONDS = 5
_MATH_DELIMITER = re.compile(r"(?<!\\)\$")
_GSM8K_FINAL = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")


def _as_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", "").strip())
    except (ValueError, ZeroDivisionError):
        return None


def gsm8k_final_answer(text: str) -> str | None:
    """The number after the last ``####`` in ``text``, commas removed."""
    matches = _GSM8K_FINAL.findall(text)
    return matches[-1].replace(",", "") if matches else None


def _timeout() -> int | None:
    # math-verify enforces its timeout with SIGALRM, which exists only in the main thread.
    return TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None


def math_equivalent(completion: str, gold: str) -> bool:
    """True when the completion's final answer equals ``gold`` (math-verify, then the #### fallback)."""
    # math-verify reads LaTeX only inside delimiters: a bare gold such as \\sqrt{51} must be wrapped as well
    # (an escaped \\$ in "\\$18.90" is a currency sign, not a delimiter)
    delimited = _MATH_DELIMITER.search(gold) is not None or "\\boxed" in gold
    gold_parsed = parse(gold if delimited else f"${gold}$", parsing_timeout=_timeout())
    answer = parse(completion, parsing_timeout=_timeout())
    if answer and gold_parsed and verify(gold_parsed, answer, timeout_seconds=_timeout()):
        return True
    final = gsm8k_final_answer(completion)
    if final is None:
        return False
    left, right = _as_number(final), _as_number(gold)
    return left is not None and left == right


def extract_answer(completion: str) -> str | None:
    """The completion's final answer as a string (for majority voting): math-verify's extraction, else
    the GSM8K ``#### n`` number; None when there is none."""
    parsed = parse(completion, parsing_timeout=_timeout())
    if parsed:
        return str(parsed[-1])
    return gsm8k_final_answer(completion)


def math_reward(
    prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[str | None], **_: object
) -> list[float | None]:
    """1.0 for a completion whose final answer is equivalent to the gold ``answer`` string, else 0.0."""
    if not len(prompts) == len(completions) == len(answer):
        raise ValueError(
            f"prompts, completions and answer must have equal lengths, got "
            f"{len(prompts)}, {len(completions)}, {len(answer)}"
        )
    return [
        None if gold is None else float(math_equivalent(c, str(gold)))
        for c, gold in zip(completions, answer, strict=True)
    ]
