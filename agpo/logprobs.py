"""Token log-probs of sampled responses under the training model, at the temperature each row was sampled at.

Rows are laid out as [left-padded prompt | right-padded response] (:func:`response_tensors`), so every
response starts at the same column; position ids come from the attention mask, as in generation. The
response mask is 1 on response tokens, and 0 on padding and, under ``dapo.mask_truncated``, on every token of
a response cut at max_new_tokens.

:func:`token_log_probs` takes log-probs and entropies on logits / temperature of each row, the
distribution the engine sampled from, without computing what no token needs:

- the G responses of a prompt share it: each distinct prompt of a micro-batch is run through the model
  once, with gradient, and its key/value cache feeds all its rows (a GRPO batch is mostly prompt tokens;
  computing them G times is what a plain batched forward does);
- responses are not run over their padding: the rows, sorted by response length, are cut into chunks
  (:func:`length_chunks`) and each chunk is run only up to its longest response, so a batch of short and
  long responses costs about its real tokens rather than rows x the longest one;
- a response's last token predicts nothing that is kept, so it is not fed to the model;
- log_softmax runs once per position; the chosen token's log-prob is gathered from it and the entropy
  -sum(p log p) is taken from the same values.

Every row's numbers are those of a plain forward over its full [prompt | response] (up to float rounding);
positions past a row's response hold values of no meaning (they are masked everywhere).
"""

from __future__ import annotations

import collections
import copy
import itertools

import torch
import torch.nn.functional as F

from agpo.losses import entropy_from_log_probs
from agpo.models import cache_argument
from agpo.rollout.base import FINISH_LENGTH
from agpo.step_interfaces import RolloutBatch

# One more chunk (a forward and a backward pass more) costs about as much as this many padded response
# tokens: measured on the benchmarks' tiny model on CPU, where per-pass overhead weighs most.
CHUNK_OVERHEAD_TOKENS = 64


def response_tensors(
    batch: RolloutBatch, rows: slice, pad_token_id: int, mask_truncated: bool = False
) -> dict[str, torch.Tensor]:
    """[left-padded prompt | right-padded response] tensors of ``batch[rows]`` (one micro-batch).

    Keys: input_ids, attention [B, P + R]; mask, rollout_logprobs [B, R] (R >= 1, the rows' longest
    response); temperature, lengths (each response's token count) [B]; prompt_rows (the first row of each
    distinct prompt) and prompt_of_row (each row's distinct prompt), which let :func:`token_log_probs` run
    each prompt once. Built from the flattened token lists with boolean masks, not row by row.
    """
    prompts, responses = batch.prompt_ids[rows], batch.response_ids[rows]
    engine_logprobs = batch.rollout_logprobs[rows]
    p_len = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    r_len = torch.tensor([len(r) for r in responses], dtype=torch.long)
    p_width, r_width = int(p_len.max()), max(1, int(r_len.max()))
    columns = torch.arange(p_width + r_width)
    in_prompt = (columns >= p_width - p_len[:, None]) & (columns < p_width)
    in_response = (columns >= p_width) & (columns < p_width + r_len[:, None])
    input_ids = torch.full(in_prompt.shape, pad_token_id, dtype=torch.long)
    input_ids[in_prompt] = _flat(prompts, torch.long)
    input_ids[in_response] = _flat(responses, torch.long)
    mask = in_response[:, p_width:].float()
    rollout_logprobs = torch.zeros(mask.shape)
    lp_len = torch.tensor([len(lp) for lp in engine_logprobs], dtype=torch.long)
    rollout_logprobs[columns[:r_width] < lp_len[:, None]] = _flat(engine_logprobs, torch.float)
    if mask_truncated:
        truncated = torch.tensor([f == FINISH_LENGTH for f in batch.finish_reasons[rows]])
        mask[truncated] = 0.0
    prompt_rows, prompt_of_row = _distinct_prompts(prompts)
    return {
        "input_ids": input_ids,
        "attention": (in_prompt | in_response).long(),
        "mask": mask,
        "temperature": torch.tensor(batch.temperatures[rows]),
        "lengths": r_len,
        "rollout_logprobs": rollout_logprobs,
        "prompt_rows": torch.tensor(prompt_rows),
        "prompt_of_row": torch.tensor(prompt_of_row),
    }


def _flat(rows: list[list[int]] | list[list[float]], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=dtype)


def _distinct_prompts(prompts: list[list[int]]) -> tuple[list[int], list[int]]:
    """The first row of each distinct prompt, and the index of each row's prompt among them."""
    distinct: dict[tuple[int, ...], int] = {}
    first_row_of_prompt, prompt_of_row = [], []
    for row, p in enumerate(prompts):
        if tuple(p) not in distinct:
            distinct[tuple(p)] = len(distinct)
            first_row_of_prompt.append(row)
        prompt_of_row.append(distinct[tuple(p)])
    return first_row_of_prompt, prompt_of_row


def length_chunks(lengths: list[int], overhead: int = CHUNK_OVERHEAD_TOKENS) -> list[tuple[list[int], int]]:
    """Rows cut into chunks run one forward pass each: (rows, width) with width the chunk's longest length.

    The rows, sorted longest first, are cut into consecutive runs minimising the tokens computed,
    sum(rows x width) + ``overhead`` per chunk, by dynamic programming over the distinct lengths (a cut
    inside a run of equal lengths never pays). Lengths below 1 count as 1 (every pass needs a token).
    """
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    counts = collections.Counter(max(1, n) for n in lengths)
    widths = sorted(counts, reverse=True)
    rows_before = [0, *itertools.accumulate(counts[w] for w in widths)]  # [k]: rows at least widths[k - 1] long
    best, cut = [0.0] + [float("inf")] * len(widths), [0] * (len(widths) + 1)
    for end in range(1, len(widths) + 1):
        for begin in range(end):
            cost = best[begin] + (rows_before[end] - rows_before[begin]) * widths[begin] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    chunks, end = [], len(widths)
    while end:
        begin = cut[end]
        chunks.append((order[rows_before[begin] : rows_before[end]], widths[begin]))
        end = begin
    return chunks[::-1]


def token_log_probs(
    model: torch.nn.Module, t: dict[str, torch.Tensor], *, chunk_by_length: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies [B, R] of the response tokens at each row's temperature (on CPU).

    ``chunk_by_length=False`` runs all rows in one pass at the longest length: the number of passes is then
    the same on every data-parallel rank, which ZeRO-3 needs (it gathers the parameters in every pass).
    """
    size, r_width = t["mask"].shape
    device = next(model.parameters()).device
    input_ids, attention = t["input_ids"].to(device), t["attention"].to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    temperature = t["temperature"].to(device)
    prefix = input_ids.shape[1] - r_width - 1  # the prompt but its last token
    prompt_rows, prompt_of_row = t["prompt_rows"].to(device), t["prompt_of_row"].to(device)
    shared = len(prompt_rows) < size and prefix >= 1
    prompt_cache = None
    if shared:  # each distinct prompt once (with gradient); its rows continue from its key/value cache
        prompt_output = model(
            input_ids=input_ids[prompt_rows, :prefix],
            attention_mask=attention[prompt_rows, :prefix],
            position_ids=positions[prompt_rows, :prefix],
            use_cache=True,
        )
        prompt_cache = getattr(prompt_output, cache_argument(model))
    start = prefix if shared else 0
    log_probs, entropies, order = [], [], []
    lengths = t["lengths"].tolist()
    chunks = length_chunks(lengths) if chunk_by_length else [(list(range(size)), max(1, *lengths))]
    for rows, width in chunks:
        index = torch.tensor(rows, device=device)
        end = prefix + width  # the last prompt token and the response but its last token
        cache = {cache_argument(model): _cache_rows(prompt_cache, prompt_of_row[index])} if shared else {}
        logits = model(
            input_ids=input_ids[index, start:end],
            attention_mask=attention[index, :end],
            position_ids=positions[index, start:end],
            logits_to_keep=width,
            **cache,
        ).logits
        all_log_probs = torch.log_softmax(logits.float() / temperature[index, None, None], dim=-1)
        chosen = all_log_probs.gather(-1, input_ids[index, prefix + 1 : end + 1, None]).squeeze(-1)
        log_probs.append(F.pad(chosen, (0, r_width - width)))
        entropies.append(F.pad(entropy_from_log_probs(all_log_probs), (0, r_width - width)))
        order.extend(rows)
    inverse = torch.empty(size, dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(size, device=device)
    return torch.cat(log_probs)[inverse].cpu(), torch.cat(entropies)[inverse].cpu()


def _cache_rows(cache, prompt_of_row: torch.Tensor):
    """A cache holding, for each row, its prompt's keys and values (``cache`` itself is left as it is)."""
    rows = copy.copy(cache)
    rows.layers = [copy.copy(layer) for layer in cache.layers]
    rows.batch_select_indices(prompt_of_row)
    return rows
