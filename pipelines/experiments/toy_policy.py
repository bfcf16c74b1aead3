"""A controlled toy for comparing advantage estimators in seconds: a linear softmax policy over candidate
answers with parameters shared across problems (docs/algorithms.md, "Why these defaults").

Each problem i has K candidate answers with features X_i [K, d] and fixed base logits b_i [K] (the "base
model"); exactly one candidate c_i is correct. The policy is pi_i = softmax((b_i + X_i @ theta) / tau) with
theta in R^d shared by all problems and initialised at 0, so the untrained policy is the base model. The
correct candidate's features lean along a hidden direction u by a problem-specific strength s_i that is
negative for some problems: pushing theta along u helps most problems and hurts a few, which is how RL
can raise pass@1 while narrowing the set of problems the model can solve at all (pass@k at large k).

One training step samples ``problems_per_step`` problems, G answers each (a one-token "response"),
scores them, computes advantages with the chosen estimator from :mod:`agpo.advantages`, and takes
``ppo_epochs`` Adam steps on :func:`agpo.losses.policy_loss`. ``adaptive_agpo`` adds the probe group and
the temperature / clip controllers of :mod:`agpo.adaptive`. Every algorithm stops at the same
generated-token budget (probe answers count), as section 5 of the spec asks. pass@k is computed exactly:
1 - (1 - p_i)^k averaged over problems, p_i the policy's probability of the correct answer at tau = 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from agpo.adaptive import (
    ADAPTIVE_AGPO,
    AdaptiveController,
    advantage_rule,
    clip_bounds,
    group_probe_statistics,
    group_token_means,
    mean_over_groups,
)
from agpo.advantages import GroupIndex, compute_advantage
from agpo.losses import entropy_from_logits, policy_loss
from agpo.sampling_metrics import power_of_two_ks
from pipelines.experiments.toy_policy_config import ToyConfig


@dataclass
class ToyProblems:
    """Features [N, K, d], base logits [N, K] and the correct candidate of each problem [N]."""

    features: torch.Tensor
    base_logits: torch.Tensor
    correct: torch.Tensor

    @classmethod
    def generate(cls, config: ToyConfig) -> ToyProblems:
        g = torch.Generator().manual_seed(config.env_seed)
        n, k, d = config.num_problems, config.num_candidates, config.feature_dim
        features = torch.randn(n, k, d, generator=g) / math.sqrt(d)
        base_logits = torch.randn(n, k, generator=g)
        correct = torch.randint(0, k, (n,), generator=g)
        direction = torch.randn(d, generator=g)
        direction = direction / direction.norm()
        strength = config.signal_mean + config.signal_std * torch.randn(n, generator=g)
        offset = (torch.rand(n, generator=g) * 1.5 - 1.0) * config.difficulty_range
        rows = torch.arange(n)
        features[rows, correct] += strength[:, None] * direction
        base_logits[rows, correct] += offset
        return cls(features=features, base_logits=base_logits, correct=correct)

    def logits(self, theta: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        if index is None:
            return self.base_logits + self.features @ theta
        return self.base_logits[index] + self.features[index] @ theta

    def pass_at_k(self, theta: torch.Tensor, ks: list[int]) -> dict[int, float]:
        """Exact pass@k at temperature 1: mean over problems of 1 - (1 - p_correct)^k."""
        with torch.no_grad():
            probs = torch.softmax(self.logits(theta).double(), dim=-1)
            p = probs[torch.arange(len(self.correct)), self.correct]
            return {k: float((1 - (1 - p) ** k).mean()) for k in ks}

    def base_pass_at_k(self, ks: list[int]) -> dict[int, float]:
        """pass@k of the untrained (base) policy, theta = 0."""
        return self.pass_at_k(torch.zeros(self.features.shape[-1]), ks)


@dataclass
class ToyRun:
    """Outcome of one algorithm at one seed."""

    algorithm: str
    seed: int
    steps: int
    generated: int
    pass_at_k: dict[int, float]
    curve: list[dict[str, float]]
    metrics: dict[str, float]


def train_toy(
    config: ToyConfig,
    problems: ToyProblems,
    algorithm: str,
    seed: int,
    on_step: Callable[[int], None] | None = None,
) -> ToyRun:
    """Train theta from 0 with ``algorithm`` until the generated-token budget is spent."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.zeros(config.feature_dim, requires_grad=True)
    optimizer = torch.optim.Adam([theta], lr=config.learning_rate)
    controller = AdaptiveController(config.adaptive) if algorithm == ADAPTIVE_AGPO else None
    ks = power_of_two_ks(config.max_k)
    per_step = config.samples_per_step(algorithm)
    steps = config.token_budget // per_step
    curve: list[dict[str, float]] = []
    last: dict[str, float] = {}
    for step in range(steps):
        if step % config.eval_every == 0:
            curve.append({"step": step, "generated": step * per_step, "pass@1": problems.pass_at_k(theta, [1])[1]})
        last = _toy_step(config, problems, algorithm, theta, optimizer, controller, g)
        if on_step is not None:
            on_step(step)
    curve.append({"step": steps, "generated": steps * per_step, "pass@1": problems.pass_at_k(theta, [1])[1]})
    return ToyRun(
        algorithm=algorithm,
        seed=seed,
        steps=steps,
        generated=steps * per_step,
        pass_at_k=problems.pass_at_k(theta, ks),
        curve=curve,
        metrics=last,
    )


def _sample(logits: torch.Tensor, temperature: torch.Tensor, group_size: int, g: torch.Generator) -> torch.Tensor:
    """``group_size`` answers per row of ``logits`` [P, K] at per-row temperature [P] -> [P, G]."""
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    return torch.multinomial(probs, group_size, replacement=True, generator=g)


def _toy_step(
    config: ToyConfig,
    problems: ToyProblems,
    algorithm: str,
    theta: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    controller: AdaptiveController | None,
    g: torch.Generator,
) -> dict[str, float]:
    p, gs = config.problems_per_step, config.group_size
    index = torch.randint(0, config.num_problems, (p,), generator=g)
    with torch.no_grad():
        logits = problems.logits(theta, index)
    temperature, stats = _temperatures(config, problems, index, logits, controller, g)
    answers = _sample(logits, temperature, gs, g)
    rewards = (answers == problems.correct[index, None]).float().flatten()
    group_ids = torch.arange(p).repeat_interleave(gs)
    name, params = advantage_rule(algorithm, config.advantage_params.get(algorithm, {}))
    advantages = compute_advantage(name, rewards, group_ids, **params)

    def answer_log_probs() -> tuple[torch.Tensor, torch.Tensor]:
        scaled = problems.logits(theta, index) / temperature[:, None]
        log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, answers)
        entropy = entropy_from_logits(scaled)[:, None].expand(p, gs)
        return log_probs.reshape(-1, 1), entropy.reshape(-1, 1)

    mask = torch.ones(p * gs, 1)
    with torch.no_grad():
        old_log_prob, entropy = answer_log_probs()
    groups = GroupIndex.from_ids(group_ids)
    eps_low = eps_high = None
    if controller is not None:
        eps_low, eps_high = _clip_ranges(config, controller, stats, entropy, mask, groups)
    metrics: dict[str, float] = {}
    for _ in range(config.ppo_epochs):
        log_prob, entropy = answer_log_probs()
        loss, metrics = policy_loss(
            log_prob, old_log_prob, advantages, mask, config.loss, entropy=entropy, eps_low=eps_low, eps_high=eps_high
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if controller is not None:
        with torch.no_grad():
            new_log_prob, _ = answer_log_probs()
        log_ratios, tokens = group_token_means([old_log_prob - new_log_prob], [mask], groups)
        metrics["step_kl"] = mean_over_groups(log_ratios.clamp(min=0), tokens)
        controller.observe_step_kl(metrics["step_kl"])
        metrics["temperature_mean"] = float(temperature.mean())
        metrics["clip_eps_mean"] = float(eps_low.mean())
    metrics["reward_mean"] = float(rewards.mean())
    return metrics


def _temperatures(
    config: ToyConfig,
    problems: ToyProblems,
    index: torch.Tensor,
    logits: torch.Tensor,
    controller: AdaptiveController | None,
    g: torch.Generator,
) -> tuple[torch.Tensor, list]:
    """Each problem's sampling temperature and probe statistics: 1 and none, or adaptive AGPO's from a probe
    group sampled at tau_base."""
    temperature = torch.ones(len(index))
    if controller is None:
        return temperature, []
    probe = _sample(logits, temperature * config.adaptive.tau_base, config.group_size, g)
    probe_rewards = (probe == problems.correct[index, None]).float()
    stats = group_probe_statistics(
        probe_rewards.flatten().tolist(), probe.flatten().tolist(), config.group_size, config.adaptive.dispersion
    )
    return torch.tensor(controller.temperatures(stats)), stats


def _clip_ranges(
    config: ToyConfig, controller: AdaptiveController, stats: list, entropy: torch.Tensor, mask, groups: GroupIndex
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive AGPO's (eps_low, eps_high) per answer, from each group's entropy and probe statistics."""
    entropies, tokens = group_token_means([entropy], [mask], groups)
    eps = controller.clip_eps(stats, entropies.tolist(), mean_over_groups(entropies, tokens))
    eps_low, eps_high = (e[groups.index] for e in clip_bounds(eps, config.loss.eps_low, config.loss.eps_high))
    return eps_low, eps_high
