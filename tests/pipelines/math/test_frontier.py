"""The equal-pass@1 frontier: first-crossing interpolation against hand values, reading training paths."""

import json

import pytest

from pipelines.math.frontier import frontier, frontier_table, pass_at_k_at, training_path

# (step, tokens, pass@1, pass@k): pass@1 rises to 0.5, then falls back to 0.45
PATH = [(0, 0.0, 0.1, 0.4), (10, 1000.0, 0.3, 0.6), (20, 2000.0, 0.5, 0.7), (30, 3000.0, 0.45, 0.72)]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0.1, 0.4),  # the start itself
        (0.2, 0.5),  # 0.4 + (0.6 - 0.4) * (0.2 - 0.1) / (0.3 - 0.1)
        (0.45, 0.675),  # first crossing, 0.6 + 0.1 * 0.15 / 0.2, not the later 0.72 at the same pass@1
        (0.5, 0.7),
        (0.6, None),  # never reached
    ],
)
def test_pass_at_k_at_matched_pass_at_1(target, expected):
    value = pass_at_k_at(PATH, target)
    assert value == (None if expected is None else pytest.approx(expected))


def test_frontier_mean_sd_over_the_seeds_that_reached_it():
    short = [(0, 0.0, 0.1, 0.2), (10, 1000.0, 0.3, 0.4)]  # never reaches 0.4
    rows = frontier({"grpo": [PATH, short]}, [0.2, 0.4, 0.9])
    by_target = {r["pass@1"]: r for r in rows}
    assert by_target[0.2]["pass@k"] == pytest.approx((0.5 + 0.3) / 2)
    assert by_target[0.2]["pass@k_sd"] == pytest.approx(0.1414214, abs=1e-6)  # sample sd of 0.5 and 0.3
    assert (by_target[0.4]["reached"], by_target[0.4]["pass@k"], by_target[0.4]["pass@k_sd"]) == (1, 0.65, None)
    assert by_target[0.9]["reached"] == 0 and by_target[0.9]["pass@k"] is None
    table = frontier_table(rows, 64)
    assert "| 0.20 | 0.400 ± 0.141 (2/2) |" in table and "not reached (0/2)" in table and "grpo: pass@64" in table


def test_training_path_reads_the_evaluations_in_order(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 0, "eval/heldout_pass@1": 0.1, "eval/heldout_pass@8": 0.4},
        {"step": 1, "generated_tokens": 500.0, "reward_mean": 0.2},
        {"step": 2, "generated_tokens": 1000.0, "eval/heldout_pass@1": 0.3, "eval/heldout_pass@8": 0.6},
    ]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert training_path(metrics, 8) == [(0, 0.0, 0.1, 0.4), (2, 1000.0, 0.3, 0.6)]
    with pytest.raises(ValueError, match="has no eval/heldout_pass@64: train with eval_samples = 64"):
        training_path(metrics, 64)
