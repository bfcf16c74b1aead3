import pytest
import torch

from agpo import logprobs
from agpo.logprobs import length_chunks, response_tensors, token_log_probs
from agpo.losses import entropy_from_logits
from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP
from agpo.step_interfaces import RolloutBatch

PROMPTS = ["<query>red nike running shoes</query>\n<ad>", "<query>black phone case</query>\n", "a"]
LENGTHS = [2, 7, 3, 6, 1, 4, 6, 6, 2, 0, 4, 5]  # 3 groups of 4 rows; 6 = max_new_tokens (truncated)
TEMPERATURES = [1.0, 0.7, 1.3]


def uneven_batch(tokenizer) -> RolloutBatch:
    """12 rows, 3 prompts of different lengths, uneven responses (one empty), a temperature per group."""
    generator = torch.Generator().manual_seed(0)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    return RolloutBatch(
        prompt_ids=[prompts[i // 4] for i in range(12)],
        response_ids=[torch.randint(0, 320, (n,), generator=generator).tolist() for n in LENGTHS],
        rewards=[0.0] * 12,
        group_ids=[i // 4 for i in range(12)],
        temperatures=[TEMPERATURES[i // 4] for i in range(12)],
        finish_reasons=[FINISH_LENGTH if n == 6 else FINISH_STOP for n in LENGTHS],
        answers=[None] * 12,
        rollout_logprobs=[torch.rand(n, generator=generator).tolist() for n in LENGTHS],
    )


@pytest.mark.parametrize("overhead", [0, 3, 10**6])
def test_length_chunks_cover_every_row_once_at_its_chunks_longest_length(overhead):
    chunks = length_chunks(LENGTHS, overhead)
    assert sorted(row for rows, _ in chunks for row in rows) == list(range(len(LENGTHS)))
    for rows, width in chunks:
        assert width == max(1, max(LENGTHS[r] for r in rows))
    widths = [w for _, w in chunks]
    assert widths == sorted(widths, reverse=True)
    if overhead == 0:  # nothing to save by merging: one chunk per distinct length (0 runs as 1)
        assert widths == [7, 6, 5, 4, 3, 2, 1]
    if overhead == 10**6:
        assert widths == [7]


def test_length_chunks_minimise_computed_tokens():
    # [9, 9, 1 x 8]: one chunk computes 90 tokens, two compute 18 + 8 + overhead
    assert [w for _, w in length_chunks([9, 9] + [1] * 8, overhead=10)] == [9, 1]
    assert [w for _, w in length_chunks([9, 9] + [1] * 8, overhead=100)] == [9]


def test_response_tensors_lay_rows_out_prompt_left_padded_response_right_padded(tiny_tokenizer):
    batch = uneven_batch(tiny_tokenizer)
    t = response_tensors(batch, slice(0, 12), pad_token_id=0, mask_truncated=True)
    p_width, r_width = max(len(p) for p in batch.prompt_ids), max(LENGTHS)
    assert t["input_ids"].shape == (12, p_width + r_width) and t["mask"].shape == (12, r_width)
    for i, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        row, attention = t["input_ids"][i], t["attention"][i]
        assert row[p_width - len(p) : p_width].tolist() == p and row[p_width : p_width + len(r)].tolist() == r
        assert attention.tolist() == [0] * (p_width - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_width - len(r))
        assert t["rollout_logprobs"][i, : len(r)].tolist() == pytest.approx(batch.rollout_logprobs[i])
        assert t["mask"][i].sum() == (0 if len(r) == 6 else len(r))  # truncated rows masked
    assert t["lengths"].tolist() == LENGTHS
    assert t["prompt_rows"].tolist() == [0, 4, 8] and t["prompt_of_row"].tolist() == [i // 4 for i in range(12)]


@pytest.mark.parametrize("share_prompts", [True, False])
@pytest.mark.parametrize("chunk_by_length", [True, False])
def test_token_log_probs_equal_a_plain_forward_per_row_and_their_gradients(
    tiny_model, tiny_tokenizer, share_prompts, chunk_by_length
):
    """Shared prompt cache, length chunks (or one pass), the unfed last token and one log_softmax give, on
    every response token, the log-prob and entropy of a forward pass over that row alone, and the same
    gradients."""
    batch = uneven_batch(tiny_tokenizer)
    t = response_tensors(batch, slice(0, 12), pad_token_id=0)
    if not share_prompts:
        t = {**t, "prompt_rows": torch.arange(12), "prompt_of_row": torch.arange(12)}
    mask = t["mask"].bool()

    def gradient(log_prob: torch.Tensor, entropy: torch.Tensor) -> list[torch.Tensor]:
        tiny_model.zero_grad()
        ((log_prob + 0.3 * entropy) * t["mask"]).sum().backward()
        return [p.grad.clone() for p in tiny_model.parameters()]

    log_prob, entropy = token_log_probs(tiny_model, t, chunk_by_length=chunk_by_length)
    got = gradient(log_prob, entropy)
    want_lp, want_h = torch.zeros_like(log_prob), torch.zeros_like(entropy)
    for i, (p, r) in enumerate(zip(batch.prompt_ids, batch.response_ids, strict=True)):
        logits = tiny_model(input_ids=torch.tensor([p + r])).logits[0, len(p) - 1 : -1] / batch.temperatures[i]
        want_lp[i, : len(r)] = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r)[:, None]).squeeze(-1)
        want_h[i, : len(r)] = entropy_from_logits(logits)
    want = gradient(want_lp, want_h)
    assert torch.allclose(log_prob[mask], want_lp[mask], atol=1e-6)
    assert torch.allclose(entropy[mask], want_h[mask], atol=1e-6)
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("share_prompts", [True, False])
def test_several_length_chunks_give_the_one_pass_log_probs_entropies_and_gradients(
    tiny_model, tiny_tokenizer, monkeypatch, share_prompts
):
    """With no per-chunk overhead the 12 uneven rows run as 7 chunks (one per distinct length), each its own
    forward pass continuing the shared prompt cache; log-probs, entropies and gradients equal one pass over all
    rows. (At CHUNK_OVERHEAD_TOKENS every test batch is one chunk, so this path is forced here.)"""
    batch = uneven_batch(tiny_tokenizer)
    t = response_tensors(batch, slice(0, 12), pad_token_id=0)
    if not share_prompts:
        t = {**t, "prompt_rows": torch.arange(12), "prompt_of_row": torch.arange(12)}
    mask = t["mask"].bool()
    chunk_counts = []

    def no_overhead_chunks(lengths):
        chunks = length_chunks(lengths, overhead=0)
        chunk_counts.append(len(chunks))
        return chunks

    monkeypatch.setattr(logprobs, "length_chunks", no_overhead_chunks)
    results = []
    for chunk_by_length in (True, False):
        tiny_model.zero_grad()
        log_prob, entropy = token_log_probs(tiny_model, t, chunk_by_length=chunk_by_length)
        ((log_prob + 0.3 * entropy) * t["mask"]).sum().backward()
        results.append((log_prob.detach(), entropy.detach(), [p.grad.clone() for p in tiny_model.parameters()]))
    assert chunk_counts == [7]  # the chunked call cut the rows into 7 passes; the other ran one
    (chunked_lp, chunked_h, chunked_g), (one_lp, one_h, one_g) = results
    torch.testing.assert_close(chunked_lp[mask], one_lp[mask], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(chunked_h[mask], one_h[mask], atol=1e-6, rtol=1e-5)
    for got, want in zip(chunked_g, one_g, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
