"""Step hooks: the points where an algorithm feature changes a training step, each named for what it changes.

The trainer's loop is the same for every algorithm; it calls its :class:`StepHooks` at three points:

- ``choose_temperatures``  before sampling: each prompt's sampling temperature, optionally chosen from a
  probe group the hook asks for (probe tokens count in the token budget);
- ``clip_ranges``          before the gradient passes: (eps_low, eps_high) per row, or None for the loss config's;
- ``observe_update``       after the optimizer steps: what the update did feeds the hook's state; it
  returns metrics of its own.

``reads_old_policy`` says that ``clip_ranges`` reads the old policy's entropies, so the trainer computes
pi_old's log-probs in a pass of their own before the gradient passes (else, with one PPO epoch, it takes
them detached from the gradient pass). ``state_dict`` / ``load_state_dict`` are the hook's part of a
checkpoint (the ``controller`` entry of the trainer state: None for stateless hooks).

:class:`PlainStep` is the no-op default; :class:`AdaptiveHooks` drives the adaptive AGPO controllers of
agpo.adaptive (docs/algorithms.md section 3): probe temperatures, per-prompt clip ranges, step-KL feedback. Its
batch statistics (the mean H_pol over groups, KL_step) are taken per prompt group over every micro-batch
and, through ``all_reduce_sum``, every data-parallel rank, so they do not depend on how the batch is cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from agpo.adaptive import (
    AdaptiveController,
    ProbeStats,
    clip_bounds,
    group_probe_statistics,
    group_token_means,
    mean_over_groups,
    vote_keys,
)
from agpo.advantages import GroupIndex
from agpo.logprobs import token_log_probs
from agpo.step_interfaces import ClipRanges, HookState, ProbeFn, RolloutBatch


class PlainStep:
    """No-op hooks: the configured temperature, the loss config's clip range, nothing observed."""

    reads_old_policy = False

    def choose_temperatures(
        self, temperature: float, prompts: int, probe: ProbeFn
    ) -> tuple[list[float], list[ProbeStats]]:
        return [temperature] * prompts, []

    def clip_ranges(
        self, batch: RolloutBatch, old_entropies: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
    ) -> ClipRanges:
        return None

    def observe_update(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: ClipRanges,
    ) -> dict[str, float]:
        return {}

    def state_dict(self) -> HookState:
        return None

    def load_state_dict(self, state: HookState) -> None:
        return None


class AdaptiveHooks:
    """Adaptive AGPO: probe temperatures, per-prompt clip ranges and step-KL feedback (agpo.adaptive).

    ``eps_low`` / ``eps_high``: the loss config's clip pair, whose ratio a clip-higher setting keeps
    (agpo.adaptive.clip_bounds); ``all_reduce_sum`` adds a list of floats over data-parallel ranks.
    """

    reads_old_policy = True

    def __init__(
        self,
        controller: AdaptiveController,
        group_size: int,
        *,
        eps_low: float,
        eps_high: float,
        all_reduce_sum: Callable[[list[float]], list[float]] = list,
    ) -> None:
        self.controller, self.group_size = controller, group_size
        self.eps_low, self.eps_high, self.all_reduce_sum = eps_low, eps_high, all_reduce_sum

    def choose_temperatures(
        self, temperature: float, prompts: int, probe: ProbeFn
    ) -> tuple[list[float], list[ProbeStats]]:
        """Probe every prompt at tau_base; each prompt's temperature from its probe statistics (H_vote over
        the probe answers' vote keys: an unparseable answer votes for its own stripped text)."""
        config = self.controller.config
        rewards, answers, texts = probe(config.tau_base)
        stats = group_probe_statistics(rewards, vote_keys(answers, texts), self.group_size, config.dispersion)
        return self.controller.temperatures(stats), stats

    def clip_ranges(
        self, batch: RolloutBatch, old_entropies: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
    ) -> ClipRanges:
        """One clip range per prompt group, from its probe statistics and its H_pol: the old policy's mean token
        entropy over the group's response tokens (at their sampling temperature). H_ref takes in the mean of
        H_pol over the batch's groups, once; a group without response tokens (all masked) is left out of that
        mean and given it as its H_pol (its rows carry no loss). Each row gets its group's (eps_low, eps_high)."""
        groups = GroupIndex.from_ids(batch.group_ids)
        entropies, tokens = group_token_means(old_entropies, masks, groups)
        batch_entropy = mean_over_groups(entropies, tokens, self.all_reduce_sum)
        entropies = torch.where(tokens > 0, entropies, batch_entropy)
        stats = [batch.probe_stats[g] for g in dict.fromkeys(batch.group_ids)]
        eps = self.controller.clip_eps(stats, entropies.tolist(), batch_entropy)
        low, high = clip_bounds(eps, self.eps_low, self.eps_high)
        return low[groups.index], high[groups.index]

    def observe_update(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: ClipRanges,
    ) -> dict[str, float]:
        """KL_step between the old and the updated policy, once for the whole batch: per prompt group
        max(0, mean token log-ratio logp_old - logp_new) over all its micro-batches' tokens, then the mean over
        the groups (of every rank) with a token; KL_step_ema takes it in once. Metrics: KL_step, its EMA and the
        mean clip range (eps_low)."""
        with torch.no_grad():
            new = [token_log_probs(model, t)[0] for t in tensors]
        log_ratios = [old - n for old, n in zip(old_log_probs, new, strict=True)]
        groups = GroupIndex.from_ids(batch.group_ids)
        means, tokens = group_token_means(log_ratios, [t["mask"] for t in tensors], groups)
        step_kl = mean_over_groups(means.clamp(min=0), tokens, self.all_reduce_sum)
        metrics = {"step_kl": step_kl, "step_kl_ema": self.controller.observe_step_kl(step_kl)}
        if clip_ranges is not None:
            metrics["clip_eps_mean"] = float(clip_ranges[0].mean())
        return metrics

    def state_dict(self) -> HookState:
        return self.controller.state_dict()

    def load_state_dict(self, state: HookState) -> None:
        if state is None:
            raise ValueError("adaptive AGPO needs its controller state; this checkpoint has none")
        self.controller.load_state_dict(state)
