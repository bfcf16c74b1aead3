"""Exact distributions over a few candidate endings: how likely a causal LM finds each one after a given prefix
(the ``hf`` engine's ``score_continuations``; the ads pipeline reads a relevance grade this way, its score mode).

For prompt i with tokens x_i and completion prefix text r_i (e.g. a teacher's reason up to and including
``<answer>``), and candidate endings c_1..c_K (e.g. ``"0</answer>"``, ``"1</answer>"``, ...):

    y_ik      = tokens(r_i + c_k) + [EOS]                (the completion as SFT tokenizes its targets:
                                                            alone, without special tokens, then EOS)
    s_ik      = sum_t log P(y_ik[t] | x_i, y_ik[:t])      (teacher-forced, temperature 1)
    log p_ik  = s_ik - logsumexp_k s_ik                   (``continuation_logprobs`` returns this [pairs, K])

Tokenizing ``r_i + c_k`` as one text (rather than ``tokens(r_i) + tokens(c_k)``) keeps the tokenization the
model was trained on even where BPE merges across the ``<answer>`` boundary. Where it does not, every y_ik
starts with the same tokens and their log-probs cancel in the normalisation, so p_ik is exactly
``P(c_k EOS | x_i, r_i)`` renormalised over the K candidates.

Batching: per pair, the K token sequences share their longest common prefix (prompt + reason at least).
That shared part is run once per pair (left-padded; position ids count only real tokens), its key/value
cache is copied to the pair's K rows, and the K differing tails are teacher-forced on it in one more
forward pass (right-padded, masked). So a chunk of P pairs costs one pass over P shared prefixes and one
over P x K short tails, instead of P x K full sequences. The first tail token's log-prob comes from the
shared pass's last position (the final column: left padding aligns every row's last token there).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agpo.models import cache_argument


@torch.no_grad()
def continuation_logprobs(
    model: torch.nn.Module,
    tokenizer,
    prompt_ids: Sequence[Sequence[int]],
    prefixes: Sequence[str],
    candidates: Sequence[str],
    max_batch_rows: int = 1024,
) -> torch.Tensor:
    """``[pairs, candidates]`` log p_ik of the module docstring (each row's exp sums to 1), float32, CPU.

    ``max_batch_rows`` bounds the tail pass: pairs are scored ``max_batch_rows // len(candidates)`` at a time.
    """
    if len(prompt_ids) != len(prefixes):
        raise ValueError(f"need one prefix per prompt: {len(prompt_ids)} prompts, {len(prefixes)} prefixes")
    if len(candidates) < 1 or len(set(candidates)) != len(candidates):
        raise ValueError(f"candidates must be distinct and non-empty, got {list(candidates)!r}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer needs an eos token (the end of every candidate)")
    per_chunk = max(1, max_batch_rows // len(candidates))
    pad = eos if tokenizer.pad_token_id is None else tokenizer.pad_token_id
    was_training = model.training
    model.eval()
    try:
        chunks = []
        for start in range(0, len(prompt_ids), per_chunk):
            shared, tails = [], []
            stop = start + per_chunk
            for ids, prefix in zip(prompt_ids[start:stop], prefixes[start:stop], strict=True):
                completions = [tokenizer(prefix + c, add_special_tokens=False)["input_ids"] + [eos] for c in candidates]
                common = _common_prefix_length(completions)
                shared.append(list(ids) + completions[0][:common])
                tails.append([c[common:] for c in completions])
            chunks.append(_score_chunk(model, pad, shared, tails))
    finally:
        model.train(was_training)
    scores = torch.cat(chunks) if chunks else torch.zeros(0, len(candidates))
    return torch.log_softmax(scores, dim=-1)


def _common_prefix_length(sequences: list[list[int]]) -> int:
    """Length of the longest common prefix; each sequence ends in EOS, so every tail keeps >= 1 token."""
    length = 0
    for column in zip(*sequences, strict=False):
        if any(t != column[0] for t in column):
            break
        length += 1
    return length


def _score_chunk(
    model: torch.nn.Module, pad: int, shared: list[list[int]], tails: list[list[list[int]]]
) -> torch.Tensor:
    """s_ik of the module docstring for one chunk: the tails' summed log-probs after each shared prefix."""
    device = next(model.parameters()).device
    pairs, k = len(shared), len(tails[0])
    width = max(len(s) for s in shared)
    input_ids = torch.full((pairs, width), pad, dtype=torch.long)
    attention = torch.zeros((pairs, width), dtype=torch.long)
    for row, ids in enumerate(shared):
        input_ids[row, width - len(ids) :] = torch.as_tensor(ids)
        attention[row, width - len(ids) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    output = model(
        input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
    )
    first = torch.log_softmax(output.logits[:, -1].float(), dim=-1).repeat_interleave(k, dim=0)  # [pairs * k, V]
    rows = [t for pair in tails for t in pair]
    first_tokens = torch.tensor([t[0] for t in rows], device=device)
    scores = first.gather(1, first_tokens[:, None]).squeeze(1)
    longest = max(len(t) for t in rows)
    if longest > 1:  # teacher-force tokens 1.. of every tail on its pair's cache
        steps = longest - 1
        tail_ids = torch.full((len(rows), steps), pad, dtype=torch.long)
        targets = torch.zeros((len(rows), steps), dtype=torch.long)
        tail_mask = torch.zeros((len(rows), steps), dtype=torch.long)
        for row, tail in enumerate(rows):
            tail_ids[row, : len(tail) - 1] = torch.as_tensor(tail[:-1])
            targets[row, : len(tail) - 1] = torch.as_tensor(tail[1:])
            tail_mask[row, : len(tail) - 1] = 1
        tail_ids, targets, tail_mask = tail_ids.to(device), targets.to(device), tail_mask.to(device)
        cache = getattr(output, cache_argument(model))
        cache.batch_repeat_interleave(k)
        lengths = attention.sum(-1).repeat_interleave(k)
        logits = model(
            input_ids=tail_ids,
            attention_mask=torch.cat([attention.repeat_interleave(k, dim=0), tail_mask], dim=1),
            position_ids=lengths[:, None] + torch.arange(steps, device=device),
            use_cache=True,
            **{cache_argument(model): cache},
        ).logits
        token_logprobs = torch.log_softmax(logits.float(), dim=-1).gather(2, targets[..., None]).squeeze(2)
        scores = scores + torch.where(tail_mask.bool(), token_logprobs, 0.0).sum(-1)
    return scores.view(pairs, k).cpu()
