"""Group-relative advantage estimators: one registry, one signature.

Every estimator maps a batch of sequence-level rewards and the prompt group each response belongs to onto
sequence-level advantages (the trainer broadcasts them over the response tokens):

    estimator(rewards: Tensor[B] float, groups: GroupIndex, **params) -> Tensor[B]

An estimator that splits responses into correct and wrong (``agpo``, ``w_reinforce``) also takes the
verifiable ``scores[B]`` as a third positional argument: the score decides correct (score >=
``correct_threshold``; the trainer passes its own, the one its accuracy metrics use) vs wrong, the reward
(which reward shaping such as the DAPO overlong penalty may have lowered) is the value that enters the
advantage (docs/algorithms.md section 4). Without shaping the scores are the rewards.

The formulas are the project's spec in docs/algorithms.md, section 1. Per group of G responses:
mu = mean(r), sigma = std(r); a group of one response uses mu = 0, sigma = 1 (as verl does).

- ``grpo``: (r - mu) / (sigma_unbiased + eps)        (verl ``compute_grpo_outcome_advantage``)
- ``dr_grpo``: r - mu
- ``rloo``: r_i - mean of the other rewards in the group
- ``w_reinforce``: +lambda_psr for a correct response, -1 for a wrong one (Zhu et al. 2025)
- ``agpo``: asymmetric AGPO: wrong -> -lambda_neg * (1 - r) in every group; correct ->
  +lambda_pos * (r - mu) / (sigma_population + eps), 0 in an all-correct group (correct and wrong by
  score, r the reward).

Call :func:`compute_advantage`. A new estimator is declared with its parameters in agpo.estimator_params and
its function registered here with :func:`register_advantage`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from agpo.checks import require_choice, require_non_negative
from agpo.estimator_params import ESTIMATOR_PARAMS, available_estimators, estimator_params, validate_estimator_params

AdvantageFn = Callable[..., torch.Tensor]

_REGISTRY: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering ``fn(rewards, groups, **params)`` (or ``fn(rewards, groups, scores, **params)``
    for an estimator that splits on correctness) under ``name``. ``name`` and its keyword parameters with their
    defaults are declared in agpo.estimator_params (``ESTIMATOR_PARAMS``); ``fn`` takes exactly those
    parameters, keyword-only and without defaults (:func:`compute_advantage` passes the defaults)."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in _REGISTRY:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        if name not in ESTIMATOR_PARAMS:
            raise ValueError(f"declare advantage estimator {name!r} in agpo.estimator_params.ESTIMATOR_PARAMS first")
        parameters = inspect.signature(fn).parameters.values()
        keywords = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
        if sorted(keywords) != sorted(ESTIMATOR_PARAMS[name]):
            raise ValueError(
                f"advantage estimator {name!r} takes keyword parameters {sorted(keywords)}, but "
                f"agpo.estimator_params declares {sorted(ESTIMATOR_PARAMS[name])}"
            )
        _REGISTRY[name] = fn
        return fn

    return decorator


def get_estimator(name: str) -> AdvantageFn:
    """The estimator registered as ``name``; ``ValueError`` listing the known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known estimators: {', '.join(available_estimators())}"
        ) from None


def reads_scores(name: str) -> bool:
    """Whether estimator ``name`` splits responses on their verifiable scores (a positional ``scores``)."""
    parameter = inspect.signature(get_estimator(name)).parameters.get("scores")
    return parameter is not None and parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD


@dataclass(frozen=True)
class GroupIndex:
    """Dense group membership: ``index[b]`` in ``0..num_groups-1`` is the group of response ``b``."""

    index: torch.Tensor
    num_groups: int

    @property
    def sizes(self) -> torch.Tensor:
        return torch.bincount(self.index, minlength=self.num_groups)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Per-group sums of ``values[B]`` -> ``Tensor[num_groups]``."""
        return torch.zeros(self.num_groups, dtype=values.dtype).index_add_(0, self.index, values)

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        return self.sum(values) / self.sizes.to(values.dtype)

    def all(self, flags: torch.Tensor) -> torch.Tensor:
        """Per-group logical AND of boolean ``flags[B]``."""
        return self.sum((~flags).to(torch.float64)) == 0

    @classmethod
    def from_ids(cls, group_ids: torch.Tensor | Sequence[Hashable]) -> GroupIndex:
        """Map arbitrary group ids (an int tensor or any hashables) onto dense indices, keeping order."""
        if isinstance(group_ids, torch.Tensor):
            if group_ids.dim() != 1:
                raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")
            if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex:
                raise ValueError(f"group_ids tensor must have an integer dtype, got {group_ids.dtype}")
            _, index = torch.unique(group_ids, return_inverse=True)
            return cls(index=index.to(torch.long), num_groups=int(index.max()) + 1 if len(index) else 0)
        dense: dict[Hashable, int] = {}
        try:
            index_list = [dense.setdefault(g, len(dense)) for g in group_ids]
        except TypeError as err:
            raise ValueError(f"group_ids must be hashable values: {err}") from None
        return cls(index=torch.tensor(index_list, dtype=torch.long), num_groups=len(dense))


def compute_advantage(
    name: str,
    rewards: torch.Tensor | Sequence[float],
    group_ids: torch.Tensor | Sequence[Hashable],
    *,
    scores: torch.Tensor | Sequence[float] | None = None,
    reward_range: tuple[float, float] = (0.0, 1.0),
    **params: object,
) -> torch.Tensor:
    """Sequence-level advantages of ``rewards[B]`` grouped by ``group_ids[B]`` with estimator ``name``.

    Rewards must be finite and inside ``reward_range`` (default [0, 1]; reward shaping such as the DAPO
    overlong penalty widens it). ``scores[B]``, the verifiable scores in [0, 1] (default: the rewards),
    decide correct vs wrong for the estimators that split on it (:func:`reads_scores`). Returns a float
    tensor of shape [B] in the rewards' float dtype (float32 when the rewards are not a float tensor).
    """
    fn = get_estimator(name)
    validate_estimator_params(name, params)
    rewards_t = _validated("rewards", rewards, reward_range, _SHAPED_HINT)
    scores_t = rewards_t if scores is None else _validated("scores", scores, (0.0, 1.0), _SCORES_HINT)
    groups = GroupIndex.from_ids(group_ids)
    if groups.index.numel() != rewards_t.numel():
        raise ValueError(
            f"rewards and group_ids must have the same length, got {rewards_t.numel()} rewards "
            f"and {groups.index.numel()} group ids"
        )
    if scores_t.numel() != rewards_t.numel():
        raise ValueError(
            f"scores and rewards must have the same length, got {scores_t.numel()} and {rewards_t.numel()}"
        )
    # Group statistics in float64 so that check values hold to 1e-6 whatever the input dtype.
    scored = (scores_t.to(torch.float64),) if reads_scores(name) else ()
    advantages = fn(rewards_t.to(torch.float64), groups, *scored, **{**estimator_params(name), **params})
    return advantages.to(rewards_t.dtype)


_SHAPED_HINT = "pass reward_range=(low, high) when the rewards are shaped on purpose"
_SCORES_HINT = "scores are the verifiable values, before any reward shaping"


def _validated(
    what: str, values: torch.Tensor | Sequence[float], value_range: tuple[float, float], hint: str
) -> torch.Tensor:
    """``values`` as a 1-D float tensor, every one finite and inside ``value_range`` (else ``hint``)."""
    if not isinstance(values, torch.Tensor):
        try:
            values = torch.tensor(list(values), dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(f"{what} must be numbers, got {values!r}: {err}") from None
    if values.dim() != 1:
        raise ValueError(f"{what} must be a 1-D tensor, got shape {tuple(values.shape)}")
    if not values.dtype.is_floating_point:
        values = values.to(torch.float32)
    bad = ~torch.isfinite(values)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"{what} must be finite, got {what}[{i}] = {values[i].item()}")
    low, high = value_range
    outside = (values < low) | (values > high)
    if outside.any():
        i = int(outside.nonzero()[0])
        raise ValueError(f"{what} must lie in [{low}, {high}], got {what}[{i}] = {values[i].item()}; {hint}")
    return values


def _group_mean_std(rewards: torch.Tensor, groups: GroupIndex, *, unbiased: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-response group mean and std, with mu = 0, sigma = 1 for groups of one response."""
    sizes = groups.sizes.to(rewards.dtype)
    mean = groups.mean(rewards)
    squared = groups.sum((rewards - mean[groups.index]) ** 2)
    dof = sizes - 1 if unbiased else sizes
    std = torch.sqrt(squared / dof.clamp(min=1))
    single = sizes == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[groups.index], std[groups.index]


@register_advantage("grpo")
def grpo(
    rewards: torch.Tensor,
    groups: GroupIndex,
    *,
    norm_by_std: bool,
    eps: float,
    eps_mode: str,
) -> torch.Tensor:
    """GRPO: (r - mu) / (sigma + eps), sigma the unbiased (N-1) group std.

    ``eps_mode="max"`` divides by max(sigma, eps) instead (adaptive AGPO's form, with eps = 1e-8).
    ``norm_by_std=False`` gives r - mu.
    """
    require_non_negative(eps=eps)
    require_choice("eps_mode", eps_mode, ("add", "max"))
    mean, std = _group_mean_std(rewards, groups, unbiased=True)
    centered = rewards - mean
    if not norm_by_std:
        return centered
    return centered / (std + eps if eps_mode == "add" else std.clamp(min=eps))


@register_advantage("dr_grpo")
def dr_grpo(rewards: torch.Tensor, groups: GroupIndex) -> torch.Tensor:
    """Dr.GRPO: r - mu, no std division (pair with ``seq-mean-token-sum-norm`` aggregation)."""
    mean, _ = _group_mean_std(rewards, groups, unbiased=False)
    return rewards - mean


@register_advantage("rloo")
def rloo(rewards: torch.Tensor, groups: GroupIndex) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - (sum_j r_j - r_i) / (G - 1); a lone response keeps r_i."""
    sizes = groups.sizes.to(rewards.dtype)[groups.index]
    totals = groups.sum(rewards)[groups.index]
    baseline = torch.where(sizes > 1, (totals - rewards) / (sizes - 1).clamp(min=1), torch.zeros_like(rewards))
    return rewards - baseline


@register_advantage("w_reinforce")
def w_reinforce(
    rewards: torch.Tensor,
    groups: GroupIndex,
    scores: torch.Tensor,
    *,
    lambda_psr: float,
    correct_threshold: float,
) -> torch.Tensor:
    """Weighted REINFORCE: +lambda_psr for a correct response (score >= threshold), -1 for a wrong one."""
    require_non_negative(lambda_psr=lambda_psr)
    correct = scores >= correct_threshold
    return torch.where(correct, torch.full_like(rewards, lambda_psr), torch.full_like(rewards, -1.0))


@register_advantage("agpo")
def agpo(
    rewards: torch.Tensor,
    groups: GroupIndex,
    scores: torch.Tensor,
    *,
    lambda_neg: float,
    lambda_pos: float,
    adv_cap: float | None,
    neg_gate: str,
    pos_scale: str,
    correct_threshold: float,
    eps: float,
) -> torch.Tensor:
    """Asymmetric AGPO (docs/algorithms.md section 1, our reading of Xu et al. 2026).

    wrong   (score <  threshold): A = -lambda_neg * (1 - r), in every group (``neg_gate="mixed_only"``
                                  drops it in all-wrong groups, for ablation);
    correct (score >= threshold): A = +lambda_pos * (r - mu) / (sigma + eps), sigma the population std of
                                  the rewards (``pos_scale="none"``: lambda_pos * (r - mu)); optionally
                                  min(A, adv_cap); 0 in an all-correct group of two or more.
    r is the (possibly shaped) reward, the score the verifiable one. For binary rewards the positive term is
    lambda_pos * sqrt((1 - p) / p), p the group's success rate: large for rare correct answers, zero for
    trivial groups.
    """
    require_non_negative(lambda_neg=lambda_neg, lambda_pos=lambda_pos, adv_cap=adv_cap, eps=eps)
    require_choice("neg_gate", neg_gate, ("always", "mixed_only"))
    require_choice("pos_scale", pos_scale, ("std", "none"))
    correct = scores >= correct_threshold
    mean, std = _group_mean_std(rewards, groups, unbiased=False)

    positive = lambda_pos * (rewards - mean)
    if pos_scale == "std":
        positive = positive / (std + eps)
    if adv_cap is not None:
        positive = positive.clamp(max=adv_cap)
    all_correct = groups.all(correct)[groups.index] & (groups.sizes[groups.index] > 1)
    positive = torch.where(all_correct, torch.zeros_like(positive), positive)

    negative = -lambda_neg * (1.0 - rewards)
    if neg_gate == "mixed_only":
        all_wrong = groups.all(~correct)[groups.index]
        negative = torch.where(all_wrong, torch.zeros_like(negative), negative)

    return torch.where(correct, positive, negative)
