"""The ``hf`` rollout engine: a lean decode loop over a transformers causal LM, on CPU or GPU.

Prompts are sorted by length and cut into buckets of at most ``max_batch_rows`` generated rows (prompts x
n), so each bucket pads little; prompts are left-padded. Each bucket is decoded by ``agpo.rollout.decode``:
every prompt prefilled once and its key/value cache copied to its n sample rows, then one forward per step
on the rows still running, with per-row temperature, Gumbel-max sampling from a generator per row seeded
``row_seed(prompt seed, sample index)`` and the chosen token's log-prob read in the same step. So a row's
tokens depend only on its prompt, its seed and the weights, never on the other prompts in the batch
(data-parallel ranks that split a batch sample what one process would).

With ``constraint=`` (an ``agpo.rollout.constraint.DecodingConstraint``) its row mask masks each step's
scores before the log-softmax, so every text keeps to the constraint and the recorded log-probs are those of
the masked, renormalised distribution the tokens were drawn from; the constraint is compiled once per
constraint and tokenizer.

``score_continuations`` scores instead of sampling: the model's exact distribution over a few candidate
endings after each prompt and prefix (``agpo.rollout.continuations``; the ads annotation's score mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from agpo.models import autocast
from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP, Rollout, check_generate_args, row_seed
from agpo.rollout.constraint import DecodingConstraint, TokenConstraint
from agpo.rollout.continuations import continuation_logprobs
from agpo.rollout.decode import RowSampling, decode, left_pad


class HFRolloutEngine:
    """RolloutEngine over a transformers causal LM."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        max_batch_rows: int = 1024,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens for batched generation")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.autocast_dtype = autocast_dtype  # mixed precision of every forward pass (None: the weights' dtype)
        self._compiled: dict[DecodingConstraint, TokenConstraint] = {}  # once per constraint

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model  # generation uses the training module itself: never stale

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        temperatures: float | Sequence[float],
        max_new_tokens: int,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
        constraint: DecodingConstraint | None = None,
    ) -> Rollout:
        temps, seeds = check_generate_args(prompt_ids, n, temperatures, max_new_tokens, seed)
        compiled = None if constraint is None else self._compile(constraint)
        if compiled is not None and max_new_tokens < compiled.min_new_tokens():
            raise ValueError(
                f"max_new_tokens={max_new_tokens} cannot fit the decoding constraint: a complete answer takes at "
                f"least {compiled.min_new_tokens()} tokens with this tokenizer; raise max_new_tokens"
            )
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        per_bucket = max(1, self.max_batch_rows // n)
        results: dict[int, tuple[list[list[int]], list[list[float]]]] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), per_bucket):
                bucket = order[start : start + per_bucket]
                with autocast(self.model, self.autocast_dtype):
                    tokens, logprobs = self._generate_bucket(
                        [prompt_ids[i] for i in bucket],
                        [temps[i] for i in bucket],
                        None if greedy else [row_seed(seeds[i], j) for i in bucket for j in range(n)],
                        n,
                        max_new_tokens,
                        compiled,
                    )
                for j, i in enumerate(bucket):
                    results[i] = (tokens[j * n : (j + 1) * n], logprobs[j * n : (j + 1) * n])
        finally:
            self.model.train(was_training)
        return self._assemble(results, len(prompt_ids), n)

    def score_continuations(
        self, prompt_ids: Sequence[Sequence[int]], prefixes: Sequence[str], candidates: Sequence[str]
    ) -> torch.Tensor:
        """``[prompts, candidates]`` log-probs of each candidate ending (then EOS) after prompt + prefix,
        normalised over the candidates (``agpo.rollout.continuations``), ``max_batch_rows`` rows at once."""
        with autocast(self.model, self.autocast_dtype):
            return continuation_logprobs(
                self.model, self.tokenizer, prompt_ids, prefixes, candidates, self.max_batch_rows
            )

    def _compile(self, constraint: DecodingConstraint) -> TokenConstraint:
        if constraint not in self._compiled:
            self._compiled[constraint] = constraint.token_constraint(self.tokenizer)
        return self._compiled[constraint]

    def _generate_bucket(
        self,
        prompts: list[Sequence[int]],
        temps: list[float],
        seeds: list[int] | None,
        n: int,
        max_new_tokens: int,
        compiled: TokenConstraint | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Greedy when ``seeds`` is None, else one seeded sample per row (rows: prompt-major, n per prompt)."""
        pad = self.tokenizer.pad_token_id
        input_ids, attention = left_pad(prompts, pad)
        device = next(self.model.parameters()).device
        row_temps = torch.tensor(temps, device=device).repeat_interleave(n)
        mask = None if compiled is None else compiled.rows(len(row_temps), device)
        return decode(
            self.model,
            input_ids.to(device),
            attention.to(device),
            n,
            RowSampling(row_temps, seeds, mask),
            max_new_tokens,
            self.tokenizer.eos_token_id,
            pad,
        ).rows()

    def _assemble(self, results: dict, num_prompts: int, n: int) -> Rollout:
        eos = self.tokenizer.eos_token_id
        prompt_index, token_ids, logprobs, reasons = [], [], [], []
        for i in range(num_prompts):
            tokens, lps = results[i]
            for ids, lp in zip(tokens, lps, strict=True):
                prompt_index.append(i)
                token_ids.append(ids)
                logprobs.append(lp)
                reasons.append(FINISH_STOP if ids and ids[-1] == eos else FINISH_LENGTH)
        texts = self.tokenizer.batch_decode(token_ids, skip_special_tokens=True)
        return Rollout(prompt_index, token_ids, texts, logprobs, reasons)
