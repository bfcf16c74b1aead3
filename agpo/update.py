"""The parts of the policy update that the trainer's loop (RLTrainer.update) puts together.

One update is ``optimizer.ppo_epochs`` optimizer steps over a step's rollout batch. Each step runs the batch in
micro-batches of ``optimizer.micro_batch_size`` rows (:func:`micro_batch_rows`), accumulates their gradients, then
clips the global gradient norm and steps the optimizer.

Every micro-batch's loss is divided by the normalisers of the *whole* batch (:func:`global_normalisers`:
token and sequence counts summed over micro-batches and ranks; the length normaliser is the trainer's
constant, ``loss.max_response_len`` else ``rollout.max_new_tokens``, or given None the padded response width maximised
over them), so the micro-batch losses add up to the full-batch loss and their accumulated gradient is the
full-batch gradient, for every ``loss_agg_mode`` (see agpo.losses). Nothing is re-weighted outside the
loss. The loss metrics are shares of the full-batch values the same way: :class:`UpdateMetrics` sums them
over micro-batches and ranks and averages them over PPO epochs; it adds the rollout-correction metrics
(engine vs trainer log-prob gap, truncated importance weights) over the same tokens.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from agpo.distributed import Updater
from agpo.losses import Normalisers


def micro_batch_rows(size: int, micro_batch_size: int) -> list[slice]:
    """Consecutive row slices of at most ``micro_batch_size`` rows covering ``size`` rows."""
    return [slice(start, start + micro_batch_size) for start in range(0, size, micro_batch_size)]


def global_normalisers(masks: Sequence[torch.Tensor], updater: Updater, max_response_len: int | None) -> Normalisers:
    """The whole batch's loss normalisers from the response masks of this rank's micro-batches.

    Tokens and sequences (rows with an unmasked token) are summed over micro-batches and ranks; the length
    normaliser is ``max_response_len``, else the widest micro-batch over all ranks (the padded width of the
    full batch).
    """
    tokens, seqs = updater.all_reduce_sum(
        [sum(float(m.sum()) for m in masks), sum(float((m.sum(dim=-1) > 0).sum()) for m in masks)]
    )
    if max_response_len is None:
        (width,) = updater.all_reduce_max([max(float(m.shape[-1]) for m in masks)])
        max_response_len = int(width)
    return Normalisers(num_tokens=tokens, num_seqs=seqs, max_len=max_response_len)


class UpdateMetrics:
    """Adds up one update's micro-batch loss metrics; :meth:`summary` gives the full-batch values."""

    def __init__(
        self, tensors: Sequence[dict[str, torch.Tensor]], normalisers: Normalisers, rollout_is_cap: float | None
    ) -> None:
        self.tensors, self.normalisers, self.cap = tensors, normalisers, rollout_is_cap
        self.sums: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        """One micro-batch's metrics: already its share of the full-batch value (see agpo.losses)."""
        for key, value in metrics.items():
            self.sums[key] = self.sums.get(key, 0.0) + value

    def summary(
        self,
        updater: Updater,
        grad_norms: Sequence[float],
        old_log_probs: Sequence[torch.Tensor],
        is_weights: Sequence[torch.Tensor | None],
    ) -> dict[str, float]:
        """Loss metrics summed over ranks and averaged over epochs, the mean grad norm, rollout correction."""
        keys = sorted(self.sums)
        # Engine vs trainer log-probs of the same tokens: 0 up to numerics when both run the same weights.
        mismatch = sum(
            float(((old - t["rollout_logprobs"]).abs() * t["mask"]).sum())
            for old, t in zip(old_log_probs, self.tensors, strict=True)
        )
        weight_sum = capped = 0.0
        if self.cap:
            for weights, t in zip(is_weights, self.tensors, strict=True):
                weight_sum += float((weights * t["mask"]).sum())
                capped += float(((weights >= self.cap) * t["mask"]).sum())
        *totals, mismatch, weight_sum, capped = updater.all_reduce_sum(
            [*(self.sums[key] for key in keys), mismatch, weight_sum, capped]
        )
        epochs = len(grad_norms)
        summary = {key: total / epochs for key, total in zip(keys, totals, strict=True)}
        summary["grad_norm"] = statistics.fmean(grad_norms)
        tokens = max(self.normalisers.num_tokens, 1)
        summary["rollout_logprob_abs_diff"] = mismatch / tokens
        if self.cap:
            summary["rollout_is_weight_mean"] = weight_sum / tokens
            summary["rollout_is_capped_frac"] = capped / tokens
        return summary
