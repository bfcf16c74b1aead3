"""Engine factory: hf always builds; vllm is imported only on request and explains how to install it; no
engine option undoes a pinned safety setting (trust_remote_code, load_format, ...)."""

import inspect
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from agpo.engine_options import HF_OPTIONS
from agpo.rollout import HFRolloutEngine, factory
from agpo.rollout.factory import build_engine


def test_hf_engine_and_unknown_names(tiny_model, tiny_tokenizer):
    engine = build_engine("hf", tiny_model, tiny_tokenizer, max_batch_rows=4)
    assert isinstance(engine, HFRolloutEngine) and engine.max_batch_rows == 4
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; choose one of \['hf', 'vllm'\]"):
        build_engine("sglang", tiny_model, tiny_tokenizer)


def test_the_hf_options_checked_without_torch_are_the_hf_engine_arguments():
    """Every argument but the model, its tokenizer and the precision (the stage's precision key, not an engine
    option) is an engine option."""
    owned = ("model", "tokenizer", "autocast_dtype")
    arguments = [p for p in inspect.signature(HFRolloutEngine).parameters if p not in owned]
    assert list(HF_OPTIONS) == arguments


def test_vllm_without_vllm_says_how_to_install_it(tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(factory, "vllm_available", lambda: False)
    with pytest.raises(ImportError, match="make venv-vllm"):
        build_engine("vllm", tiny_model, tiny_tokenizer)


def test_rollout_package_and_vllm_module_import_without_vllm():
    code = (
        "import sys, agpo.rollout, agpo.rollout.factory, agpo.rollout.vllm; "
        "assert 'vllm' not in sys.modules, 'importing the engines must not import vllm'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


GPU_PRESETS = ["configs/gpu-7b.yaml", "configs/math/gpu-qwen2.5-math-7b.yaml", "configs/math/gpu-eval-math500.yaml"]


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("vllm", {"trust_remote_code": True}, r"engine_options.trust_remote_code=True is refused: .* pins it to False"),
        ("vllm", {"trust_remote_code": 1}, r"trust_remote_code=1 is refused"),
        ("vllm", {"load_format": "pt"}, r"engine_options.load_format='pt' is refused: .* 'safetensors' \(other"),
        ("vllm", {"logprobs_mode": "raw_logprobs"}, "logprobs_mode='raw_logprobs' is refused"),
        ("vllm", {"model": "some/other-model"}, r"engine_options.model is refused: the engine sets it from"),
        ("hf", {"trust_remote_code": True}, r"\['trust_remote_code'\] are not options of the hf engine; it takes"),
        ("sglang", {}, r"unknown rollout engine 'sglang'"),
    ],
)
def test_engine_options_cannot_change_pinned_settings(name, options, message):
    with pytest.raises(ValueError, match=message):
        factory.check_engine_options(name, options)


def test_the_shipped_engine_options_and_pinned_values_pass():
    import yaml

    root = Path(__file__).resolve().parents[2]
    for preset in GPU_PRESETS:
        factory.check_engine_options("vllm", yaml.safe_load((root / preset).read_text())["engine_options"])
    factory.check_engine_options("vllm", {"trust_remote_code": False, "load_format": "safetensors"})
    factory.check_engine_options("hf", {"max_batch_rows": 8})


def test_build_engine_refuses_pinned_options_before_loading_anything(tiny_model, tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(factory, "vllm_available", lambda: False)  # the check comes before the install hint
    with pytest.raises(ValueError, match="trust_remote_code=True is refused"):
        build_engine("vllm", tiny_model, tiny_tokenizer, trust_remote_code=True)
    with pytest.raises(ValueError, match="not options of the hf engine"):
        build_engine("hf", tiny_model, tiny_tokenizer, trust_remote_code=True)


def fake_vllm(monkeypatch) -> dict:
    """vllm replaced by modules whose LLM records its keyword arguments."""
    seen: dict = {}

    class LLM:
        def __init__(self, **options):
            seen.update(options)
            engine_core = SimpleNamespace(shutdown=lambda: None)
            self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(max_model_len=64), engine_core=engine_core)

    modules = {
        "vllm": SimpleNamespace(LLM=LLM, SamplingParams=dict),
        "vllm.platforms": SimpleNamespace(current_platform=SimpleNamespace(is_cpu=lambda: True)),
        "vllm.sampling_params": SimpleNamespace(StructuredOutputsParams=dict),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return seen


def test_vllm_applies_pinned_settings_after_the_options(tiny_tokenizer, tmp_path, monkeypatch):
    from agpo.rollout.vllm import PINNED_OPTIONS, VLLMRolloutEngine

    (tmp_path / "config.json").write_text("{}")
    seen = fake_vllm(monkeypatch)
    with pytest.raises(ValueError, match="trust_remote_code=True is refused"):
        VLLMRolloutEngine(tmp_path, tiny_tokenizer, in_process=False, trust_remote_code=True)
    assert not seen  # refused before vLLM was started
    engine = VLLMRolloutEngine(tmp_path, tiny_tokenizer, in_process=False, max_num_seqs=4, trust_remote_code=False)
    engine.close()
    assert seen["max_num_seqs"] == 4 and seen["model"] == str(tmp_path)
    assert {key: seen[key] for key in PINNED_OPTIONS} == {key: value for key, (value, _) in PINNED_OPTIONS.items()}
    assert seen["trust_remote_code"] is False and seen["load_format"] == "safetensors"


def test_vllm_refuses_requests_it_would_change_and_builds_one_seeded_request_per_sample(
    tiny_tokenizer, tmp_path, monkeypatch
):
    from agpo.rollout.vllm import VLLMRolloutEngine

    (tmp_path / "config.json").write_text("{}")
    fake_vllm(monkeypatch)
    engine = VLLMRolloutEngine(tmp_path, tiny_tokenizer, in_process=False)  # fake max_model_len: 64
    try:
        with pytest.raises(ValueError, match=r"raises temperatures below 0\.01"):
            engine.generate([[1, 2]], n=2, temperatures=0.001, max_new_tokens=4)
        with pytest.raises(ValueError, match=r"exceeds the engine's max_model_len \(64\)"):
            engine.generate([[1] * 60], n=1, temperatures=1.0, max_new_tokens=8)
        with pytest.raises(ValueError, match="constrained decoding needs vLLM structured outputs"):
            engine.generate([[1, 2]], n=1, temperatures=1.0, max_new_tokens=4, constraint=object())
        request = engine._request_params(0.7, 11, 5, None)  # the fake SamplingParams is dict
    finally:
        engine.close()
    assert request["temperature"] == 0.7 and request["seed"] == 11 and request["max_tokens"] == 5
    assert request["stop_token_ids"] == [tiny_tokenizer.eos_token_id] and request["logprobs"] == 0
