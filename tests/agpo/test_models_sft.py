"""Tokenizer, tiny model builder, save/load, LR schedule and the SFT warm start (with its class balance)."""

import json
import os
import random
from collections import Counter

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from agpo.lr_schedule import lr_multiplier
from agpo.models import TinyModelConfig, build_tiny_qwen2, load_model, save_model, train_bpe_tokenizer
from agpo.sft import (
    IGNORE,
    BestCheckpoint,
    SFTConfig,
    class_weights,
    epoch_order,
    planned_steps,
    supervised_finetune,
    tokenize_example,
)


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
    umask = os.umask(0)
    os.umask(umask)
    # readable as open() leaves a file (safetensors alone writes 0600): the stack's register step reads it
    assert {p.stat().st_mode & 0o777 for p in (tmp_path / "m").iterdir()} == {0o666 & ~umask}
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


def test_class_weights_are_n_over_k_times_the_class_count():
    assert class_weights([0, 0, 0, 1]) == pytest.approx([2 / 3, 2 / 3, 2 / 3, 2])  # N=4, K=2: 4/(2*3), 4/(2*1)
    assert class_weights([3, 1, 3, 2, 3, 3]) == pytest.approx([0.5, 2, 0.5, 2, 0.5, 0.5])  # 6/(3*4), 6/(3*1)
    assert class_weights([2, 2]) == [1.0, 1.0]  # one class: no reweighting
    weights = class_weights([0] * 7 + [1] * 2 + [2])
    assert sum(weights) == pytest.approx(10)  # they average 1: the batch loss keeps its scale
    assert sum(weights[:7]) == pytest.approx(sum(weights[7:9])) == pytest.approx(weights[9])  # N/K per class


def test_balanced_sampling_gives_every_class_n_over_k_slots_per_epoch():
    classes = [3] * 90 + [2] * 6 + [1] * 3 + [0] * 1  # 90% top grade
    rng = random.Random(0)
    orders = [epoch_order(rng, len(classes), classes) for _ in range(3)]
    for order in orders:
        assert len(order) == len(classes)  # the epoch keeps its length
        assert Counter(classes[i] for i in order) == {3: 25, 2: 25, 1: 25, 0: 25}  # N/K = 100/4 each
        uses = Counter(order)
        assert len([i for i in uses if classes[i] == 3]) == 25  # 25 distinct top-grade pairs, none twice
        assert sorted(uses[i] for i in range(90, 96)) == [4, 4, 4, 4, 4, 5]  # 25 slots: 4 whole passes + 1
        assert uses[99] == 25  # the one grade-0 pair fills all its slots
    assert len({tuple(sorted(o)) for o in orders}) == 3  # each epoch a fresh subset of the top grade
    assert epoch_order(random.Random(0), len(classes), classes) == orders[0]  # seeded
    uneven = [0] * 5 + [1] * 2
    assert sorted(Counter(uneven[i] for i in epoch_order(random.Random(0), 7, uneven)).values()) == [3, 4]
    balanced = [0, 1, 2, 3] * 5
    assert sorted(epoch_order(random.Random(0), 20, balanced)) == list(range(20))  # balanced: every pair once
    unweighted = epoch_order(random.Random(0), 5)
    reference = list(range(5))
    random.Random(0).shuffle(reference)
    assert unweighted == reference  # balance none shuffles exactly as before


def per_example_losses(model, tokenizer, examples):
    """Each example's mean cross-entropy over its own completion tokens (one forward pass per example)."""
    out = []
    with torch.no_grad():
        for prompt, completion in examples:
            ids, labels = tokenize_example(tokenizer, prompt, completion)
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            out.append(torch.nn.functional.cross_entropy(logits, torch.tensor(labels[1:]), ignore_index=IGNORE))
    return [x.item() for x in out]


BALANCE_EXAMPLES = [
    ("<query>red shoes</query>\n", " <answer>3</answer>"),
    ("<query>red nike running shoes</query>\n", " same category, all named attributes match <answer>3</answer>"),
    ("<query>black shoes</query>\n", " <answer>3</answer>"),
    ("<query>black phone case</query>\n", " different category <answer>0</answer>"),
]


@pytest.mark.parametrize("balance", ["none", "loss", "sample"])
def test_the_first_step_loss_is_what_the_balance_mode_says(tiny_tokenizer, balance):
    """One batch holding every example: none is the token mean, loss the class-weighted example mean
    (1/N) sum w_i l_i = (1/K) sum_c mean_{i in c} l_i; without classes every mode is the token mean."""
    shape = TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=1, intermediate_size=128)
    config = SFTConfig(epochs=1, batch_size=4, warmup_steps=0, lr_schedule="constant", balance=balance)
    classes = [3, 3, 3, 0]
    model = build_tiny_qwen2(tiny_tokenizer, shape)
    losses = per_example_losses(model, tiny_tokenizer, BALANCE_EXAMPLES)
    lengths = [len(tiny_tokenizer(c, add_special_tokens=False)["input_ids"]) + 1 for _, c in BALANCE_EXAMPLES]
    token_mean = sum(x * n for x, n in zip(losses, lengths, strict=True)) / sum(lengths)
    [first] = supervised_finetune(model, tiny_tokenizer, BALANCE_EXAMPLES, config, classes=classes)
    if balance == "loss":
        expected = (2 / 3 * (losses[0] + losses[1] + losses[2]) + 2 * losses[3]) / 4
        assert expected == pytest.approx((sum(losses[:3]) / 3 + losses[3]) / 2)
        assert first == pytest.approx(expected, rel=1e-5)
    elif balance == "none":
        assert first == pytest.approx(token_mean, rel=1e-5)
    unbalanced = build_tiny_qwen2(tiny_tokenizer, shape)
    [plain] = supervised_finetune(unbalanced, tiny_tokenizer, BALANCE_EXAMPLES, config)  # no classes
    assert plain == pytest.approx(token_mean, rel=1e-5)


def test_balanced_sft_checks_its_classes(tiny_tokenizer, tiny_model):
    with pytest.raises(ValueError, match="one class per example, got 1 classes for 4 examples"):
        supervised_finetune(tiny_model, tiny_tokenizer, BALANCE_EXAMPLES, SFTConfig(epochs=1), classes=[3])
    with pytest.raises(ValueError, match="balance must be one of"):
        SFTConfig(balance="oversample")


def test_max_steps_caps_the_run_and_stop_when_ends_it(tiny_tokenizer):
    examples = [(f"q{i} ", "a") for i in range(40)]
    config = SFTConfig(epochs=3, batch_size=8, max_steps=7)
    assert planned_steps(40, config) == 7 and planned_steps(40, SFTConfig(epochs=3, batch_size=8)) == 15
    model = build_tiny_qwen2(
        tiny_tokenizer, TinyModelConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=1)
    )
    assert len(supervised_finetune(model, tiny_tokenizer, examples, config)) == 7
    asked = []
    losses = supervised_finetune(
        model, tiny_tokenizer, examples, config, stop_when=lambda step, loss: asked.append(step) or step == 3
    )
    assert len(losses) == 3 and asked == [1, 2, 3] and not model.training


class Weight(torch.nn.Module):
    """One trainable number, set by hand to the step it was 'trained' to, and one frozen one."""

    def __init__(self) -> None:
        super().__init__()
        self.value = torch.nn.Parameter(torch.zeros(1))
        self.frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)


def test_best_checkpoint_keeps_the_best_evaluated_weights_and_stops_after_patience():
    model = Weight()
    scores = {0: 0.9, 2: 0.5, 4: 0.7, 6: 0.7, 8: 0.6}  # step 0 (untrained) is best, yet no candidate

    def evaluate():
        return {"acc": scores[int(model.value.item())]}

    monitor = BestCheckpoint(model, evaluate, "acc", every=2, patience=2)
    stops = []
    for step in range(1, 9):
        with torch.no_grad():
            model.value.fill_(step)
            model.frozen.fill_(step)
        stops.append(monitor(step, loss=1.0 / step))
        if stops[-1]:
            break
    # 0.5 at 2, 0.7 at 4 (better), 0.7 at 6 (a tie is no improvement), 0.6 at 8: two evaluations without one
    assert stops == [False] * 7 + [True]
    best = monitor.finish(8)
    assert best == {"step": 4, "loss": 0.25, "acc": 0.7}
    assert [h["step"] for h in monitor.history] == [0, 2, 4, 6, 8]  # step 8 was just evaluated: not again
    assert model.value.item() == 4.0 and model.frozen.item() == 8.0  # trainable weights restored, nothing else


def test_best_checkpoint_without_periodic_evaluation_evaluates_the_last_step():
    model = Weight()
    monitor = BestCheckpoint(model, lambda: {"acc": float(model.value.item())}, "acc")
    assert not any(monitor(step, 0.0) for step in range(1, 6))
    with torch.no_grad():
        model.value.fill_(5)
    assert monitor.finish(5) == {"step": 5, "acc": 5.0} and len(monitor.history) == 2


@pytest.mark.parametrize(
    ("field", "value", "message"), [("patience", 2, "needs eval_every"), ("max_steps", 0, "max_steps")]
)
def test_sft_budget_settings_are_checked(field, value, message):
    with pytest.raises(ValueError, match=message):
        SFTConfig(**{field: value})
