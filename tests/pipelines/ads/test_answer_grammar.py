"""Answer-grammar decoding in the hf engine: on a tiny Qwen2 with random weights every sampled or greedy
answer parses, every grade is reachable, the reason cap holds, and the answer is forced when the token
budget runs short."""

import pytest
import torch

from agpo.rollout import FINISH_STOP, HFRolloutEngine
from pipelines.ads.teacher.answer_grammar import AnswerGrammar, TokenAutomaton
from pipelines.ads.teacher.relevance_reward import parse_grade


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def engine(tiny_model, tiny_tokenizer):
    return HFRolloutEngine(tiny_model, tiny_tokenizer)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_every_sampled_answer_parses_and_every_grade_is_reachable(engine, prompt_ids, temperature):
    rollout = engine.generate(
        prompt_ids, n=70, temperatures=temperature, max_new_tokens=48, seed=3, constraint=AnswerGrammar()
    )
    grades = [parse_grade(t) for t in rollout.texts]
    assert len(grades) == 210 and None not in grades
    assert set(grades) == {0, 1, 2, 3}
    assert set(rollout.finish_reasons) == {FINISH_STOP}


def test_greedy_answers_parse(engine, prompt_ids):
    rollout = engine.generate(
        prompt_ids, n=2, temperatures=1.0, max_new_tokens=30, greedy=True, constraint=AnswerGrammar()
    )
    assert all(parse_grade(t) is not None for t in rollout.texts)
    assert rollout.texts[0] == rollout.texts[1]


def test_the_label_set_and_the_reason_cap_hold(engine, prompt_ids):
    grammar = AnswerGrammar(grades=(1, 2), max_reason_chars=5)
    rollout = engine.generate(prompt_ids, n=40, temperatures=2.0, max_new_tokens=40, seed=0, constraint=grammar)
    for text in rollout.texts:
        assert parse_grade(text) in (1, 2), text
        assert len(text[: text.index("<answer>")].strip()) <= 5, text


def test_a_short_budget_forces_the_answer_and_a_too_short_one_is_refused(engine, prompt_ids, tiny_tokenizer):
    need = TokenAutomaton(AnswerGrammar(), tiny_tokenizer).min_new_tokens()
    for budget in (need, need + 3):
        rollout = engine.generate(
            prompt_ids, n=20, temperatures=2.0, max_new_tokens=budget, seed=1, constraint=AnswerGrammar()
        )
        assert all(parse_grade(t) is not None for t in rollout.texts)
        assert max(len(t) for t in rollout.token_ids) <= budget
    with pytest.raises(ValueError, match="raise max_new_tokens"):
        engine.generate(prompt_ids, n=1, temperatures=1.0, max_new_tokens=need - 1, constraint=AnswerGrammar())


def test_constrained_logprobs_are_of_the_renormalised_masked_distribution(engine, tiny_model, prompt_ids):
    rollout = engine.generate(
        prompt_ids[:1], n=4, temperatures=1.0, max_new_tokens=24, seed=2, constraint=AnswerGrammar()
    )
    unconstrained = []
    for ids, lps in zip(rollout.token_ids, rollout.logprobs, strict=True):
        full = torch.tensor([list(prompt_ids[0]) + ids])
        with torch.no_grad():
            logits = tiny_model(full).logits[0, len(prompt_ids[0]) - 1 : -1]
        model_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)
        assert torch.all(torch.tensor(lps) >= model_lp - 1e-5)  # masking only moves mass onto allowed tokens
        unconstrained.append(model_lp.sum().item())
    assert sum(sum(lp) for lp in rollout.logprobs) > sum(unconstrained)


def test_without_a_constraint_generation_is_unchanged(engine, prompt_ids):
    a = engine.generate(prompt_ids, n=3, temperatures=1.0, max_new_tokens=12, seed=7)
    b = engine.generate(prompt_ids, n=3, temperatures=1.0, max_new_tokens=12, seed=7, constraint=None)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_multi_byte_tokens_that_span_reason_tag_and_grade_are_walked(tiny_tokenizer):
    automaton = TokenAutomaton(AnswerGrammar(), tiny_tokenizer)
    ids = tiny_tokenizer(" different category <answer>0</answer>", add_special_tokens=False)["input_ids"]
    state, reason = automaton.start, 0
    for token in ids:
        assert automaton.next[state, token] >= 0
        reason += int(automaton.delta[state, token])
        state = int(automaton.next[state, token])
    assert state in automaton.leaves and reason == len(" different category ")
    assert int(automaton.next[state, tiny_tokenizer.eos_token_id]) == automaton.done
    closing = tiny_tokenizer("x</answer>", add_special_tokens=False)["input_ids"]
    state = automaton.start
    for token in closing:
        state = int(automaton.next[state, token])
        if state < 0:
            break
    assert state < 0  # a closing tag in the reason is dead
