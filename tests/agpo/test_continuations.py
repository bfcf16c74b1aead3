"""Exact grade distributions: the batched, cache-sharing computation equals one full forward pass per
candidate, whatever the prompt lengths (padding), the chunking, or where BPE cuts the answer tag."""

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agpo.models import EOS, PAD, TinyModelConfig, build_tiny_qwen2, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine
from agpo.rollout.continuations import continuation_logprobs

ENDINGS = [f"{g}</answer>" for g in range(4)]
PROMPTS = [
    "<query>red shoes</query>\n<ad>",
    "<query>black phone case</query>\n<ad>otterbox phone case, black, plastic</ad>\n",
    "a",
    "<query>nike</query>\n<ad>nike running shoes</ad>\n",
]
PREFIXES = [" same category <answer>", " <answer>", " different category, colour <answer>", "<answer>"]


def by_hand(model, tokenizer, prompt_ids, prefixes, candidates) -> torch.Tensor:
    """One unpadded forward pass per (pair, candidate): the completion's summed token log-probs (float64),
    normalised over the candidates."""
    scores = torch.zeros(len(prompt_ids), len(candidates), dtype=torch.float64)
    for i, (ids, prefix) in enumerate(zip(prompt_ids, prefixes, strict=True)):
        for k, candidate in enumerate(candidates):
            completion = [*tokens(tokenizer, prefix + candidate), tokenizer.eos_token_id]
            with torch.no_grad():
                logits = model(torch.tensor([list(ids) + completion])).logits[0].double()
            logprobs = torch.log_softmax(logits, -1)
            start = len(ids) - 1  # the logits at position t predict token t + 1
            scores[i, k] = sum(logprobs[start + j, token] for j, token in enumerate(completion))
    return torch.log_softmax(scores, -1)


def unsplit_bpe(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE without the pre-tokenizer's word split, so merges may cross "<answer>" and the grade
    (as in SentencePiece-style vocabularies)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], initial_alphabet=alphabet)
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, padding_side="left")


def tiny(merges_across_the_tag: bool = False):
    corpus = PROMPTS * 20 + [p + e for p in PREFIXES for e in ENDINGS] * 10
    if merges_across_the_tag:
        tokenizer = unsplit_bpe(corpus + [" <answer>3</answer>", "<answer>0</answer>"] * 100, 340)
    else:
        tokenizer = train_bpe_tokenizer(corpus, vocab_size=340)
    config = TinyModelConfig(vocab_size=340, hidden_size=64, num_layers=2, intermediate_size=128)
    return build_tiny_qwen2(tokenizer, config).eval(), tokenizer


def tokens(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("merged", [False, True], ids=["tag-boundary", "bpe-merges-across-the-tag"])
@pytest.mark.parametrize("max_batch_rows", [1024, 8, 1])
def test_batched_scores_equal_one_forward_pass_per_candidate(merged, max_batch_rows):
    model, tokenizer = tiny(merges_across_the_tag=merged)
    ids = [tokens(tokenizer, p) for p in PROMPTS]
    assert len({len(i) for i in ids}) == len(ids)  # varied lengths: left padding is exercised
    opening = tokens(tokenizer, " <answer>")
    crosses = any(tokens(tokenizer, " <answer>" + e)[: len(opening)] != opening for e in ENDINGS)
    assert crosses == merged  # with merges, some candidates part from the others inside "<answer>"
    got = continuation_logprobs(model, tokenizer, ids, PREFIXES, ENDINGS, max_batch_rows=max_batch_rows)
    expected = by_hand(model, tokenizer, ids, PREFIXES, ENDINGS)
    assert got.shape == (4, 4) and got.dtype == torch.float32
    assert torch.allclose(got.double(), expected, atol=1e-5), (got, expected)
    assert torch.allclose(got.exp().sum(-1), torch.ones(4), atol=1e-6)


def test_candidates_of_different_token_lengths_and_the_engine_method():
    model, tokenizer = tiny()
    ids = [tokens(tokenizer, p) for p in PROMPTS]
    candidates = ["1</answer>", "12</answer>", "yes, clearly</answer>"]
    got = HFRolloutEngine(model, tokenizer, max_batch_rows=5).score_continuations(ids, PREFIXES, candidates)
    assert torch.allclose(got.double(), by_hand(model, tokenizer, ids, PREFIXES, candidates), atol=1e-5)


def test_a_pair_scores_the_same_in_any_batch_and_the_model_mode_is_restored():
    model, tokenizer = tiny()
    ids = [tokens(tokenizer, p) for p in PROMPTS]
    model.train()
    together = continuation_logprobs(model, tokenizer, ids, PREFIXES, ENDINGS)
    assert model.training
    alone = torch.cat(
        [continuation_logprobs(model, tokenizer, [i], [p], ENDINGS) for i, p in zip(ids, PREFIXES, strict=True)]
    )
    assert torch.allclose(together, alone, atol=1e-6)
    assert together.argmax(-1).tolist() == alone.argmax(-1).tolist()


def test_bad_arguments():
    model, tokenizer = tiny()
    ids = [tokens(tokenizer, "a")]
    with pytest.raises(ValueError, match="one prefix per prompt"):
        continuation_logprobs(model, tokenizer, ids, [], ENDINGS)
    with pytest.raises(ValueError, match="distinct"):
        continuation_logprobs(model, tokenizer, ids, ["x"], ["1", "1"])
    with pytest.raises(ValueError, match="at least one token"):
        continuation_logprobs(model, tokenizer, [[]], ["x"], ENDINGS)
    assert continuation_logprobs(model, tokenizer, [], [], ENDINGS).shape == (0, 4)
