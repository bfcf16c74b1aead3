"""A synthetic, verifiable arithmetic task that a tiny model learns in minutes on a CPU.

Problems ``What is a + b?``, ``a - b``, ``a * b`` with operands of 1..``max_digits`` digits, drawn from a
seeded generator; the gold answer is the exact integer. Rows have the math-set shape of
pipelines.math.math_data (``id, problem, answer, subject`` = the operator, ``level`` = the operand digits,
``source``), so the trainer, the reward and math-eval treat them like GSM8K. ``sft_target`` is the
completion the warm start imitates: a one-line working and the ``\\boxed{}`` answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class ArithmeticConfig:
    """How many problems and how hard."""

    count: int = field(default=2000, metadata={"help": "problems generated"})
    max_digits: int = field(default=2, metadata={"help": "operands have 1..max_digits digits"})
    operators: tuple[str, ...] = field(default=("+", "-", "*"), metadata={"help": f"subset of {list(OPERATORS)}"})
    seed: int = field(default=0, metadata={"help": "generator seed"})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.operators) - set(OPERATORS))
        if unknown or not self.operators:
            raise ValueError(f"operators must be a non-empty subset of {list(OPERATORS)}, got {list(self.operators)}")
        if self.count < 1 or not 1 <= self.max_digits <= 6:
            raise ValueError(f"count must be >= 1 and max_digits in 1..6, got {self.count}, {self.max_digits}")


def arithmetic_problems(config: ArithmeticConfig) -> list[dict[str, Any]]:
    rng = random.Random(config.seed)
    rows = []
    for index in range(config.count):
        digits = rng.randint(1, config.max_digits)
        a, b = rng.randint(0, 10**digits - 1), rng.randint(0, 10**digits - 1)
        op = rng.choice(config.operators)
        rows.append(
            {
                "id": f"arith-{config.seed}-{index}",
                "problem": f"What is {a} {op} {b}?",
                "answer": str(OPERATORS[op](a, b)),
                "subject": op,
                "level": digits,
                "source": "arithmetic",
                "solution": None,
                "operands": (a, b),
            }
        )
    return rows


def sft_target(row: dict[str, Any]) -> str:
    a, b = row["operands"]
    return f" {a} {row['subject']} {b} = {row['answer']}. The answer is \\boxed{{{row['answer']}}}."
