"""The hf engine's decode loop: greedy equals transformers ``generate`` on left-padded prompts, samples replay
each row's own generator draws, log-probs equal a full forward's, stops end rows, and rows leaving the
batch change nothing for the others."""

import torch

from agpo.rollout import FINISH_LENGTH, FINISH_STOP, HFRolloutEngine
from agpo.rollout.base import row_seed
from agpo.rollout.decode import RowSampling, decode, left_pad


def run_decode(model, tokenizer, prompt_ids, n, temps, seeds, max_new_tokens, eos):
    """(tokens, logprobs) per row, cut at each row's length."""
    input_ids, attention = left_pad(prompt_ids, tokenizer.pad_token_id)
    sampling = RowSampling(torch.tensor(temps).repeat_interleave(n), seeds)
    return decode(model, input_ids, attention, n, sampling, max_new_tokens, eos, tokenizer.pad_token_id).rows()


def generate_greedy(model, tokenizer, prompt_ids, max_new_tokens, eos):
    input_ids, attention = left_pad(prompt_ids, tokenizer.pad_token_id)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos,
    )[:, input_ids.shape[1] :].tolist()
    return [row[: row.index(eos) + 1] if eos in row else row for row in out]


def frequent_token(model, tokenizer, prompt_ids):
    """A token greedy decoding emits early: used as the stop token, so that rows stop at different steps."""
    return generate_greedy(model, tokenizer, prompt_ids, 3, tokenizer.eos_token_id)[0][1]


def test_greedy_equals_generate_token_for_token_on_left_padded_prompts(tiny_model, tiny_tokenizer, prompt_ids):
    assert len({len(p) for p in prompt_ids}) == 3
    for eos in (tiny_tokenizer.eos_token_id, frequent_token(tiny_model, tiny_tokenizer, prompt_ids)):
        expected = generate_greedy(tiny_model, tiny_tokenizer, prompt_ids, 10, eos)
        tokens, _ = run_decode(tiny_model, tiny_tokenizer, prompt_ids, 2, [1.0] * 3, None, 10, eos)
        assert tokens[::2] == expected and tokens[1::2] == expected
    assert {len(t) for t in expected} != {10}  # with the frequent stop token some rows stopped early
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    rollout = engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=10, greedy=True)
    assert rollout.token_ids == generate_greedy(tiny_model, tiny_tokenizer, prompt_ids, 10, tiny_tokenizer.eos_token_id)


def test_samples_replay_each_rows_exponential_race_and_logprobs_match_a_full_forward(
    tiny_model, tiny_tokenizer, prompt_ids
):
    """Token k of row (prompt p, sample j) is argmax(log_softmax(logits / T) - log E_k), E_k the k-th
    ``exponential_`` draw of a generator seeded row_seed(seed_p, j): the draws the engine has always made."""
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    temps, seeds, n = [0.7, 1.0, 1.3], [21, 22, 23], 3
    rollout = engine.generate(prompt_ids, n=n, temperatures=temps, max_new_tokens=6, seed=seeds)
    for row, (p, tokens, lps) in enumerate(zip(rollout.prompt_index, rollout.token_ids, rollout.logprobs, strict=True)):
        with torch.no_grad():
            logits = tiny_model(input_ids=torch.tensor([prompt_ids[p] + tokens])).logits[0, len(prompt_ids[p]) - 1 : -1]
        logp = torch.log_softmax(logits / temps[p], -1)
        generator = torch.Generator().manual_seed(row_seed(seeds[p], row % n))
        races = torch.stack([torch.empty(logp.shape[1]).exponential_(generator=generator) for _ in tokens])
        assert (logp - races.log()).argmax(-1).tolist() == tokens, f"row {row}"
        expected = logp.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), expected, atol=1e-5), f"row {row}"


def test_stop_tokens_end_rows_and_set_finish_reasons(tiny_model, tiny_tokenizer, prompt_ids):
    eos = frequent_token(tiny_model, tiny_tokenizer, prompt_ids)
    seeds = [row_seed(5, j) for j in range(24)]
    tokens, logprobs = run_decode(tiny_model, tiny_tokenizer, prompt_ids, 8, [0.3] * 3, seeds, 7, eos)
    stopped = [t for t in tokens if t[-1] == eos]
    assert stopped and len(stopped) < len(tokens)  # some rows stop, some run to the budget
    for row, lps in zip(tokens, logprobs, strict=True):
        assert len(row) == len(lps) and 1 <= len(row) <= 7
        assert eos not in row[:-1]  # nothing after a stop
        assert row[-1] == eos or len(row) == 7
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    rollout = engine.generate(prompt_ids, n=4, temperatures=1.0, max_new_tokens=1, seed=0)
    assert set(rollout.finish_reasons) <= {FINISH_STOP, FINISH_LENGTH} and all(len(t) == 1 for t in rollout.token_ids)


def test_rows_leaving_the_batch_change_nothing_for_the_others(tiny_model, tiny_tokenizer, prompt_ids):
    eos = frequent_token(tiny_model, tiny_tokenizer, prompt_ids)
    n, temps = 4, [0.3, 0.5, 0.4]
    seeds = [row_seed(9, j) for j in range(3 * n)]
    together, together_lps = run_decode(tiny_model, tiny_tokenizer, prompt_ids, n, temps, seeds, 8, eos)
    assert len({len(t) for t in together}) > 1  # rows left the batch at different steps
    for row in range(3 * n):
        p = row // n
        alone, alone_lps = run_decode(tiny_model, tiny_tokenizer, [prompt_ids[p]], 1, [temps[p]], [seeds[row]], 8, eos)
        assert alone[0] == together[row], f"row {row}"
        assert torch.allclose(torch.tensor(alone_lps[0]), torch.tensor(together_lps[row]), atol=1e-5)
