"""The hf rollout engine: batching never changes results, log-probs match a forward pass, order is kept."""

import pytest
import torch

from agpo.rollout import FINISH_LENGTH, FINISH_STOP, HFRolloutEngine
from agpo.rollout.base import per_prompt_temperatures


def greedy_alone(model, tokenizer, ids, max_new_tokens):
    out = model.generate(
        input_ids=torch.tensor([ids]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    tokens = out[0, len(ids) :].tolist()
    eos = tokenizer.eos_token_id
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def test_batched_left_padded_greedy_equals_one_prompt_at_a_time(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer, max_batch_rows=2)  # forces two buckets
    rollout = engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=8, greedy=True)
    assert rollout.prompt_index == [0, 1, 2]
    for i, ids in enumerate(prompt_ids):
        assert rollout.token_ids[i] == greedy_alone(tiny_model, tiny_tokenizer, ids, 8)


def test_logprobs_match_a_forward_pass_at_the_row_temperature(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    temps = [0.7, 1.0, 1.3]
    rollout = engine.generate(prompt_ids, n=3, temperatures=temps, max_new_tokens=6, seed=1)
    assert len(rollout) == 9 and rollout.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for row, (p, tokens, lps) in enumerate(zip(rollout.prompt_index, rollout.token_ids, rollout.logprobs, strict=True)):
        ids = torch.tensor([prompt_ids[p] + tokens])
        with torch.no_grad():
            logits = tiny_model(input_ids=ids).logits[0, len(prompt_ids[p]) - 1 : -1] / temps[p]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(lps), expected, atol=1e-4), f"row {row}"


def test_sampling_is_seeded_and_texts_and_finish_reasons_are_consistent(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    a = engine.generate(prompt_ids, n=4, temperatures=1.0, max_new_tokens=5, seed=7)
    b = engine.generate(prompt_ids, n=4, temperatures=1.0, max_new_tokens=5, seed=7)
    assert a.token_ids == b.token_ids
    eos = tiny_tokenizer.eos_token_id
    for tokens, text, reason in zip(a.token_ids, a.texts, a.finish_reasons, strict=True):
        assert reason == (FINISH_STOP if tokens[-1] == eos else FINISH_LENGTH)
        assert reason == FINISH_STOP or len(tokens) == 5
        assert text == tiny_tokenizer.decode([t for t in tokens if t != eos])
    assert a.num_tokens == sum(len(t) for t in a.token_ids)


def test_a_prompts_samples_do_not_depend_on_the_rest_of_the_batch(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    together = engine.generate(prompt_ids, n=3, temperatures=[0.8, 1.0, 1.2], max_new_tokens=6, seed=[11, 12, 13])
    for i, ids in enumerate(prompt_ids):  # alone, and in a bucket of its own size
        alone = engine.generate([ids], n=3, temperatures=[0.8, 1.0, 1.2][i], max_new_tokens=6, seed=[11 + i])
        assert alone.token_ids == together.token_ids[3 * i : 3 * i + 3]
        assert torch.allclose(torch.tensor(alone.logprobs[0]), torch.tensor(together.logprobs[3 * i]), atol=1e-5)
    other_seed = engine.generate(prompt_ids, n=3, temperatures=1.0, max_new_tokens=6, seed=[99, 12, 13])
    assert other_seed.token_ids[:3] != together.token_ids[:3]


def test_seeded_samples_follow_the_softmax(tiny_model, tiny_tokenizer):
    """First-token frequencies over 4,000 seeded rows match softmax(logits / T) (Gumbel-max is exact)."""
    ids = tiny_tokenizer("<query>red shoes</query>\n<ad>", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(tiny_model(input_ids=torch.tensor([ids])).logits[0, -1] / 2.0, -1)
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    rollout = engine.generate([ids], n=4000, temperatures=2.0, max_new_tokens=1, seed=5)
    counts = torch.bincount(torch.tensor([t[0] for t in rollout.token_ids]), minlength=len(probs)).float()
    top = probs.argsort(descending=True)[:5]
    # binomial standard error at n=4000 is <= 0.008; 4 sigma
    assert torch.allclose(counts[top] / 4000, probs[top], atol=0.032)
    assert abs(float((counts / 4000 - probs).abs().sum()) / 2) < 0.2  # total variation on all tokens


def test_near_zero_temperature_sampling_is_greedy(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    greedy = engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=6, greedy=True)
    cold = engine.generate(prompt_ids, n=2, temperatures=[1e-4] * 3, max_new_tokens=6, seed=3)
    assert cold.token_ids[::2] == greedy.token_ids and cold.token_ids[1::2] == greedy.token_ids


def test_sync_weights_changes_what_is_generated(tiny_model, tiny_tokenizer, prompt_ids):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    before = engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=6, greedy=True).token_ids
    with torch.no_grad():
        for param in tiny_model.parameters():  # an optimizer step, exaggerated
            param.add_(torch.randn_like(param))
    engine.sync_weights(tiny_model)
    after = engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=6, greedy=True).token_ids
    assert after != before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n and max_new_tokens must be >= 1"),
        ({"max_new_tokens": 0}, "n and max_new_tokens must be >= 1"),
        ({"temperatures": [1.0]}, "one temperature per prompt: 3 prompts, 1 temperatures"),
        ({"temperatures": 0.0}, "temperatures must be > 0"),
    ],
)
def test_bad_arguments(tiny_model, tiny_tokenizer, prompt_ids, kwargs, message):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    args = {"n": 1, "temperatures": 1.0, "max_new_tokens": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt_ids, **args)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], n=1, temperatures=1.0, max_new_tokens=1)


def test_per_prompt_temperatures():
    assert per_prompt_temperatures(0.5, 2) == [0.5, 0.5]
    assert per_prompt_temperatures([0.5, 2], 2) == [0.5, 2.0]
