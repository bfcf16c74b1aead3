"""The vllm rollout engine on a tiny Llama (runs in .venv-vllm, after test_rollout_vllm.py closed its engine).

Only one in-process vLLM engine may be open at a time, so this architecture gets its own module: pytest
closes the previous module's engine before this one starts.
"""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytest.importorskip("vllm")

from agpo.models import save_model
from agpo.rollout import HFRolloutEngine
from agpo.rollout.vllm import VLLMRolloutEngine

pytestmark = pytest.mark.vllm

TEXTS = ["<query>red shoes</query>\n<ad>", "<query>black phone case</query>\n<ad>otterbox phone case</ad>\n", "a"]


def test_llama_with_grouped_kv_heads_and_untied_head(tiny_tokenizer, tmp_path):
    """Weight names, q/k/v fusion with grouped KV heads and an untied lm_head; a new engine after close()."""
    prompts = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tiny_tokenizer.pad_token_id,
        eos_token_id=tiny_tokenizer.eos_token_id,
        bos_token_id=None,
    )
    llama = LlamaForCausalLM(config).eval()
    engine = VLLMRolloutEngine(save_model(llama, tiny_tokenizer, tmp_path), tiny_tokenizer, kv_cache_gib=1)
    try:
        hf = HFRolloutEngine(llama, tiny_tokenizer)
        args = {"n": 1, "temperatures": 1.0, "max_new_tokens": 10, "greedy": True}
        before = engine.generate(prompts, **args).token_ids
        assert before == hf.generate(prompts, **args).token_ids
        with torch.no_grad():
            for param in llama.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        engine.sync_weights(llama)
        after = hf.generate(prompts, **args).token_ids
        assert after != before
        assert engine.generate(prompts, **args).token_ids == after
    finally:
        engine.close()
