"""The interfaces between the parts of a training step, in one module that imports none of them:

- :class:`RolloutBatch`: the step's scored responses (agpo.rollout_batch collects them; agpo.logprobs and
  the step hooks read them);
- :class:`StepHooks`: what an algorithm feature may change in a step (agpo.hooks implements it; the
  collector and the trainer call it), with ``ProbeFn``, ``ClipRanges`` and ``HookState``.

Both sides import these from here, so no module of the step imports another in a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from agpo.adaptive import ProbeStats


@dataclass
class RolloutBatch:
    """One step's scored responses, flattened prompt-major. ``rewards`` are the shaped rewards that enter
    the advantage, ``scores`` the verifiable ones that decide correct vs wrong (None: nothing shaped the
    rewards, so the scores are the rewards)."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float]
    group_ids: list[int]
    temperatures: list[float]
    finish_reasons: list[str]
    answers: list[Hashable | None]
    rollout_logprobs: list[list[float]]
    scores: list[float] | None = None
    probe_stats: dict[int, ProbeStats] = field(default_factory=dict)  # adaptive AGPO, by group id

    PER_ROW = (
        "prompt_ids",
        "response_ids",
        "rewards",
        "scores",
        "group_ids",
        "temperatures",
        "finish_reasons",
        "answers",
        "rollout_logprobs",
    )

    def __post_init__(self) -> None:
        if self.scores is None:
            self.scores = list(self.rewards)

    def extend(self, other: RolloutBatch) -> None:
        for name in self.PER_ROW:
            getattr(self, name).extend(getattr(other, name))
        self.probe_stats.update(other.probe_stats)

    def select(self, rows: list[int]) -> RolloutBatch:
        kept = {name: [getattr(self, name)[i] for i in rows] for name in self.PER_ROW}
        groups = set(kept["group_ids"])
        return RolloutBatch(**kept, probe_stats={g: s for g, s in self.probe_stats.items() if g in groups})

    def __len__(self) -> int:
        return len(self.response_ids)


# Samples and scores a probe group of G responses per prompt at a temperature: (rewards, extracted answers
# with None for an unparseable one, response texts), prompt-major.
ProbeFn = Callable[[float], tuple[list[float], list[Hashable | None], list[str]]]
ClipRanges = tuple[torch.Tensor, torch.Tensor] | None  # (eps_low, eps_high) per row [B], or the loss config's
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
    ) -> ClipRanges:
        """(eps_low, eps_high) per row of ``batch`` [B], or None: the loss config's. ``old_entropies`` and
        ``masks`` are per micro-batch; the entropies are empty unless ``reads_old_policy``."""
        ...

    def observe_update(
        self,
        model: torch.nn.Module,
        batch: RolloutBatch,
        tensors: Sequence[dict[str, torch.Tensor]],
        old_log_probs: Sequence[torch.Tensor],
        clip_ranges: ClipRanges,
    ) -> dict[str, float]:
        """After the step's optimizer steps (``model`` holds the new weights): update state, return metrics.
        ``tensors`` and ``old_log_probs`` are per micro-batch, their rows in the order of ``batch``."""
        ...

    def state_dict(self) -> HookState: ...

    def load_state_dict(self, state: HookState) -> None: ...
