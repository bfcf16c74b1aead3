"""The ``hf`` engine's decode loop: sampling with a plain loop over steps instead of transformers ``generate``.

At rollout sizes (hundreds of short rows, a small model) ``generate``'s per-token machinery and the rows
that finished early but still ride along cost as much as the model. Here, for one bucket of left-padded
prompts with n sample rows each (prompt-major):

1. **Prefill** each prompt once (positions count its real tokens only, ``logits_to_keep=1``); repeat its
   last-position logits and its key/value cache n times (``batch_repeat_interleave``): a GRPO group
   shares its prompt.
2. **Step** (``RowSampling``), on the live rows only: ``scores = logits / T_row``; with a decoding
   constraint, disallowed tokens to -inf (its ``RowMask``, agpo.rollout.constraint);
   ``logp = log_softmax(scores)`` once; the token is
   ``argmax(scores)`` (greedy) or ``argmax(logp - log E)`` with ``E ~ Exp(1)^vocab`` drawn from the row's
   own ``torch.Generator`` seeded ``row_seed(prompt seed, sample index)`` (Gumbel-max in its
   exponential-race form, as vLLM samples). So a row's tokens depend only on its prompt, seed and the
   weights, never on the rest of the batch; its log-prob ``logp[token]`` is read in the same step.
3. **Finish**: a row that emits EOS leaves the batch (its cache rows, generator and constraint state are
   dropped), so later steps compute only live rows; the others stop at ``max_new_tokens``.
4. **Next forward**: the live rows' last tokens with the cache, the attention mask one column longer and
   each row's position one past its previous one.

Draws per row and step are the same ``exponential_`` calls, in the same order, as the former
``generate``-based sampler made, so the same seeds give the same samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agpo.models import cache_argument
from agpo.rollout.constraint import RowMask


class RowSampling:
    """One decoding step for a batch of rows: temperature, constraint mask, log-softmax, draw, log-prob.

    ``seeds`` None: greedy. ``keep`` drops rows (finished ones) so that the remaining rows keep their
    temperature, generator and constraint state."""

    def __init__(self, temperatures: torch.Tensor, seeds: Sequence[int] | None, mask: RowMask | None = None) -> None:
        self.temperatures = temperatures[:, None].float()
        device = temperatures.device
        self.generators = None if seeds is None else [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.mask = mask

    def __call__(self, logits: torch.Tensor, remaining: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, its log-prob) per row from ``[rows, vocab]`` logits, ``remaining`` tokens of budget left."""
        scores = logits.float() / self.temperatures
        if self.mask is not None:
            scores = self.mask(scores, remaining)
        logp = torch.log_softmax(scores, dim=-1)
        if self.generators is None:
            tokens = scores.argmax(dim=-1)
        else:
            races = torch.empty_like(logp)
            for row, generator in enumerate(self.generators):
                races[row].exponential_(generator=generator)
            tokens = (logp - races.log()).argmax(dim=-1)  # log p - log E: distributed as softmax(scores)
        if self.mask is not None:
            self.mask.advance(tokens)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows ``index`` (ascending)."""
        self.temperatures = self.temperatures[index]
        if self.generators is not None:
            self.generators = [self.generators[i] for i in index.tolist()]
        if self.mask is not None:
            self.mask.keep(index)


def left_pad(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention`` ``[prompts, longest]``, each prompt right-aligned after pads."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.as_tensor(list(ids))
        attention[row, width - len(ids) :] = 1
    return input_ids, attention


@dataclass
class Decoded:
    """``tokens`` and ``logprobs`` ``[rows, max_new_tokens]`` (pad and 0 past ``lengths``), EOS included."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    lengths: torch.Tensor

    def rows(self) -> tuple[list[list[int]], list[list[float]]]:
        """Each row's tokens and log-probs as lists, cut at its length."""
        lengths = self.lengths.tolist()
        tokens = [row[:length] for row, length in zip(self.tokens.tolist(), lengths, strict=True)]
        return tokens, [row[:length] for row, length in zip(self.logprobs.tolist(), lengths, strict=True)]


@torch.inference_mode()
def decode(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    n: int,
    sampling: RowSampling,
    max_new_tokens: int,
    eos: int,
    pad: int,
) -> Decoded:
    """Decode ``n`` rows per left-padded prompt (``input_ids``/``attention`` ``[prompts, width]``) with
    ``sampling`` built for the ``prompts * n`` rows (module docstring)."""
    rows, device = input_ids.shape[0] * n, input_ids.device
    cache_key = cache_argument(model)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    output = model(
        input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    cache = getattr(output, cache_key)
    cache.batch_repeat_interleave(n)
    logits = output.logits[:, -1].repeat_interleave(n, dim=0)
    attention = attention.repeat_interleave(n, dim=0)
    position = positions[:, -1:].repeat_interleave(n, dim=0)
    tokens = torch.full((rows, max_new_tokens), pad, dtype=torch.long, device=device)
    logprobs = torch.zeros((rows, max_new_tokens), device=device)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # the output row of each batch row
    for step in range(max_new_tokens):
        chosen, chosen_logp = sampling(logits, max_new_tokens - step)
        tokens[live, step], logprobs[live, step] = chosen, chosen_logp
        if step == max_new_tokens - 1:
            break
        finished = chosen == eos
        if bool(finished.any()):
            lengths[live[finished]] = step + 1
            index = (~finished).nonzero().squeeze(1)
            if len(index) == 0:
                break
            live, chosen, attention, position = live[index], chosen[index], attention[index], position[index]
            cache.batch_select_indices(index)
            sampling.keep(index)
        attention = torch.cat([attention, attention.new_ones(len(live), 1)], dim=1)
        position = position + 1
        output = model(
            input_ids=chosen[:, None],
            attention_mask=attention,
            position_ids=position,
            use_cache=True,
            **{cache_key: cache},
        )
        cache = getattr(output, cache_key)
        logits = output.logits[:, -1]
    return Decoded(tokens, logprobs, lengths)
