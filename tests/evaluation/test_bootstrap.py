"""Paired bootstrap: its metrics equal scikit-learn's, identical models differ by exactly 0, and the unit
resampled is the query, not the pair."""

import numpy as np
import pytest
from sklearn.metrics import f1_score, roc_auc_score

from evaluation.bootstrap import bootstrap_differences, macro_f1, roc_auc_relevant


def random_set(n: int = 600, seed: int = 0):
    rng = np.random.default_rng(seed)
    grades = rng.integers(0, 4, n)
    probs = rng.dirichlet(np.ones(4), n)
    probs[:50] = 0.25  # ties, which the AUC must average
    return grades, probs


def paired_bootstrap(*, probs_a, probs_b, **options):
    """The interval of a - b alone: two models' bootstrap_differences."""
    return bootstrap_differences(probs={"a": probs_a, "b": probs_b}, **options)["a - b"]


def test_the_vectorised_metrics_equal_scikit_learns():
    grades, probs = random_set()
    everything = np.arange(len(grades))
    expected = f1_score(grades, probs.argmax(1), average="macro", labels=range(4), zero_division=0)
    assert macro_f1(grades, probs, everything) == pytest.approx(expected, abs=1e-12)
    assert roc_auc_relevant(grades, probs, everything) == pytest.approx(
        roc_auc_score(grades >= 2, probs[:, 2:].sum(1)), abs=1e-12
    )
    # a grade neither true nor predicted scores 0, as scikit-learn's zero_division=0
    only = np.flatnonzero(grades < 3)
    no_three = np.eye(4)[np.minimum(probs.argmax(1), 2)]
    assert macro_f1(grades, no_three, only) == pytest.approx(
        f1_score(grades[only], no_three[only].argmax(1), average="macro", labels=range(4), zero_division=0)
    )
    assert np.isnan(roc_auc_relevant(grades, probs, np.flatnonzero(grades >= 2)))  # one class: no AUC


def test_identical_models_differ_by_zero_and_a_better_one_clears_zero():
    grades, probs = random_set()
    groups = [f"q{i // 6}" for i in range(len(grades))]
    same = paired_bootstrap(y_true=grades, probs_a=probs, probs_b=probs, groups=groups, metric="macro_f1", samples=200)
    assert (same["difference"], same["low"], same["high"], same["samples_used"]) == (0.0, 0.0, 0.0, 200)
    oracle = np.eye(4)[grades] * 0.7 + 0.075
    better = paired_bootstrap(
        y_true=grades, probs_a=oracle, probs_b=probs, groups=groups, metric="roc_auc_relevant", samples=200
    )
    assert better["low"] > 0 and better["difference"] == pytest.approx(
        1 - roc_auc_score(grades >= 2, probs[:, 2:].sum(1))
    )


def test_the_query_is_the_unit_resampled():
    # each query's pairs copied 10 times: a query bootstrap draws the same queries, so every count scales by 10
    # and the interval is the one of the uncopied set; a pair bootstrap would shrink it by about sqrt(10)
    grades, probs = random_set(200, seed=1)
    other = random_set(200, seed=2)[1]
    groups = [f"q{i}" for i in range(200)]
    once = paired_bootstrap(y_true=grades, probs_a=probs, probs_b=other, groups=groups, metric="macro_f1", seed=3)
    tenfold = paired_bootstrap(
        y_true=np.repeat(grades, 10),
        probs_a=np.repeat(probs, 10, axis=0),
        probs_b=np.repeat(other, 10, axis=0),
        groups=np.repeat(groups, 10).tolist(),
        metric="macro_f1",
        seed=3,
    )
    assert (tenfold["low"], tenfold["high"]) == pytest.approx((once["low"], once["high"]), abs=1e-12)
    with pytest.raises(ValueError, match="metric must be one of"):
        paired_bootstrap(y_true=grades, probs_a=probs, probs_b=other, groups=groups, metric="accuracy")
    with pytest.raises(ValueError, match="need one gold grade, group and probability row per pair"):
        paired_bootstrap(y_true=grades[:5], probs_a=probs, probs_b=other, groups=groups, metric="macro_f1")


def one_pair_by_hand(grades, a, b, groups, samples, seed=0):
    """The paired bootstrap of roc_auc_relevant(a) - roc_auc_relevant(b) as its docstring states it, one pair alone."""
    queries = sorted(set(groups))
    members = [np.flatnonzero(np.asarray(groups) == q) for q in queries]
    rng = np.random.default_rng(seed)
    differences = []
    for _ in range(samples):
        index = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        differences.append(roc_auc_relevant(grades, a, index) - roc_auc_relevant(grades, b, index))
    kept = np.asarray([d for d in differences if not np.isnan(d)])
    return np.quantile(kept, [0.025, 0.975]).tolist(), kept.size


def test_every_pair_of_models_gets_the_interval_of_its_own_paired_bootstrap():
    # each model scored once per resample, the resamples shared: the same figures as one bootstrap per pair
    grades, probs = random_set(120, seed=4)
    models = {"student": probs, "gold_only": random_set(120, seed=5)[1], "lexical": random_set(120, seed=6)[1]}
    groups = [f"q{i // 4:02d}" for i in range(120)]
    together = bootstrap_differences(y_true=grades, probs=models, groups=groups, metric="roc_auc_relevant", samples=50)
    assert list(together) == ["student - gold_only", "student - lexical", "gold_only - lexical"]
    for pair, interval in together.items():
        a, b = pair.split(" - ")
        (low, high), used = one_pair_by_hand(grades, models[a], models[b], groups, samples=50)
        assert (interval["low"], interval["high"]) == pytest.approx((low, high), abs=1e-12)
        assert interval["samples_used"] == used
        everything = np.arange(120)
        point = roc_auc_relevant(grades, models[a], everything) - roc_auc_relevant(grades, models[b], everything)
        assert interval["difference"] == point
    with pytest.raises(ValueError, match="probabilities of one shape"):
        bootstrap_differences(y_true=grades, probs={"a": probs, "b": probs[:, :3]}, groups=groups, metric="macro_f1")
