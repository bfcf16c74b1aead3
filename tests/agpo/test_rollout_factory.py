"""Engine factory: hf always builds; vllm is imported only on request and explains how to install it."""

import subprocess
import sys

import pytest

from agpo.rollout import HFRolloutEngine, factory
from agpo.rollout.factory import build_engine


def test_hf_engine_and_unknown_names(tiny_model, tiny_tokenizer):
    engine = build_engine("hf", tiny_model, tiny_tokenizer, max_batch_rows=4)
    assert isinstance(engine, HFRolloutEngine) and engine.max_batch_rows == 4
    with pytest.raises(ValueError, match=r"unknown rollout engine 'sglang'; choose one of \['hf', 'vllm'\]"):
        build_engine("sglang", tiny_model, tiny_tokenizer)


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
