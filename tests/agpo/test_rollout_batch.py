"""The rollout batch: scores decide correct vs wrong, shaped rewards are only the value (docs/algorithms.md sec. 4)."""

import pytest

from agpo.rollout_batch import batch_statistics, drop_uniform_groups
from agpo.step_interfaces import RolloutBatch


def scored_batch():
    """Three groups of four under an overlong penalty: all wrong with different lengths (so different shaped
    rewards), mixed, and all correct with two long answers."""
    scores = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    rewards = [0.0, -0.25, -0.5, 0.0, 1.0, 0.0, -0.5, 0.75, 1.0, 0.5, 1.0, 0.25]
    lengths = [2, 3, 4, 2, 2, 2, 4, 3, 2, 4, 2, 3]
    return RolloutBatch(
        prompt_ids=[[1]] * 12,
        response_ids=[[2] * n for n in lengths],
        rewards=rewards,
        scores=scores,
        group_ids=[i // 4 for i in range(12)],
        temperatures=[1.0] * 12,
        finish_reasons=["stop"] * 12,
        answers=["a"] * 12,
        rollout_logprobs=[[0.0] * n for n in lengths],
    )


def test_dynamic_sampling_drops_groups_whose_scores_are_equal_whatever_their_lengths():
    kept = drop_uniform_groups(scored_batch())
    assert kept.group_ids == [1, 1, 1, 1]  # the all-wrong group differing only in length is dropped too
    assert kept.scores == [1.0, 0.0, 0.0, 1.0] and kept.rewards == [1.0, 0.0, -0.5, 0.75]


def test_accuracy_counts_correct_long_answers_correct():
    stats = batch_statistics(scored_batch(), 1.0, local_tokens=30, all_reduce_sum=lambda values: values)
    assert stats["accuracy"] == 0.5  # 6 of 12 by score; the shaped rewards reach 1.0 only 3 times
    assert stats["all_correct_frac"] == pytest.approx(1 / 3) and stats["all_wrong_frac"] == pytest.approx(1 / 3)
    assert stats["reward_mean"] == pytest.approx(3.25 / 12)  # the shaped rewards
    assert stats["tokens"] == 30


def test_without_scores_the_rewards_are_the_scores():
    batch = scored_batch()
    plain = RolloutBatch(**{name: getattr(batch, name) for name in RolloutBatch.PER_ROW if name != "scores"})
    assert plain.scores == plain.rewards and plain.scores is not plain.rewards
