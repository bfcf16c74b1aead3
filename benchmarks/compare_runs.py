"""Are two runs' figures the same? Every JSON and JSON-lines file of one run folder against the same file of the
other, leaving out what differs between any two runs: times and rates (keys naming seconds, time, per_s,
elapsed, date), and strings holding a path or URI (a ``/``) or an MLflow run id. What is left (counts, metrics,
losses, grades, summaries) must be equal to the digit.

    python benchmarks/compare_runs.py BEFORE/work/runs/NAME AFTER/work/runs/NAME

Prints each file that differs (with the first key that does) and a count; exits 1 when any file differs or is
missing. Used to show that a change of code left a run's figures as they were (docs/operations.md, "Devices").
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

TIMING = re.compile(r"seconds|time|per_s|elapsed|date")
RUN_ID = re.compile(r"[0-9a-f]{32}")


def figures(value: Any) -> Any:
    """``value`` without timings, paths and run ids (module docstring)."""
    if isinstance(value, dict):
        return {k: figures(v) for k, v in value.items() if not TIMING.search(str(k))}
    if isinstance(value, list):
        return [figures(v) for v in value]
    if isinstance(value, str) and ("/" in value or RUN_ID.fullmatch(value)):
        return "<path or id>"
    return value


def read(path: Path) -> list[Any]:
    lines = path.read_text(encoding="utf-8").splitlines() if path.suffix == ".jsonl" else [path.read_text()]
    return [figures(json.loads(line)) for line in lines if line.strip()]


def first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return first_difference(a.get(key), b.get(key), f"{where}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return first_difference(x, y, f"{where}[{k}]")
    return f"{where or '.'}: {a!r} != {b!r}"[:300]


def compare(before: Path, after: Path) -> tuple[int, list[str]]:
    """(files with equal figures, a line for each that differs or is missing after)."""
    files = sorted(p.relative_to(before) for p in before.rglob("*") if p.suffix in (".json", ".jsonl"))
    same, differ = 0, []
    for relative in files:
        if not (after / relative).is_file():
            differ.append(f"{relative}: missing")
            continue
        a, b = read(before / relative), read(after / relative)
        if a == b:
            same += 1
        else:
            differ.append(f"{relative}: {first_difference(a, b)}")
    return same, differ


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    same, differ = compare(Path(argv[0]), Path(argv[1]))
    print("\n".join(differ))
    print(f"{same} files with the same figures, {len(differ)} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
