"""LoRA adapters (peft): only adapters train, the merge equals the adapter model, the saved model is plain."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from agpo.lora import LoRAConfig, add_adapters, merge_adapters, trainable_parameters
from agpo.models import count_parameters, decoder_layers, load_model, save_model, train_top_layers
from agpo.sft import SFTConfig, supervised_finetune

EXAMPLES = [("<query>red shoes</query>\n<ad>nike running shoes, red</ad>\n", " <answer>3</answer>")] * 4


def test_only_the_adapters_train_and_their_count_is_rank_times_in_plus_out(tiny_model, tiny_tokenizer):
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    attention = tiny_model.model.layers[0].self_attn  # the one layer's q_proj and v_proj
    expected = sum(2 * (layer.in_features + layer.out_features) for layer in (attention.q_proj, attention.v_proj))
    adapted = add_adapters(tiny_model, LoRAConfig(rank=2, target_modules=("q_proj", "v_proj")))
    assert trainable_parameters(adapted) == expected
    supervised_finetune(adapted, tiny_tokenizer, EXAMPLES, SFTConfig(epochs=2, batch_size=2, learning_rate=1e-2))
    merged = merge_adapters(adapted)
    changed = {n for n, p in merged.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)


def test_merged_model_gives_the_adapter_models_outputs_and_saves_plain(tiny_model, tiny_tokenizer, tmp_path):
    adapted = add_adapters(tiny_model, LoRAConfig(rank=4, alpha=8.0))
    for name, param in adapted.named_parameters():
        if "lora_B" in name:  # B starts at zero (a no-op adapter); make the update real
            torch.nn.init.normal_(param, std=0.5)
    ids = torch.tensor(
        [tiny_tokenizer("<query>red shoes</query>\n<ad>nike</ad>", add_special_tokens=False)["input_ids"]]
    )
    with torch.no_grad():
        adapter_logits = adapted(input_ids=ids).logits
    merged = merge_adapters(adapted)
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, adapter_logits, rtol=1e-4, atol=1e-4)
    save_model(merged, tiny_tokenizer, tmp_path)
    assert not (tmp_path / "adapter_config.json").exists()
    reloaded, _ = load_model(tmp_path)
    assert count_parameters(reloaded) == count_parameters(merged)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, adapter_logits, rtol=1e-4, atol=1e-4)


def test_bad_settings_are_named(tiny_model):
    with pytest.raises(ValueError, match="rank must be an int >= 0, got -1"):
        LoRAConfig(rank=-1)
    with pytest.raises(ValueError, match="LoRA is off"):
        add_adapters(tiny_model, LoRAConfig())
    with pytest.raises(ValueError, match=r"lora.target_modules \['c_attn'\] are not layers of this Qwen2ForCausalLM"):
        add_adapters(tiny_model, LoRAConfig(rank=2, target_modules=("q_proj", "c_attn")))


def changed_parameters(model, before):
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def test_top_layers_alone_train_and_the_rest_stays_bit_identical(three_layer_model, tiny_tokenizer):
    before = {n: p.detach().clone() for n, p in three_layer_model.named_parameters()}
    top = three_layer_model.model.layers[2]
    assert train_top_layers(three_layer_model, 1) == sum(p.numel() for p in top.parameters())
    sft = SFTConfig(epochs=2, batch_size=2, learning_rate=1e-2)
    supervised_finetune(three_layer_model, tiny_tokenizer, EXAMPLES, sft)
    changed = changed_parameters(three_layer_model, before)
    assert changed and all(n.startswith("model.layers.2.") for n in changed)


def test_lora_on_top_layers_puts_adapters_there_only(three_layer_model, tiny_tokenizer):
    before = {n: p.detach().clone() for n, p in three_layer_model.named_parameters()}
    adapted = add_adapters(three_layer_model, LoRAConfig(rank=2, target_modules=("q_proj",)), top_layers=2)
    trainable = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert len(trainable) == 4 and all(".layers.1." in n or ".layers.2." in n for n in trainable)  # A and B, 2 layers
    supervised_finetune(adapted, tiny_tokenizer, EXAMPLES, SFTConfig(epochs=2, batch_size=2, learning_rate=1e-2))
    changed = changed_parameters(merge_adapters(adapted), before)
    assert changed == {"model.layers.1.self_attn.q_proj.weight", "model.layers.2.self_attn.q_proj.weight"}


@pytest.mark.parametrize("count", [-1, 4])
def test_a_layer_count_outside_the_model_is_named(three_layer_model, count):
    with pytest.raises(ValueError, match=f"trainable_layers must be 0 \\(all\\) or 1..3 for this model, got {count}"):
        train_top_layers(three_layer_model, count)
    if count > 0:
        with pytest.raises(ValueError, match=r"1\.\.3 for this model, got 4"):
            add_adapters(three_layer_model, LoRAConfig(rank=2), top_layers=count)


def test_gemma3_decoder_layers_are_found_and_trained_like_qwen2s():
    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )  # the shape of the packaged gemma-3-270m, shrunk
    model = Gemma3ForCausalLM(config)
    assert decoder_layers(model) is model.model.layers
    assert train_top_layers(model, 1) == sum(p.numel() for p in model.model.layers[2].parameters())
    adapted = add_adapters(model, LoRAConfig(rank=2, target_modules=("q_proj", "v_proj")), top_layers=1)
    assert {n.split(".layers.")[1].split(".")[0] for n, p in adapted.named_parameters() if p.requires_grad} == {"2"}
