"""Benchmark of the algorithm core: vectorised group advantages against a per-group Python loop (the
shape many home-made scripts take), and the policy loss forward + backward at a realistic batch shape.

Run: ``.venv/bin/python benchmarks/bench_algorithm_core.py`` (writes benchmarks/results/algorithm_core.json).
Figures are medians of repeated runs in this process; the ratio is loop time / registry time.
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial

import torch
from common import write_results

from agpo.advantages import compute_advantage
from agpo.losses import PolicyLossConfig, policy_loss


def median_seconds(fn, repeats: int = 7) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def loop_grpo(rewards: torch.Tensor, group_ids: list[int]) -> torch.Tensor:
    """The naive reference: one Python iteration per group (same maths as the ``grpo`` estimator)."""
    out = torch.empty_like(rewards)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        r = rewards[idx]
        if len(idx) == 1:
            out[idx] = r / (1 + 1e-6)
        else:
            out[idx] = (r - r.mean()) / (r.std() + 1e-6)
    return out


def main() -> dict[str, object]:
    torch.manual_seed(0)
    results: dict[str, object] = {}
    for groups, group_size in ((128, 8), (1024, 8), (512, 64)):
        rewards = torch.randint(0, 2, (groups * group_size,)).float()
        ids = [g for g in range(groups) for _ in range(group_size)]
        registry = median_seconds(partial(compute_advantage, "grpo", rewards, ids))
        agpo = median_seconds(partial(compute_advantage, "agpo", rewards, ids))
        loop = median_seconds(partial(loop_grpo, rewards, ids))
        assert torch.allclose(compute_advantage("grpo", rewards, ids), loop_grpo(rewards, ids), atol=1e-5)
        results[f"advantage_{groups}x{group_size}"] = {
            "grpo_registry_ms": round(registry * 1e3, 3),
            "agpo_registry_ms": round(agpo * 1e3, 3),
            "grpo_python_loop_ms": round(loop * 1e3, 3),
            "loop_over_registry": round(loop / registry, 1),
        }
    batch, length = 256, 512
    log_prob = torch.randn(batch, length, requires_grad=True)
    old = log_prob.detach() + 0.05 * torch.randn(batch, length)
    advantages = torch.randn(batch)
    mask = (torch.arange(length)[None, :] < torch.randint(16, length, (batch, 1))).float()

    def step() -> None:
        loss, _ = policy_loss(log_prob, old, advantages, mask, PolicyLossConfig())
        loss.backward()

    seconds = median_seconds(step)
    results[f"policy_loss_fwd_bwd_{batch}x{length}"] = {
        "ms": round(seconds * 1e3, 3),
        "tokens_per_s": round(float(mask.sum()) / seconds),
    }
    print(json.dumps(results, indent=2))
    write_results("algorithm_core", results)
    return results


if __name__ == "__main__":
    main()
