"""The relevance reward and its strict answer format (the ads pipeline's; the RL library takes any reward callable).

A teacher completion is an optional short reason followed by exactly one final answer tag:

    same category, colour differs <answer>2</answer>

``parse_grade`` accepts the text only when, after stripping whitespace, it ends with ``<answer>k</answer>``
(k an integer grade in the label set, spaces inside the tag allowed), the tag occurs once, and the reason
before it is at most ``MAX_REASON_CHARS`` characters. Anything else is unparseable (``None``): a missing or
repeated tag, text after the tag, a grade outside the label set, a runaway reason.
The reward is 1.0 when the parsed grade equals the gold grade, else 0.0; unparseable answers score 0.0.

The same format as a decoding constraint is ``pipelines.ads.teacher.answer_grammar.AnswerGrammar``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

ESCI_GRADES = (0, 1, 2, 3)
MAX_REASON_CHARS = 512
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_FINAL_ANSWER = re.compile(r"<answer>\s*([+-]?\d+)\s*</answer>\s*\Z")


def format_answer(grade: int, reason: str | None = None) -> str:
    """The canonical completion for ``grade`` (used by SFT targets and tests)."""
    answer = f"{ANSWER_OPEN}{grade}{ANSWER_CLOSE}"
    return f"{reason} {answer}" if reason else answer


def parse_grade(text: str, grades: Sequence[int] = ESCI_GRADES) -> int | None:
    """The final grade of a completion in the strict format, or None when it does not follow it."""
    if not isinstance(text, str):
        return None
    stripped = text.strip()
    match = _FINAL_ANSWER.search(stripped)
    if match is None or stripped.count(ANSWER_OPEN) != 1 or stripped.count(ANSWER_CLOSE) != 1:
        return None
    if len(stripped[: match.start()].strip()) > MAX_REASON_CHARS:
        return None
    grade = int(match.group(1))
    return grade if grade in grades else None


def relevance_reward(
    prompts: Sequence[str], completions: Sequence[str], *, gold_grade: Sequence[int | None], **_: object
) -> list[float | None]:
    """1.0 when the parsed grade equals ``gold_grade``, 0.0 otherwise (unparseable included).

    A row whose gold grade is None (unlabeled) gets None: there is nothing to verify.
    """
    if not len(prompts) == len(completions) == len(gold_grade):
        raise ValueError(
            f"prompts, completions and gold_grade must have equal lengths, got "
            f"{len(prompts)}, {len(completions)}, {len(gold_grade)}"
        )
    rewards: list[float | None] = []
    for completion, gold in zip(completions, gold_grade, strict=True):
        if gold is None:
            rewards.append(None)
        else:
            rewards.append(1.0 if parse_grade(completion) == int(gold) else 0.0)
    return rewards


def count_unparseable(completions: Sequence[str]) -> int:
    """How many completions do not follow the answer format."""
    return sum(parse_grade(c) is None for c in completions)
