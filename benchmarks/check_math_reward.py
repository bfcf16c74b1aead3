"""The math reward on real data: every gold solution of GSM8K test and MATH-500 should score 1.0, and the
same answer perturbed to be wrong 0.0. Prints and writes the counts and every exception with its reason.

Gold solution text per set: GSM8K's full worked answer (ending in ``#### n``); MATH-500's full solution
(with its ``\\boxed{}``); CMATH's golden answer wrapped as ``\\boxed{golden}``. A perturbed completion
is ``\\boxed{x}`` with x = the numeric gold + 1 (or the gold string with "+1" appended when it is not a number).
Run: ``.venv/bin/python benchmarks/check_math_reward.py`` (writes benchmarks/results/math_reward_check.json).
"""

from __future__ import annotations

import argparse
import json
import time
from fractions import Fraction
from pathlib import Path

from agpo.rewards.math import math_reward
from pipelines.math.math_data import load_math_set

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SETS = {
    "gsm8k": DATA / "gsm8k" / "test.jsonl",
    "math500": DATA / "math" / "math500_test.jsonl",
    "cmath": DATA / "cmath" / "cmath_dev.jsonl",
}
RESULTS = Path(__file__).resolve().parent / "results" / "math_reward_check.json"


def gold_completion(row: dict) -> str:
    return row["solution"] if row["solution"] else f"The answer is \\boxed{{{row['answer']}}}."


def wrong_completion(row: dict) -> str:
    try:
        wrong = str(Fraction(row["answer"].replace(",", "")) + 1)
    except (ValueError, ZeroDivisionError):
        wrong = f"{row['answer']}+1"
    return f"The answer is \\boxed{{{wrong}}}."


def check(name: str, path: Path, limit: int | None) -> dict:
    rows = load_math_set(name, path, limit)
    started = time.perf_counter()
    answers = [r["answer"] for r in rows]
    gold = math_reward([""] * len(rows), [gold_completion(r) for r in rows], answer=answers)
    wrong = math_reward([""] * len(rows), [wrong_completion(r) for r in rows], answer=answers)
    misses = [
        {"id": r["id"], "answer": r["answer"], "why": "gold solution not verified equal to the gold answer"}
        for r, g in zip(rows, gold, strict=True)
        if g != 1.0
    ]
    false_hits = [
        {"id": r["id"], "answer": r["answer"], "why": "perturbed answer still verified equal"}
        for r, w in zip(rows, wrong, strict=True)
        if w != 0.0
    ]
    return {
        "rows": len(rows),
        "gold_scored_1": sum(g == 1.0 for g in gold),
        "wrong_scored_0": sum(w == 0.0 for w in wrong),
        "seconds": round(time.perf_counter() - started, 1),
        "gold_exceptions": misses,
        "wrong_exceptions": false_hits,
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N rows per set")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    report = {name: check(name, path, args.limit) for name, path in SETS.items()}
    for name, r in report.items():
        print(
            f"{name:8s} {r['rows']:5d} rows: gold 1.0 on {r['gold_scored_1']}, wrong 0.0 on {r['wrong_scored_0']} "
            f"({len(r['gold_exceptions'])} + {len(r['wrong_exceptions'])} exceptions, {r['seconds']} s)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"-> {args.out}")
    return report


if __name__ == "__main__":
    main()
