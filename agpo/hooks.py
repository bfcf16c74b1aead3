"""Step hooks: the points where an algorithm feature changes a training step, each named for what it changes.

The trainer's loop is the same for every algorithm; it calls its :class:`StepHooks` at three points:

- ``choose_temperatures``  before sampling: each prompt's sampling temperature, optionally chosen from a
  probe group the hook asks for (probe tokens count in the token budget);
- ``clip_ranges``          before the gradient passes: a clip range per row, or None for the loss config's;
- ``observe_update``       after the optimizer steps: what the update did feeds the hook's state; it
  returns metrics of its own.

``reads_old_policy`` says that ``clip_ranges`` reads the old policy's entropies, so the trainer computes
pi_old's log-probs in a pass of their own before the gradient passes (else, with one PPO epoch, it takes
them detached from the gradient pass). ``state_dict`` / ``load_state_dict`` are the hook's part of a
checkpoint (the ``controller`` entry of the trainer state: None for stateless hooks).

:class:`PlainStep` is the no-op default; :class:`AdaptiveHooks` drives the adaptive AGPO controllers of
agpo.adaptive (ALGORITHMS.md section 3): probe temperatures, per-prompt clip ranges, step-KL feedback.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

import torch

from agpo.adaptive import AdaptiveController, ProbeStats, group_probe_statistics
from agpo.logprobs import token_log_probs
from agpo.rollout_batch import RolloutBatch

# Samples and scores a probe group of G responses per prompt at a temperature: (rewards, answers), prompt-major.
ProbeFn = Callable[[float], tuple[list[float], list[Hashable | None]]]
HookState = dict[str, float | None] | None


class StepHooks(Protocol):
    """What a training step lets an algorithm feature change (see the module docstring)."""

    reads_old_policy: bool

    def choose_temperatures(
        self, temperature: float, prompts: int, probe: ProbeFn
    ) -> tuple[list[float], list[ProbeStats]]:
        """Each prompt's sampling temperature (``temperature``: the configured one), and the probe
        statistics of each prompt when the hook sampled a probe (else an empty list)."""
        ...

    def clip_ranges(
        self, batch: RolloutBatch, old_entropies: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
    ) -> torch.Tensor | None:
        """A clip range per row of ``batch`` [B] (used as eps_low and eps_high), or None: the loss config's.
        ``old_entropies`` and ``masks`` are per micro-batch; the entropies are empty unless ``reads_old_policy``."""
        ...

    def observe_update(
        self,
        model: torch.nn.Module,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: torch.Tensor | None,
    ) -> dict[str, float]:
        """After the step's optimizer steps (``model`` holds the new weights): update state, return metrics."""
        ...

    def state_dict(self) -> HookState: ...

    def load_state_dict(self, state: HookState) -> None: ...


class PlainStep:
    """No-op hooks: the configured temperature, the loss config's clip range, nothing observed."""

    reads_old_policy = False

    def choose_temperatures(
        self, temperature: float, prompts: int, probe: ProbeFn
    ) -> tuple[list[float], list[ProbeStats]]:
        return [temperature] * prompts, []

    def clip_ranges(
        self, batch: RolloutBatch, old_entropies: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
    ) -> torch.Tensor | None:
        return None

    def observe_update(
        self,
        model: torch.nn.Module,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: torch.Tensor | None,
    ) -> dict[str, float]:
        return {}

    def state_dict(self) -> HookState:
        return None

    def load_state_dict(self, state: HookState) -> None:
        return None


class AdaptiveHooks:
    """Adaptive AGPO: probe temperatures, per-prompt clip ranges and step-KL feedback (agpo.adaptive)."""

    reads_old_policy = True

    def __init__(self, controller: AdaptiveController, group_size: int) -> None:
        self.controller, self.group_size = controller, group_size

    def choose_temperatures(
        self, temperature: float, prompts: int, probe: ProbeFn
    ) -> tuple[list[float], list[ProbeStats]]:
        """Probe every prompt at tau_base; each prompt's temperature from its probe statistics."""
        config = self.controller.config
        rewards, answers = probe(config.tau_base)
        stats = group_probe_statistics(rewards, answers, self.group_size, config.dispersion)
        return self.controller.temperatures(stats), stats

    def clip_ranges(
        self, batch: RolloutBatch, old_entropies: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """One clip range per prompt group, from its probe statistics and H_pol, the old policy's mean token
        entropy over this rank's whole batch (one value for every group; ALGORITHMS.md section 3 asks for each
        group's own H_pol, which this does not do yet)."""
        tokens = sum(float(m.sum()) for m in masks)
        entropy = sum(float((h * m).sum()) for h, m in zip(old_entropies, masks, strict=True)) / max(tokens, 1)
        group_order = list(dict.fromkeys(batch.group_ids))
        per_group = self.controller.clip_eps([batch.probe_stats[g] for g in group_order], entropy)
        by_group = dict(zip(group_order, per_group.tolist(), strict=True))
        return torch.tensor([by_group[g] for g in batch.group_ids])

    def observe_update(
        self,
        model: torch.nn.Module,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: torch.Tensor | None,
    ) -> dict[str, float]:
        """KL_step of each micro-batch between the old and the updated policy, each folded into the KL EMA in
        turn (so the EMA moves once per micro-batch; ALGORITHMS.md section 3 asks for one per-group KL_step
        per optimizer step, which this does not do yet). Metrics: their mean, the EMA, the mean clip range."""
        with torch.no_grad():
            new = [token_log_probs(model, t)[0] for t in tensors]
        kl = [
            self.controller.observe_step_kl(old, n, t["mask"])
            for old, n, t in zip(old_log_probs, new, tensors, strict=True)
        ]
        metrics = {"step_kl": statistics.fmean(kl), "step_kl_ema": self.controller.step_kl_ema}
        if clip_ranges is not None:
            metrics["clip_eps_mean"] = float(clip_ranges.mean())
        return metrics

    def state_dict(self) -> HookState:
        return self.controller.state_dict()

    def load_state_dict(self, state: HookState) -> None:
        if state is None:
            raise ValueError("adaptive AGPO needs its controller state; this checkpoint has none")
        self.controller.load_state_dict(state)
