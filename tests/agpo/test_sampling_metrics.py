"""pass@k, maj@k, mean@n: hand values, brute force over subsets, and stability at n = 1024."""

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agpo.sampling_metrics import maj_at_k, majority, mean_at_n, pass_at_k, pass_at_k_curve, power_of_two_ks


def test_pass_at_k_hand_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k
    assert pass_at_k(5, 0, 5) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_equals_brute_force_over_subsets(nck):
    n, c, k = nck
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


@given(st.integers(1, 1024).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_is_monotone_in_k(nc):
    n, c = nc
    values = [pass_at_k(n, c, k) for k in power_of_two_ks(n)]
    assert all(a <= b + 1e-12 for a, b in itertools.pairwise(values))
    assert all(0.0 <= v <= 1.0 for v in values)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(1024, 1, 1), (1024, 1, 512), (1024, 3, 1000), (1024, 100, 256), (1000, 7, 64)]
)
def test_pass_at_k_is_exact_for_large_n(n, c, k):
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-10, abs=1e-15)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((4, 5, 1), "c .* must be <= n"),
        ((4, 1, 5), "k must be <= n"),
        ((0, 0, 1), "n must be an int >= 1"),
        ((4, -1, 1), "c must be an int >= 0"),
        ((4, 1, 0), "k must be an int >= 1"),
        ((4.0, 1, 1), "n must be an int"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(*args)


def test_power_of_two_ks():
    assert power_of_two_ks(1) == [1]
    assert power_of_two_ks(8) == [1, 2, 4, 8]
    assert power_of_two_ks(10) == [1, 2, 4, 8, 10]


def test_pass_at_k_curve():
    curve = pass_at_k_curve([[True, False, False, False], [False, False, False, False]])
    assert curve == pytest.approx({1: 0.125, 2: 0.25, 4: 0.5})
    assert pass_at_k_curve([[True, False], [True, True, False]], ks=[1]) == pytest.approx({1: (0.5 + 2 / 3) / 2})
    with pytest.raises(ValueError, match="at least one prompt"):
        pass_at_k_curve([])
    with pytest.raises(ValueError, match="at least one sample"):
        pass_at_k_curve([[True], []])


def test_majority_vote():
    answers = ["3", "2", "3", None, "2", "2"]
    assert majority(answers) == "2"
    assert majority(answers[:2]) == "3"  # a tie goes to the answer seen first
    assert majority([None, None]) is None
    assert maj_at_k(answers, "3", 3) == 1.0
    assert maj_at_k(answers, "2", 6) == 1.0
    assert maj_at_k(answers, "2", 3) == 0.0
    assert maj_at_k([None, None], "2", 2) == 0.0
    with pytest.raises(ValueError, match="k must be <= the number of answers"):
        maj_at_k(answers, "3", 7)
    with pytest.raises(ValueError, match="gold must be an answer"):
        maj_at_k([None], None, 1)


def test_a_majority_tie_goes_to_the_lowest_answer_when_asked():
    assert majority([3, 2, 2, 3], tie="lowest") == 2
    assert majority([3, None, 1], tie="lowest") == 1
    assert majority([3, 2, 2, 3]) == 3  # the first seen, by default
    assert maj_at_k([3, 2, 2, 3], 2, 4, tie="lowest") == 1.0
    with pytest.raises(ValueError, match="tie must be one of"):
        majority([1], tie="highest")


def test_mean_at_n():
    assert mean_at_n([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        mean_at_n([])
