"""Advantage estimators against the check values of docs/algorithms.md and hand-computed cases."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from agpo.advantages import available_estimators, compute_advantage, estimator_params, register_advantage

TOL = 1e-5


def adv(name, rewards, groups=None, **params):
    groups = [0] * len(rewards) if groups is None else groups
    return compute_advantage(name, torch.tensor(rewards, dtype=torch.float32), groups, **params).tolist()


def test_registry_lists_every_estimator():
    assert available_estimators() == ["agpo", "dr_grpo", "grpo", "rloo", "w_reinforce"]


def test_grpo_check_values():
    assert adv("grpo", [1, 0, 0, 1]) == pytest.approx([0.866024, -0.866024, -0.866024, 0.866024], abs=TOL)
    one_right = adv("grpo", [1, 0, 0, 0, 0, 0, 0, 0])
    assert one_right[0] == pytest.approx(2.474867, abs=TOL)
    assert one_right[1:] == pytest.approx([-0.353552] * 7, abs=TOL)


def test_grpo_without_std_is_centered_reward():
    assert adv("grpo", [1, 0, 0, 1], norm_by_std=False) == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_grpo_max_mode_divides_by_floored_std():
    # adaptive AGPO's form: std [1,0] unbiased = 0.7071068, so 0.5 / 0.7071068 exactly (no +eps)
    assert adv("grpo", [1, 0], eps=1e-8, eps_mode="max") == pytest.approx([0.7071068, -0.7071068], abs=1e-7)
    assert adv("grpo", [1, 1], eps=1e-8, eps_mode="max") == [0.0, 0.0]


def test_agpo_check_values():
    one_right = adv("agpo", [1, 0, 0, 0, 0, 0, 0, 0])
    assert one_right[0] == pytest.approx(2.645743, abs=TOL)
    assert one_right[0] == pytest.approx(0.875 / (0.330719 + 1e-6), abs=TOL)
    assert one_right[1:] == [-0.5] * 7
    assert adv("agpo", [1, 1, 1, 1]) == [0.0] * 4
    assert adv("agpo", [0, 0, 0, 0]) == [-0.5] * 4
    assert adv("agpo", [1, 1, 0, 0]) == pytest.approx([0.999998, 0.999998, -0.5, -0.5], abs=TOL)


def test_agpo_options():
    assert adv("agpo", [0, 0, 0, 0], neg_gate="mixed_only") == [0.0] * 4
    assert adv("agpo", [1, 0, 0, 0], neg_gate="mixed_only") == pytest.approx([1.732049, -0.5, -0.5, -0.5], abs=TOL)
    # pos_scale none: lambda_pos * (1 - 0.25)
    assert adv("agpo", [1, 0, 0, 0], pos_scale="none") == pytest.approx([0.75, -0.5, -0.5, -0.5])
    assert adv("agpo", [1, 0, 0, 0, 0, 0, 0, 0], adv_cap=2.0)[0] == 2.0
    assert adv("agpo", [1, 0, 0, 0], lambda_neg=1.0, lambda_pos=0.5) == pytest.approx(
        [0.5 * math.sqrt(3), -1, -1, -1], abs=TOL
    )


def test_agpo_graded_rewards():
    # mu = 0.625, population std = sqrt(0.171875); the wrong answers are scaled by 1 - r
    result = adv("agpo", [1.0, 0.5, 0.0, 1.0])
    positive = 0.375 / (math.sqrt(0.171875) + 1e-6)
    assert result == pytest.approx([positive, -0.25, -0.5, positive], abs=TOL)
    # a lower correctness threshold makes 0.5 correct; its positive term is then negative (below mean)
    relaxed = adv("agpo", [1.0, 0.5, 0.0, 1.0], correct_threshold=0.5)
    assert relaxed[1] == pytest.approx(-0.125 / (math.sqrt(0.171875) + 1e-6), abs=TOL)


def test_a_correct_long_answer_keeps_the_correct_answer_advantage():
    """Overlong penalty 0.5 on the second, correct answer: the score says correct, the shaped reward 0.5 is the
    value. rewards [1, 0.5, 0, 0]: mu = 0.375, population std = sqrt(0.171875) = 0.414578."""
    rewards, scores, shaped = [1.0, 0.5, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], (-1.0, 1.0)
    sigma = math.sqrt(0.171875) + 1e-6
    result = adv("agpo", rewards, scores=scores, reward_range=shaped)
    assert result == pytest.approx([0.625 / sigma, 0.125 / sigma, -0.5, -0.5], abs=TOL)
    assert result[:2] == pytest.approx([1.507553, 0.301511], abs=TOL)
    assert adv("w_reinforce", rewards, scores=scores, reward_range=shaped) == pytest.approx([0.1, 0.1, -1.0, -1.0])
    # every answer correct, one long: still an all-correct group, no update
    assert adv("agpo", [1.0, 0.5], scores=[1.0, 1.0], reward_range=shaped) == [0.0, 0.0]
    # a wrong long answer: -lambda_neg * (1 - r) with the shaped r = -0.5
    assert adv("agpo", [1.0, 0.0, -0.5], scores=[1.0, 0.0, 0.0], reward_range=shaped)[1:] == [-0.5, -0.75]
    # estimators that do not split on correctness ignore the scores
    assert adv("grpo", rewards, scores=scores, reward_range=shaped) == adv("grpo", rewards, reward_range=shaped)


def test_other_estimators_hand_values():
    assert adv("dr_grpo", [1, 0, 0, 0]) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert adv("rloo", [1, 0, 0, 0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert adv("w_reinforce", [1, 0, 1]) == pytest.approx([0.1, -1.0, 0.1])
    assert adv("w_reinforce", [1, 0], lambda_psr=0.5) == [0.5, -1.0]


def test_groups_of_one_use_zero_mean_unit_std():
    assert adv("grpo", [1.0]) == pytest.approx([1 / (1 + 1e-6)])
    assert adv("dr_grpo", [1.0]) == [1.0]
    assert adv("rloo", [1.0]) == [1.0]
    assert adv("agpo", [1.0]) == pytest.approx([1 / (1 + 1e-6)])
    assert adv("agpo", [0.0]) == [-0.5]


def test_hashable_group_ids_in_any_order():
    result = adv("grpo", [1, 0, 0, 0], groups=["q1", "q2", "q1", "q2"])
    assert result == pytest.approx([0.707106, 0.0, -0.707106, 0.0], abs=TOL)
    as_tensor = adv("grpo", [1, 0, 0, 0], groups=torch.tensor([7, 3, 7, 3]))
    assert as_tensor == pytest.approx(result)


def test_output_keeps_float_dtype():
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    assert compute_advantage("agpo", rewards, [0, 0]).dtype == torch.float64
    assert compute_advantage("agpo", torch.tensor([1, 0]), [0, 0]).dtype == torch.float32


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: adv("ppo", [1.0]), "unknown advantage estimator 'ppo'; known estimators: agpo, dr_grpo, grpo"),
        (lambda: adv("grpo", [1.0, float("nan")]), r"rewards\[1\] = nan"),
        (lambda: adv("grpo", [1.5, 0.0]), r"\[0.0, 1.0\], got rewards\[0\] = 1.5"),
        (lambda: adv("grpo", [-0.1, 0.0]), r"rewards\[0\] = -0.1"),
        (lambda: adv("grpo", [1.0, 0.0], groups=[0]), "same length, got 2 rewards and 1 group ids"),
        (lambda: adv("agpo", [1.0], lambda_nag=1.0), r"unknown parameter\(s\) \['lambda_nag'\]"),
        (lambda: adv("agpo", [1.0], lambda_neg=-1.0), "lambda_neg must be a finite number >= 0"),
        (lambda: adv("agpo", [1.0], neg_gate="never"), "neg_gate must be one of"),
        (lambda: adv("grpo", [1.0], eps_mode="mul"), "eps_mode must be one of"),
        (lambda: compute_advantage("grpo", torch.ones(2, 2), [0, 0]), "1-D tensor"),
        (lambda: compute_advantage("grpo", ["a"], [0]), "rewards must be numbers"),
        (lambda: compute_advantage("grpo", [1.0], torch.tensor([0.5])), "integer dtype"),
        (lambda: compute_advantage("grpo", [1.0], [[0]]), "hashable"),
        (lambda: adv("agpo", [1.0, 0.0], scores=[1.0]), "scores and rewards must have the same length, got 1 and 2"),
        (lambda: adv("agpo", [0.5], scores=[1.5]), r"scores\[0\] = 1.5; scores are the verifiable values"),
    ],
)
def test_bad_input_gets_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_shaped_rewards_need_a_wider_range():
    shaped = compute_advantage("dr_grpo", [1.0, -0.5], [0, 0], reward_range=(-1.0, 1.0))
    assert shaped.tolist() == pytest.approx([0.75, -0.75])


def test_register_rejects_duplicates_and_exposes_params():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage("grpo")(lambda rewards, groups: rewards)
    assert estimator_params("w_reinforce") == {"lambda_psr": 0.1, "correct_threshold": 1.0}


# --- properties ---------------------------------------------------------------------------------------

binary_groups = st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16), min_size=1, max_size=8)
graded_groups = st.lists(
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=16), min_size=1, max_size=8
)


def flatten(groups):
    rewards = [r for g in groups for r in g]
    ids = [i for i, g in enumerate(groups) for _ in g]
    return torch.tensor(rewards, dtype=torch.float64), ids


@given(graded_groups)
def test_grpo_rloo_drgrpo_sum_to_zero_per_group(groups):
    rewards, ids = flatten(groups)
    for name in ("grpo", "rloo", "dr_grpo"):
        advantages = compute_advantage(name, rewards, ids)
        for g in range(len(groups)):
            members = [i for i, gid in enumerate(ids) if gid == g]
            assert abs(float(advantages[members].sum())) < 1e-6


@given(binary_groups, st.floats(0.0, 4.0), st.floats(0.0, 4.0))
def test_agpo_binary_structure(groups, lambda_neg, lambda_pos):
    rewards, ids = flatten(groups)
    advantages = compute_advantage("agpo", rewards, ids, lambda_neg=lambda_neg, lambda_pos=lambda_pos)
    for g, members in enumerate(groups):
        idx = [i for i, gid in enumerate(ids) if gid == g]
        p = sum(members) / len(members)
        for i in idx:
            if rewards[i] == 0:
                assert advantages[i] == pytest.approx(-lambda_neg)  # negatives fire in every group
            elif p == 1:
                assert advantages[i] == 0  # trivial groups give no update
            else:
                expected = lambda_pos * math.sqrt((1 - p) / p)
                assert advantages[i] == pytest.approx(expected, rel=1e-4, abs=1e-6)


@given(binary_groups)
def test_agpo_positive_update_is_larger_for_rarer_successes(groups):
    rewards, ids = flatten(groups)
    advantages = compute_advantage("agpo", rewards, ids)
    rates = {g: sum(m) / len(m) for g, m in enumerate(groups)}
    positives = [(rates[gid], float(advantages[i])) for i, gid in enumerate(ids) if rewards[i] == 1 and rates[gid] < 1]
    for p1, a1 in positives:
        for p2, a2 in positives:
            if p1 < p2:
                assert a1 > a2


@given(graded_groups, st.randoms(use_true_random=False))
def test_estimators_are_permutation_equivariant(groups, rnd):
    rewards, ids = flatten(groups)
    order = list(range(len(ids)))
    rnd.shuffle(order)
    for name in available_estimators():
        base = compute_advantage(name, rewards, ids)
        shuffled = compute_advantage(name, rewards[order], [ids[i] for i in order])
        assert torch.allclose(shuffled, base[order], atol=1e-9)


@given(graded_groups)
def test_w_reinforce_takes_two_values(groups):
    rewards, ids = flatten(groups)
    values = set(compute_advantage("w_reinforce", rewards, ids, lambda_psr=0.25).tolist())
    assert values <= {0.25, -1.0}
