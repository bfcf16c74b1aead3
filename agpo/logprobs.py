"""Token log-probs of sampled responses under the training model, at the temperature each row was sampled at.

Rows are laid out as [left-padded prompt | right-padded response] (:func:`response_tensors`), so every
response starts at the same column; position ids come from the attention mask, as in generation. The
response mask is 1 on response tokens, and 0 on padding and, under ``mask_truncated``, on every token of
a response cut at max_new_tokens.

:func:`token_log_probs` takes log-probs and entropies on logits / temperature of each row, the
distribution the engine sampled from. The G responses of a prompt share it: each distinct prompt of a
micro-batch is run through the model once, with gradient, and its key/value cache feeds all its rows (a
GRPO batch is mostly prompt tokens; computing them G times is what a plain batched forward does).
"""

from __future__ import annotations

import torch

from agpo.losses import entropy_from_logits
from agpo.models import cache_argument
from agpo.rollout.base import FINISH_LENGTH
from agpo.rollout_batch import RolloutBatch


def response_tensors(
    batch: RolloutBatch, rows: slice, pad_token_id: int, mask_truncated: bool = False
) -> dict[str, torch.Tensor]:
    """[left-padded prompt | right-padded response] tensors of ``batch[rows]`` (one micro-batch).

    Keys: input_ids, attention [B, P + R]; mask, rollout_logprobs [B, R] (R >= 1, the rows' longest
    response); temperature [B]; prompt_rows (the first row of each distinct prompt) and prompt_of_row
    (each row's distinct prompt), which let :func:`token_log_probs` run each prompt once.
    """
    prompts, responses = batch.prompt_ids[rows], batch.response_ids[rows]
    p_width = max(len(p) for p in prompts)
    r_width = max(1, max(len(r) for r in responses))
    size = len(prompts)
    input_ids = torch.full((size, p_width + r_width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((size, p_width + r_width), dtype=torch.long)
    mask = torch.zeros((size, r_width))
    rollout_logprobs = torch.zeros((size, r_width))
    for i, (p, r, lp) in enumerate(zip(prompts, responses, batch.rollout_logprobs[rows], strict=True)):
        rollout_logprobs[i, : len(lp)] = torch.tensor(lp)
        input_ids[i, p_width - len(p) : p_width] = torch.tensor(p)
        input_ids[i, p_width : p_width + len(r)] = torch.tensor(r, dtype=torch.long)
        attention[i, p_width - len(p) : p_width + len(r)] = 1
        mask[i, : len(r)] = 1.0
    if mask_truncated:
        truncated = torch.tensor([f == FINISH_LENGTH for f in batch.finish_reasons[rows]])
        mask[truncated] = 0.0
    prompt_rows, prompt_of_row = _distinct_prompts(prompts)
    return {
        "input_ids": input_ids,
        "attention": attention,
        "mask": mask,
        "temperature": torch.tensor(batch.temperatures[rows]),
        "rollout_logprobs": rollout_logprobs,
        "prompt_rows": torch.tensor(prompt_rows),
        "prompt_of_row": torch.tensor(prompt_of_row),
    }


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


def token_log_probs(model: torch.nn.Module, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies [B, R] of the response tokens at each row's temperature (on CPU)."""
    r_width = t["mask"].shape[1]
    device = next(model.parameters()).device
    input_ids, attention = t["input_ids"].to(device), t["attention"].to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    prefix = input_ids.shape[1] - r_width - 1  # the prompt but its last token
    prompt_rows = t["prompt_rows"].to(device)
    if len(prompt_rows) == len(input_ids) or prefix < 1:
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, logits_to_keep=r_width + 1
        ).logits[:, :-1]
    else:
        # The G rows of a group share their prompt: each distinct prompt goes through the model once
        # (with gradient) and every row continues from its prompt's key/value cache.
        prompt_output = model(
            input_ids=input_ids[prompt_rows, :prefix],
            attention_mask=attention[prompt_rows, :prefix],
            position_ids=positions[prompt_rows, :prefix],
            use_cache=True,
        )
        cache = getattr(prompt_output, cache_argument(model))
        cache.batch_select_indices(t["prompt_of_row"].to(device))
        logits = model(
            input_ids=input_ids[:, prefix:],
            attention_mask=attention,
            position_ids=positions[:, prefix:],
            **{cache_argument(model): cache},
        ).logits[:, :-1]
    logits = logits.float() / t["temperature"].to(device)[:, None, None]
    targets = t["input_ids"][:, -r_width:].to(device)
    log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    return log_probs.cpu(), entropy_from_logits(logits).cpu()
