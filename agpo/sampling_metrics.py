"""Sampling-based evaluation: pass@k, majority vote and maj@k, mean@n, pass@k curves (docs/algorithms.md section 6).

pass@k is the unbiased estimator of Chen et al. (2021): with n samples of which c are correct,
    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i),   1 when n - c < k.
The product form never builds a binomial coefficient, so it stays exact in float64 for n in the thousands.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

from agpo.checks import require_choice, require_int


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    require_int("n", n, 1)
    require_int("c", c, 0)
    require_int("k", k, 1)
    if c > n:
        raise ValueError(f"c (correct samples) must be <= n, got c={c}, n={n}")
    if k > n:
        raise ValueError(f"k must be <= n (samples drawn), got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.exp(sum(math.log1p(-k / i) for i in range(n - c + 1, n + 1)))


def power_of_two_ks(n: int) -> list[int]:
    """k = 1, 2, 4, ... up to n, with n itself appended when it is not a power of two."""
    require_int("n", n, 1)
    ks = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return ks if ks[-1] == n else [*ks, n]


def pass_at_k_curve(correct: Sequence[Sequence[bool]], ks: Sequence[int] | None = None) -> dict[int, float]:
    """Mean pass@k over prompts from per-prompt sample correctness ``correct[prompt][sample]``.

    ``ks`` defaults to 1, 2, 4, ..., n with n the smallest number of samples any prompt has.
    """
    if not correct:
        raise ValueError("correct must hold at least one prompt's samples")
    counts = [(len(samples), sum(bool(s) for s in samples)) for samples in correct]
    n_min = min(n for n, _ in counts)
    if n_min == 0:
        raise ValueError("every prompt needs at least one sample")
    ks = power_of_two_ks(n_min) if ks is None else list(ks)
    return {k: sum(pass_at_k(n, c, k) for n, c in counts) / len(counts) for k in ks}


TIES = ("first", "lowest")


def majority(answers: Sequence[Hashable | None], *, tie: str = "first") -> Hashable | None:
    """The most frequent non-None answer; None when nothing parsed (every answer is None).

    A tie goes to the tied answer seen first (``tie="first"``: free-form answers such as math results) or
    to the smallest tied answer (``tie="lowest"``: ordered answers such as relevance grades, where
    over-stating relevance costs more than under-stating it; the teacher's maj@n and annotation's label
    both use it).
    """
    require_choice("tie", tie, TIES)
    votes = Counter(a for a in answers if a is not None)  # a Counter keeps first-seen order
    if not votes:
        return None
    best = max(votes.values())
    tied = [answer for answer, count in votes.items() if count == best]
    return tied[0] if tie == "first" else min(tied)


def maj_at_k(answers: Sequence[Hashable | None], gold: Hashable, k: int, *, tie: str = "first") -> float:
    """1.0 when the majority vote (``majority``) over the first k extracted answers equals ``gold``, else 0.0."""
    require_int("k", k, 1)
    if gold is None:
        raise ValueError("gold must be an answer, got None")
    if k > len(answers):
        raise ValueError(f"k must be <= the number of answers ({len(answers)}), got {k}")
    return float(majority(answers[:k], tie=tie) == gold)


def mean_at_n(correct: Sequence[bool]) -> float:
    """Share of correct samples (mean@n)."""
    if not correct:
        raise ValueError("mean@n needs at least one sample")
    return sum(bool(c) for c in correct) / len(correct)
