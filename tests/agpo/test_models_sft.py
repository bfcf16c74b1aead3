"""Tokenizer, tiny model builder, save/load, LR schedule and the SFT warm start."""

import json

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from agpo.models import TinyModelConfig, build_tiny_qwen2, load_model, save_model, train_bpe_tokenizer
from agpo.optim import lr_multiplier
from agpo.sft import IGNORE, SFTConfig, supervised_finetune, tokenize_example


def test_byte_level_tokenizer_round_trips_any_text(tiny_tokenizer):
    for text in ["<query>red shoes</query>", "价格 跑鞋 😀", "weird \x01 bytes \u202e"]:
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.pad_token == "<|pad|>" and tiny_tokenizer.eos_token == "<|eos|>"


def test_split_digits_gives_one_token_per_digit_in_every_context(tmp_path):
    corpus = ["What is 13 + 42? 13 + 42 = 55. \\boxed{55}"] * 50
    merged = train_bpe_tokenizer(corpus, vocab_size=320)
    merged_tokens = [t.strip("Ġ") for t in merged.convert_ids_to_tokens(merged("13 55")["input_ids"])]
    assert any(len(t) > 1 and t.isdigit() for t in merged_tokens)  # the default merges digits
    split = train_bpe_tokenizer(corpus, vocab_size=320, split_digits=True)
    for text in ["13", " 13?", "{55}", "x1234y"]:
        ids = split(text, add_special_tokens=False)["input_ids"]
        digit_tokens = [t.strip("Ġ") for t in split.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
        assert all(len(t) == 1 and t.isdigit() for t in digit_tokens), (text, digit_tokens)
        assert split.decode(ids) == text
    split.save_pretrained(tmp_path)  # the setting travels with tokenizer.json (vLLM and load_model read it)
    reloaded = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    assert reloaded("x1234y")["input_ids"] == split("x1234y")["input_ids"]


def test_model_shape_is_vllm_servable(tiny_tokenizer):
    model = build_tiny_qwen2(tiny_tokenizer, TinyModelConfig(vocab_size=320, hidden_size=128, num_layers=2))
    assert model.config.head_dim == 64 and model.config.num_attention_heads == 2
    assert model.config.vocab_size == len(tiny_tokenizer)
    with pytest.raises(ValueError, match="multiple of head_dim 64"):
        TinyModelConfig(hidden_size=100)


def test_save_and_load_use_safetensors_and_keep_outputs(tmp_path, tiny_model, tiny_tokenizer):
    save_model(tiny_model, tiny_tokenizer, tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").is_file()
    assert not list((tmp_path / "m").glob("*.bin"))
    model, tokenizer = load_model(tmp_path / "m")
    ids = torch.tensor([tokenizer("<query>red", add_special_tokens=False)["input_ids"]])
    assert torch.allclose(model(input_ids=ids).logits, tiny_model(input_ids=ids).logits, atol=1e-6)
    assert tokenizer.padding_side == "left"
    with pytest.raises(FileNotFoundError, match="is not a model directory"):
        load_model(tmp_path / "missing")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["model_type"] == "qwen2"


def test_lr_schedule():
    assert lr_multiplier(0, 100, 10, "cosine") == pytest.approx(0.1)
    assert lr_multiplier(10, 100, 10, "cosine") == pytest.approx(1.0)
    assert lr_multiplier(55, 100, 10, "cosine") == pytest.approx(0.5)
    assert lr_multiplier(100, 100, 10, "cosine") == pytest.approx(0.0)
    assert lr_multiplier(50, 100, 0, "constant") == 1.0
    with pytest.raises(ValueError, match="lr schedule must be one of"):
        lr_multiplier(0, 1, 0, "step")


def test_sft_masks_the_prompt(tiny_tokenizer):
    ids, labels = tokenize_example(tiny_tokenizer, "<query>a</query>", " <answer>3</answer>")
    prompt_len = len(tiny_tokenizer("<query>a</query>", add_special_tokens=False)["input_ids"])
    assert labels[:prompt_len] == [IGNORE] * prompt_len
    assert labels[prompt_len:] == ids[prompt_len:] and ids[-1] == tiny_tokenizer.eos_token_id


def test_sft_learns_a_mapping_and_is_deterministic(tiny_tokenizer):
    examples = [
        ("<query>red shoes</query>\n", " <answer>3</answer>"),
        ("<query>black phone case</query>\n", " <answer>0</answer>"),
    ]
    config = SFTConfig(epochs=40, batch_size=2, learning_rate=1e-2, warmup_steps=0, lr_schedule="constant")
    shape = TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=1, intermediate_size=128)
    model = build_tiny_qwen2(tiny_tokenizer, shape)
    losses = supervised_finetune(model, tiny_tokenizer, examples, config)
    assert losses[-1] < 0.1 * losses[0]
    again = build_tiny_qwen2(tiny_tokenizer, shape)
    assert supervised_finetune(again, tiny_tokenizer, examples, config) == losses
    with pytest.raises(ValueError, match="at least one"):
        supervised_finetune(model, tiny_tokenizer, [], config)
