"""Math benchmark loaders: GSM8K, MATH-500 and CMATH as one row shape, plus the prompt that asks for a
``\\boxed{}`` final answer.

Every loader reads a local JSONL file (``../shared/data/...`` in tests and benchmarks) through Hugging Face
``datasets`` (its ``json`` builder, in a throw-away cache) and returns rows
``{"id", "problem", "answer", "subject", "level", "source", "solution"}`` where ``answer`` is the gold final
answer as a string that ``agpo.rewards.math.math_reward`` compares against:

- GSM8K (``question``, ``answer`` ending in ``#### n``): the number after ``####``, commas removed;
- MATH-500 (``problem``, ``answer``, ``subject``, ``level``, ``unique_id``): the given ``answer`` (the
  ``\\boxed{}`` content of the solution);
- CMATH (``input``, ``golden``, ``grade``): ``golden``; the school grade is the level.

A row that lacks a field, or whose gold answer cannot be read, raises ``MathDataError`` naming the file,
the line and the field; a line that is not JSON is named too. ``load_math_set(name, path)`` picks the
loader by name; without a local path the ``datasets`` hub name is used where a hub is reachable, with the
same row checks.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agpo.rewards.math import gsm8k_final_answer
from pipelines.io import require_file

PROMPT = (
    "Solve the problem. Reason step by step, then give only the final answer in \\boxed{{}}.\n\n"
    "Problem: {problem}\nSolution:"
)
HUB_NAMES = {"gsm8k": ("openai/gsm8k", "main", "test"), "math500": ("HuggingFaceH4/MATH-500", None, "test")}


class MathDataError(ValueError):
    """A math benchmark file or row that cannot be used; the message names the file, line and field."""


def render_prompt(problem: str) -> str:
    return PROMPT.format(problem=problem.strip())


def _jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(file:line, row)`` for every non-blank line, read by ``datasets``."""
    import datasets  # a second of imports: only when a set is loaded

    require_file(path, "math set", "pass the benchmark's JSONL file (see ../shared/data/README.md)", MathDataError)
    lines = [n for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    with tempfile.TemporaryDirectory(prefix="math-data-") as cache:
        try:
            table = datasets.load_dataset(
                "json", data_files=str(path), split="train", cache_dir=cache, keep_in_memory=True
            )
        except Exception as err:  # datasets wraps the JSON reader's error: find the line it could not read
            raise MathDataError(_first_unreadable_line(path) or f"{path}: not readable as JSON lines ({err})") from None
        rows = table.to_list()
    return [(f"{path}:{number}", row) for number, row in zip(lines, rows, strict=True)]


def _first_unreadable_line(path: Path) -> str | None:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                json.loads(line)
            except json.JSONDecodeError as err:
                return f"{path}:{number}: not JSON ({err})"
    return None


def _field(where: str, row: dict[str, Any], name: str) -> Any:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise MathDataError(f"{where}: field {name!r} is missing or empty")
    return value


def gsm8k_row(where: str, row: dict[str, Any], number: int) -> dict[str, Any]:
    solution = _field(where, row, "answer")
    answer = gsm8k_final_answer(solution)
    if answer is None:
        raise MathDataError(f"{where}: field 'answer' has no '#### <number>' line: {solution[-60:]!r}")
    return {
        "id": f"gsm8k-{number}",
        "problem": _field(where, row, "question"),
        "answer": answer,
        "subject": "arithmetic",
        "level": None,
        "source": "gsm8k",
        "solution": solution,
    }


def math500_row(where: str, row: dict[str, Any], number: int) -> dict[str, Any]:
    return {
        "id": row.get("unique_id") or f"math500-{number}",
        "problem": _field(where, row, "problem"),
        "answer": str(_field(where, row, "answer")),
        "subject": row.get("subject"),
        "level": row.get("level"),
        "source": "math500",
        "solution": row.get("solution"),
    }


def cmath_row(where: str, row: dict[str, Any], number: int) -> dict[str, Any]:
    return {
        "id": f"cmath-{number}",
        "problem": _field(where, row, "input"),
        "answer": str(_field(where, row, "golden")),
        "subject": "elementary",
        "level": row.get("grade"),
        "source": "cmath",
        "solution": None,
    }


RowReader = Callable[[str, dict[str, Any], int], dict[str, Any]]
ROWS: dict[str, RowReader] = {"gsm8k": gsm8k_row, "math500": math500_row, "cmath": cmath_row}
MATH_SETS = tuple(sorted(ROWS))


def _read(name: str, records: Iterable[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [ROWS[name](where, row, number) for number, (where, row) in enumerate(records, 1)]


def load_math_set(name: str, path: str | Path | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` rows of benchmark ``name`` from ``path`` (or from the hub when no path)."""
    if name not in ROWS:
        raise MathDataError(f"unknown math set {name!r}; choose one of {sorted(ROWS)}")
    rows = _from_hub(name) if path is None else _read(name, _jsonl(Path(path)))
    return rows[:limit] if limit is not None else rows


def _from_hub(name: str) -> list[dict[str, Any]]:
    if name not in HUB_NAMES:
        raise MathDataError(f"{name} has no hub name here; pass a local path")
    import datasets

    repo, subset, split = HUB_NAMES[name]
    data = datasets.load_dataset(repo, subset, split=split)
    return _read(name, ((f"{repo}[{i}]", row) for i, row in enumerate(data)))
