"""Build a rollout engine by name: ``hf`` (always available) or ``vllm`` (imported only when asked for)."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import torch

from agpo.engine_options import check_engine_options
from agpo.rollout.base import RolloutEngine
from agpo.rollout.hf import HFRolloutEngine

VLLM_INSTALL_HINT = (
    "the vllm rollout engine needs vLLM, which is not installed in this environment. On CPU it lives in its "
    "own venv: run `make venv-vllm` and use .venv-vllm/bin/python (see constraints-vllm.txt); on GPUs "
    "`pip install -e '.[vllm]'`"
)


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def build_engine(
    name: str,
    model: torch.nn.Module,
    tokenizer: Any,
    model_dir: str | Path | None = None,
    autocast_dtype: torch.dtype | None = None,
    **options: Any,
) -> RolloutEngine:
    """The rollout engine ``name`` for ``model``.

    ``options`` are checked first (``check_engine_options``). ``hf`` generates with ``model`` itself, on its
    device, its forward passes autocast to ``autocast_dtype`` when given (``options``: ``max_batch_rows``).
    ``vllm`` serves the model directory ``model_dir`` (``options``: see ``VLLMRolloutEngine``; its own ``dtype``)
    and then loads ``model``'s current weights, so a directory holding older weights of the same architecture is
    fine; without ``model_dir`` the model and tokenizer are saved to a temporary directory that vLLM reads while
    it starts.
    """
    check_engine_options(name, options)
    if name == "hf":
        return HFRolloutEngine(model, tokenizer, autocast_dtype=autocast_dtype, **options)
    if not vllm_available():
        raise ImportError(VLLM_INSTALL_HINT)
    from agpo.rollout.vllm import VLLMRolloutEngine

    if model_dir is not None:
        engine = VLLMRolloutEngine(model_dir, tokenizer, **options)
        engine.sync_weights(model)  # the directory may hold older weights of the same architecture
        return engine
    with tempfile.TemporaryDirectory(prefix="agpo-vllm-") as snapshot:  # vLLM reads it only while starting
        model.save_pretrained(snapshot, safe_serialization=True)
        tokenizer.save_pretrained(snapshot)
        return VLLMRolloutEngine(snapshot, tokenizer, **options)
