"""Math benchmark loaders: GSM8K, MATH-500 and CMATH as one row shape, plus the prompt that asks for a
``\\boxed{}`` final answer.

Every loader reads a local JSONL file (``../shared/data/...`` in tests and benchmarks) and returns rows
``{"id", "problem", "answer", "subject", "level", "source"}`` where ``answer`` is the gold final answer as a
string that ``agpo.rewards.math.math_reward`` compares against:

- GSM8K (``question``, ``answer`` ending in ``#### n``): the number after ``####``, commas removed;
- MATH-500 (``problem``, ``answer``, ``subject``, ``level``, ``unique_id``): the given ``answer`` (the
  ``\\boxed{}`` content of the solution);
- CMATH (``input``, ``golden``, ``grade``): ``golden``; the school grade is the level.

A row that lacks a field, or whose gold answer cannot be read, raises ``MathDataError`` naming the file,
the line and the field. ``load_math_set(name, path)`` picks the loader by name; without a local path the
Hugging Face ``datasets`` hub name is used where a hub is reachable.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agpo.rewards.math import gsm8k_final_answer

PROMPT = (
    "Solve the problem. Reason step by step, then give only the final answer in \\boxed{{}}.\n\n"
    "Problem: {problem}\nSolution:"
)
HUB_NAMES = {"gsm8k": ("openai/gsm8k", "main", "test"), "math500": ("HuggingFaceH4/MATH-500", None, "test")}


class MathDataError(ValueError):
    """A math benchmark file or row that cannot be used; the message names the file, line and field."""


def render_prompt(problem: str) -> str:
    return PROMPT.format(problem=problem.strip())


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise MathDataError(f"{path} does not exist; pass the benchmark's JSONL file (see ../shared/data/README.md)")
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise MathDataError(f"{path}:{number}: not JSON ({err})") from None
    return rows


def _field(path: Path, number: int, row: dict[str, Any], name: str) -> Any:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise MathDataError(f"{path}:{number}: field {name!r} is missing or empty")
    return value


def load_gsm8k(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    rows = []
    for number, row in _jsonl(path):
        solution = _field(path, number, row, "answer")
        answer = gsm8k_final_answer(solution)
        if answer is None:
            raise MathDataError(f"{path}:{number}: field 'answer' has no '#### <number>' line: {solution[-60:]!r}")
        rows.append(
            {
                "id": f"gsm8k-{number}",
                "problem": _field(path, number, row, "question"),
                "answer": answer,
                "subject": "arithmetic",
                "level": None,
                "source": "gsm8k",
                "solution": solution,
            }
        )
    return rows


def load_math500(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    return [
        {
            "id": row.get("unique_id") or f"math500-{number}",
            "problem": _field(path, number, row, "problem"),
            "answer": str(_field(path, number, row, "answer")),
            "subject": row.get("subject"),
            "level": row.get("level"),
            "source": "math500",
            "solution": row.get("solution"),
        }
        for number, row in _jsonl(path)
    ]


def load_cmath(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    return [
        {
            "id": f"cmath-{number}",
            "problem": _field(path, number, row, "input"),
            "answer": str(_field(path, number, row, "golden")),
            "subject": "elementary",
            "level": row.get("grade"),
            "source": "cmath",
            "solution": None,
        }
        for number, row in _jsonl(path)
    ]


LOADERS: dict[str, Callable[[str | Path], list[dict[str, Any]]]] = {
    "gsm8k": load_gsm8k,
    "math500": load_math500,
    "cmath": load_cmath,
}


def load_math_set(name: str, path: str | Path | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` rows of benchmark ``name`` from ``path`` (or from the hub when no path)."""
    if name not in LOADERS:
        raise MathDataError(f"unknown math set {name!r}; choose one of {sorted(LOADERS)}")
    rows = _from_hub(name) if path is None else LOADERS[name](path)
    return rows[:limit] if limit is not None else rows


def _from_hub(name: str) -> list[dict[str, Any]]:
    if name not in HUB_NAMES:
        raise MathDataError(f"{name} has no hub name here; pass a local path")
    import datasets  # only on machines with a hub

    repo, subset, split = HUB_NAMES[name]
    data = datasets.load_dataset(repo, subset, split=split)
    if name == "gsm8k":
        return [
            {
                "id": f"gsm8k-{i}",
                "problem": r["question"],
                "answer": gsm8k_final_answer(r["answer"]),
                "subject": "arithmetic",
                "level": None,
                "source": "gsm8k",
                "solution": r["answer"],
            }
            for i, r in enumerate(data, 1)
        ]
    return [
        {
            "id": r["unique_id"],
            "problem": r["problem"],
            "answer": r["answer"],
            "subject": r["subject"],
            "level": r["level"],
            "source": "math500",
            "solution": r["solution"],
        }
        for r in data
    ]
