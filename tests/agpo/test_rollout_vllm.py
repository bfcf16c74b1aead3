"""The vllm rollout engine against the hf engine and a forward pass, on one tiny Qwen2 (runs in .venv-vllm).

One vLLM engine serves the whole module (start-up costs seconds). The model is a 2-layer Qwen2 (hidden 128)
given a short supervised warm-up on the tiny corpus, so greedy outputs vary across prompts and some stop
on EOS; a random-init model with tied embeddings just repeats the last prompt token.
"""

import copy

import pytest
import torch

pytest.importorskip("vllm")

from agpo.models import TinyModelConfig, build_tiny_qwen2, save_model
from agpo.rollout import FINISH_LENGTH, FINISH_STOP, HFRolloutEngine
from agpo.rollout.factory import build_engine
from agpo.rollout.vllm import VLLMRolloutEngine

pytestmark = pytest.mark.vllm

TEXTS = [
    "<query>red shoes</query>\n<ad>",
    "<query>black phone case</query>\n<ad>otterbox phone case</ad>\n",
    "a",
    " same category, all",
    "价格 耐克",
]
WARM_UP = [  # the tiny corpus of conftest.py
    "<query>red nike running shoes</query>\n<ad>nike running shoes, red, mesh, size 42</ad>\n",
    "<query>black phone case</query>\n<ad>otterbox phone case, black, plastic</ad>\n",
    " same category, all named attributes match <answer>3</answer>",
    " different category <answer>0</answer>",
    "价格 耐克 跑鞋 红色",
]
STARTUP: dict[str, bool] = {}
LOGPROB_ATOL = 1e-3  # max |vLLM - forward pass| per token (measured: about 1e-6 in fp32)


def warm_up(model, tokenizer, texts, steps, lr):
    """``steps`` AdamW steps of next-token cross-entropy on ``texts`` (each followed by EOS)."""
    batch = tokenizer(
        [t + tokenizer.eos_token for t in texts], add_special_tokens=False, padding=True, return_tensors="pt"
    )
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    torch.manual_seed(0)
    config = TinyModelConfig(vocab_size=320, hidden_size=128, num_layers=2, intermediate_size=256)
    return warm_up(build_tiny_qwen2(tiny_tokenizer, config), tiny_tokenizer, WARM_UP, steps=20, lr=3e-3)


@pytest.fixture(scope="module")
def engine(model, tiny_tokenizer, tmp_path_factory):
    model_dir = save_model(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-qwen2"))
    torch.manual_seed(123)
    rng_before = torch.random.get_rng_state()
    engine = VLLMRolloutEngine(model_dir, tiny_tokenizer, kv_cache_gib=1)
    STARTUP["rng_untouched"] = torch.equal(torch.random.get_rng_state(), rng_before)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def prompts(tiny_tokenizer):
    return [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def forward_logprobs(model, prompt, tokens, temperature):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("n", [1, 2])
def test_greedy_tokens_equal_hf(engine, model, tiny_tokenizer, prompts, n):
    expected = HFRolloutEngine(model, tiny_tokenizer).generate(
        prompts, n=n, temperatures=1.0, max_new_tokens=12, greedy=True
    )
    got = engine.generate(prompts, n=n, temperatures=1.0, max_new_tokens=12, greedy=True)
    assert got.prompt_index == expected.prompt_index == [i for i in range(len(prompts)) for _ in range(n)]
    assert got.token_ids == expected.token_ids
    assert got.texts == expected.texts
    assert got.finish_reasons == expected.finish_reasons
    assert {FINISH_STOP, FINISH_LENGTH} <= set(got.finish_reasons)  # the warm-up taught some prompts to stop
    for a, b in zip(got.logprobs, expected.logprobs, strict=True):  # at T = 1 both give log_softmax(logits)
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=LOGPROB_ATOL)


def test_sync_weights_makes_vllm_follow_an_optimizer_step(engine, model, tiny_tokenizer, prompts):
    args = {"n": 1, "temperatures": 1.0, "max_new_tokens": 12, "greedy": True}
    before = engine.generate(prompts, **args).token_ids
    updated = warm_up(copy.deepcopy(model), tiny_tokenizer, ["different category <answer>0</answer>"], steps=1, lr=1e-2)
    hf_after = HFRolloutEngine(updated, tiny_tokenizer).generate(prompts, **args).token_ids
    assert hf_after != before  # the step changes greedy outputs
    assert engine.generate(prompts, **args).token_ids == before  # nothing moves until sync_weights
    try:
        engine.sync_weights(updated)
        assert engine.generate(prompts, **args).token_ids == hf_after
    finally:
        engine.sync_weights(model)  # the module's other tests use the original weights
    assert engine.generate(prompts, **args).token_ids == before


def test_sampled_logprobs_match_a_forward_pass_at_each_prompt_temperature(engine, model, prompts):
    temps = [0.7, 1.0, 1.3, 2.0, 0.5]
    rollout = engine.generate(prompts, n=3, temperatures=temps, max_new_tokens=10, seed=1)
    assert rollout.prompt_index == [i for i in range(len(prompts)) for _ in range(3)]
    diffs = []
    for row, (p, tokens, lps) in enumerate(zip(rollout.prompt_index, rollout.token_ids, rollout.logprobs, strict=True)):
        assert len(lps) == len(tokens) >= 1
        expected = forward_logprobs(model, prompts[p], tokens, temps[p])
        diffs.append((torch.tensor(lps) - expected).abs())
        assert diffs[-1].max() < LOGPROB_ATOL, f"row {row}"
        if temps[p] != 1.0:  # the prompt's own temperature was used, not 1
            assert (torch.tensor(lps) - forward_logprobs(model, prompts[p], tokens, 1.0)).abs().max() > 1e-2
    assert float(torch.cat(diffs).mean()) < LOGPROB_ATOL / 10


def test_seeds_make_samples_reproducible_and_batch_independent(engine, prompts):
    temps = [0.8, 1.0, 1.2, 1.5, 0.9]
    a = engine.generate(prompts, n=3, temperatures=temps, max_new_tokens=8, seed=7)
    b = engine.generate(prompts, n=3, temperatures=temps, max_new_tokens=8, seed=7)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert engine.generate(prompts, n=3, temperatures=temps, max_new_tokens=8, seed=8).token_ids != a.token_ids
    assert len({tuple(t) for t in a.token_ids}) > len(prompts)  # the n samples of a prompt differ
    seeds = [11, 12, 13, 14, 15]
    together = engine.generate(prompts, n=3, temperatures=temps, max_new_tokens=8, seed=seeds)
    for i, ids in enumerate(prompts):
        alone = engine.generate([ids], n=3, temperatures=temps[i], max_new_tokens=8, seed=[seeds[i]])
        assert alone.token_ids == together.token_ids[3 * i : 3 * i + 3]
        for x, y in zip(alone.logprobs, together.logprobs[3 * i : 3 * i + 3], strict=True):
            assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=1e-5)
    # an int seed is the per-prompt seeds of per_prompt_seeds
    as_list = engine.generate(
        prompts, n=3, temperatures=temps, max_new_tokens=8, seed=[7 * 1_000_003 + i for i in range(5)]
    )
    assert as_list.token_ids == a.token_ids


def test_batches_larger_than_one_scheduler_step_stay_seeded_and_batch_independent(engine, prompts):
    """More prompt tokens than vLLM schedules per step (4096): prefills must not be chunked (see vllm.py)."""
    seeds = [21, 22, 23, 24, 25]
    big = engine.generate(prompts, n=200, temperatures=1.0, max_new_tokens=2, seed=seeds)
    assert sum(len(p) for p in prompts) * 200 > 4096
    alone = engine.generate([prompts[1]], n=200, temperatures=1.0, max_new_tokens=2, seed=[seeds[1]])
    assert alone.token_ids == big.token_ids[200:400]


def test_unseeded_sampling_follows_torch_global_seed(engine, prompts):
    torch.manual_seed(3)
    a = engine.generate(prompts, n=2, temperatures=1.0, max_new_tokens=6).token_ids
    torch.manual_seed(3)
    assert engine.generate(prompts, n=2, temperatures=1.0, max_new_tokens=6).token_ids == a


def test_seeded_samples_follow_the_softmax(engine, model, tiny_tokenizer):
    """First-token frequencies over 2,000 seeded rows match softmax(logits / T)."""
    ids = tiny_tokenizer("<query>red shoes</query>\n<ad>", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1] / 2.0, -1)
    rollout = engine.generate([ids], n=2000, temperatures=2.0, max_new_tokens=1, seed=5)
    counts = torch.bincount(torch.tensor([t[0] for t in rollout.token_ids]), minlength=len(probs)).float()
    top = probs.argsort(descending=True)[:5]
    assert torch.allclose(counts[top] / 2000, probs[top], atol=0.045)  # binomial s.e. <= 0.0112; 4 sigma
    assert float((counts / 2000 - probs).abs().sum()) / 2 < 0.25  # total variation on all tokens


def test_finish_reasons_eos_and_texts(engine, tiny_tokenizer, prompts):
    eos = tiny_tokenizer.eos_token_id
    rollout = engine.generate(prompts, n=4, temperatures=1.0, max_new_tokens=6, seed=2)
    greedy = engine.generate(prompts, n=1, temperatures=1.0, max_new_tokens=30, greedy=True)
    for r in (rollout, greedy):
        for tokens, text, reason in zip(r.token_ids, r.texts, r.finish_reasons, strict=True):
            assert eos not in tokens[:-1]  # generation stops at the first EOS, which is kept
            assert reason == (FINISH_STOP if tokens[-1] == eos else FINISH_LENGTH)
            assert reason == FINISH_STOP or len(tokens) in (6, 30)
            assert text == tiny_tokenizer.decode([t for t in tokens if t != eos], skip_special_tokens=True)
        assert r.num_tokens == sum(len(t) for t in r.token_ids)
    assert FINISH_STOP in greedy.finish_reasons
    one = engine.generate(prompts, n=1, temperatures=1.0, max_new_tokens=1, seed=0)
    assert all(len(t) == 1 for t in one.token_ids)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 0}, "n and max_new_tokens must be >= 1"),
        ({"max_new_tokens": 0}, "n and max_new_tokens must be >= 1"),
        ({"temperatures": [1.0]}, "one temperature per prompt: 5 prompts, 1 temperatures"),
        ({"temperatures": 0.0}, "temperatures must be > 0"),
        ({"temperatures": 0.005}, "below 0.01"),
        ({"seed": [1, 2]}, "one seed per prompt: 5 prompts, 2 seeds"),
        ({"max_new_tokens": 10_000}, "exceeds the engine's max_model_len"),
    ],
)
def test_bad_arguments(engine, prompts, kwargs, message):
    args = {"n": 1, "temperatures": 1.0, "max_new_tokens": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, **args)


def test_empty_prompts(engine):
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[]], n=1, temperatures=1.0, max_new_tokens=1)
    empty = engine.generate([], n=2, temperatures=[], max_new_tokens=3)
    assert len(empty) == 0 and empty.texts == []


def test_factory_builds_both_engines(engine, model, tiny_tokenizer):
    assert isinstance(build_engine("hf", model, tiny_tokenizer, max_batch_rows=8), HFRolloutEngine)
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'"):
        build_engine("sglang", model, tiny_tokenizer)


def test_in_process_engine_leaves_torch_rng_and_threads_alone(engine):
    assert STARTUP["rng_untouched"]  # vLLM seeds the global RNGs while starting; the engine restores them
    threads = torch.get_num_threads()
    try:  # vLLM's CPU worker replaces torch.set_num_threads with a no-op; the engine puts it back
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


def test_a_second_in_process_engine_is_refused_while_one_is_open(engine, tiny_tokenizer):
    with pytest.raises(RuntimeError, match="another in-process vLLM engine is open: close"):
        VLLMRolloutEngine(engine.model_dir, tiny_tokenizer)


def test_constrained_answers_all_parse_through_structured_outputs(engine, prompts):
    from pipelines.ads.teacher.answer_grammar import AnswerGrammar
    from pipelines.ads.teacher.relevance_reward import parse_grade

    assert engine.structured_outputs  # save_model wrote the tokenizer next to the weights
    grammar = AnswerGrammar(max_reason_chars=8)  # vLLM does not force the answer: keep it inside the budget
    rollout = engine.generate(prompts, n=16, temperatures=1.5, max_new_tokens=96, seed=5, constraint=grammar)
    grades = [parse_grade(t) for t in rollout.texts]
    assert None not in grades, [t for t, g in zip(rollout.texts, grades, strict=True) if g is None][:3]
    assert set(rollout.finish_reasons) == {FINISH_STOP}
    assert all(lp <= 0 for row in rollout.logprobs for lp in row)
    greedy = engine.generate(prompts, n=1, temperatures=1.0, max_new_tokens=96, greedy=True, constraint=grammar)
    assert all(parse_grade(t) is not None for t in greedy.texts)
