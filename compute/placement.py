"""Where a model runs: the one notion of device and precision the libraries share.

- ``Placement``: a torch device name and the dtype forward passes autocast to (None: the weights' float32);
  ``ON_CPU`` is the default of every library call that takes one. A stage chooses it by its ``device`` and
  ``precision`` keys (pipelines.devices); the libraries follow it and never read a config.
- ``autocast(device, dtype)``: the context every forward pass enters (agpo's trainer, SFT and hf engine, through
  ``agpo.models.autocast``; ``student.model``): mixed precision in ``dtype`` on the device's type, or nothing when
  ``dtype`` is None, so the weights (and the optimizer's state) stay float32 either way.

It sits below both libraries, beside ``durable``, because the teacher's stages, the student and the evaluation all
place models, and none of them owns the notion. Imports torch only inside ``autocast``: configs validate without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Placement:
    """A torch device name (``cpu``, ``cuda:0``) and the dtype forward passes autocast to (None: none)."""

    device: str = "cpu"
    autocast_dtype: Any = None  # torch.dtype (bf16) or None; typed loosely so this module needs no torch

    def autocast(self) -> torch.autocast:
        return autocast(self.device, self.autocast_dtype)


ON_CPU = Placement()


def autocast(device: str | torch.device, dtype: torch.dtype | None) -> torch.autocast:
    """Forward passes in mixed precision ``dtype`` on ``device``'s type; a context that changes nothing when
    ``dtype`` is None."""
    import torch

    return torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype is not None)
