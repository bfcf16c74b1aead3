"""The ``hf`` rollout engine: batched transformers ``generate`` on CPU or GPU.

Prompts are sorted by length and cut into buckets of at most ``max_batch_rows`` generated rows (prompts x
n), so each ``generate`` call pads little; prompts are left-padded. Each prompt is prefilled once and
its key/value cache copied to its n sample rows (a GRPO group shares its prompt; a plain batched
``generate`` would prefill it n times). Three logits processors do the sampling, with HF's own
temperature, top-k and top-p off:

1. ``RowTemperature`` divides each row's logits by that row's prompt temperature;
2. ``TokenLogprobRecorder`` records the log-probability of every chosen token as generation goes (one
   step of scores in memory, not the whole vocabulary for every step);
3. ``RowSampler`` samples by the Gumbel-max trick (the exponential-race form vLLM uses): the token is
   ``argmax(softmax(logits / T) / E)`` with ``E ~ Exp(1)`` drawn from a generator owned by that row and
   seeded by ``row_seed(prompt seed, sample index)``; HF's greedy search then takes the argmax. So a
   row's tokens depend only on its prompt, its seed and the weights, never on the other prompts in
   the batch (data-parallel ranks that split a batch sample what one process would).

With ``constraint=`` (an ``AnswerGrammar``) an ``AnswerConstraint`` (``grammar.py``) masks the scores
between 1 and 2, so every answer parses and the recorded log-probs are those of the masked, renormalised
distribution the tokens were drawn from; its token automaton is built once per grammar and tokenizer.

``score_continuations`` scores instead of sampling: the model's exact distribution over a few candidate
endings after each prompt and prefix (``agpo.grade_scoring``; annotation's score mode).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Cache, GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedTokenizerBase

from agpo.grade_scoring import grade_logprobs
from agpo.models import cache_argument
from agpo.rewards.relevance import AnswerGrammar
from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP, Rollout, check_generate_args, row_seed
from agpo.rollout.grammar import AnswerConstraint, TokenAutomaton


class RowTemperature(LogitsProcessor):
    """Divide row r's logits by ``temperatures[r]``."""

    def __init__(self, temperatures: torch.Tensor) -> None:
        self.temperatures = temperatures[:, None]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores / self.temperatures.to(scores.dtype)


class TokenLogprobRecorder(LogitsProcessor):
    """Keeps log-softmax of the final scores one step, and reads off the chosen token's value at the next."""

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._collect(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _collect(self, chosen: torch.Tensor) -> None:
        if self.previous is not None:
            self.steps.append(self.previous.gather(-1, chosen[:, None]).squeeze(-1))
            self.previous = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[rows, steps] log-probs, given the token chosen at the final step."""
        self._collect(last_tokens)
        return torch.stack(self.steps, dim=1) if self.steps else torch.zeros(len(last_tokens), 0)


class RowSampler(LogitsProcessor):
    """Per-row seeded sampling: returns scores whose argmax is a sample from softmax(scores) of that row."""

    def __init__(self, seeds: Sequence[int], device: torch.device) -> None:
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        races = torch.stack(
            [torch.empty(scores.shape[1], device=scores.device).exponential_(generator=g) for g in self.generators]
        )
        # log p - log E: argmax is distributed as softmax(scores) (the Gumbel-max trick, in log space)
        return torch.log_softmax(scores.float(), dim=-1) - races.log()


class HFRolloutEngine:
    """RolloutEngine over a transformers causal LM."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, max_batch_rows: int = 1024) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs pad and eos tokens for batched generation")
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self._automata: dict[AnswerGrammar, TokenAutomaton] = {}  # built once per grammar

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
        constraint: AnswerGrammar | None = None,
    ) -> Rollout:
        temps, seeds = check_generate_args(prompt_ids, n, temperatures, max_new_tokens, seed)
        automaton = None if constraint is None else self._automaton(constraint)
        if automaton is not None and max_new_tokens < automaton.min_new_tokens():
            raise ValueError(
                f"max_new_tokens={max_new_tokens} cannot fit the answer grammar: a complete answer takes at "
                f"least {automaton.min_new_tokens()} tokens with this tokenizer; raise max_new_tokens"
            )
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        per_bucket = max(1, self.max_batch_rows // n)
        results: dict[int, tuple[list[list[int]], list[list[float]]]] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(order), per_bucket):
                bucket = order[start : start + per_bucket]
                tokens, logprobs = self._generate_bucket(
                    [prompt_ids[i] for i in bucket],
                    [temps[i] for i in bucket],
                    None if greedy else [row_seed(seeds[i], j) for i in bucket for j in range(n)],
                    n,
                    max_new_tokens,
                    automaton,
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
        normalised over the candidates (``agpo.grade_scoring.grade_logprobs``), ``max_batch_rows`` rows at once."""
        return grade_logprobs(self.model, self.tokenizer, prompt_ids, prefixes, candidates, self.max_batch_rows)

    def _automaton(self, grammar: AnswerGrammar) -> TokenAutomaton:
        if grammar not in self._automata:
            self._automata[grammar] = TokenAutomaton(grammar, self.tokenizer)
        return self._automata[grammar]

    def _generate_bucket(
        self,
        prompts: list[Sequence[int]],
        temps: list[float],
        seeds: list[int] | None,
        n: int,
        max_new_tokens: int,
        automaton: TokenAutomaton | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Greedy when ``seeds`` is None, else one seeded sample per row (rows: prompt-major, n per prompt)."""
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.as_tensor(list(ids))
            attention[row, width - len(ids) :] = 1
        device = next(self.model.parameters()).device
        recorder = TokenLogprobRecorder()
        row_temps = torch.tensor(temps, device=device).repeat_interleave(n)
        processors: list[LogitsProcessor] = [RowTemperature(row_temps)]
        if automaton is not None:
            processors.append(AnswerConstraint(automaton, len(row_temps), max_new_tokens, device))
        processors.append(recorder)
        if seeds is not None:
            processors.append(RowSampler(seeds, device))
        config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_k=None,
            top_p=1.0,
            pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        input_ids, attention = input_ids.to(device), attention.to(device)
        sequences = self.model.generate(
            input_ids=input_ids.repeat_interleave(n, dim=0),  # n rows per prompt, prompt-major
            attention_mask=attention.repeat_interleave(n, dim=0),
            **{cache_argument(self.model): self._shared_prefix_cache(input_ids, attention, n)},
            generation_config=config,
            logits_processor=LogitsProcessorList(processors),
        )
        generated = sequences[:, width:].cpu()
        step_logprobs = recorder.finish(sequences[:, -1]).cpu()
        tokens, logprobs = [], []
        eos = self.tokenizer.eos_token_id
        for row in range(generated.shape[0]):
            ids = generated[row].tolist()
            length = ids.index(eos) + 1 if eos in ids else len(ids)
            tokens.append(ids[:length])
            logprobs.append(step_logprobs[row, :length].tolist())
        return tokens, logprobs

    def _shared_prefix_cache(self, input_ids: torch.Tensor, attention: torch.Tensor, n: int) -> Cache | None:
        """The n samples of a prompt share it: run each prompt (all but its last token) through the model
        once and copy its key/value cache n times, instead of n identical prefills; ``generate`` then
        starts from the last prompt token. None (an ordinary prefill) when there is nothing to share."""
        if n == 1 or input_ids.shape[1] < 2:
            return None
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        output = self.model(
            input_ids=input_ids[:, :-1],
            attention_mask=attention[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
        )
        cache = getattr(output, cache_argument(self.model))
        cache.batch_repeat_interleave(n)
        return cache

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
