"""The rollout engines by name and the ``engine_options`` each accepts, checked before anything is loaded.

``hf`` (agpo.rollout.hf) takes ``HF_OPTIONS``, the keyword arguments of ``HFRolloutEngine`` besides the model
and tokenizer. ``vllm`` (agpo.rollout.vllm) takes vLLM's engine arguments, except the settings it pins
(``PINNED_OPTIONS``, applied after the options) and those it derives from its own arguments
(``DERIVED_OPTIONS``). Plain Python, so a stage's config checks its engine without importing torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ENGINES = ("hf", "vllm")
HF_OPTIONS = ("max_batch_rows",)
# vLLM settings that ``engine_options`` may not change, applied after them: the value and why
PINNED_OPTIONS: dict[str, tuple[Any, str]] = {
    "trust_remote_code": (False, "it would run Python code shipped in the model folder"),
    "load_format": (
        "safetensors",
        "other formats unpickle weights (.bin, npcache) or skip them (dummy); agpo.models loads safetensors only too",
    ),
    "logprobs_mode": ("processed_logprobs", "the trainer's log-probs are log_softmax(logits / T)"),
    "generation_config": ("vllm", "sampling defaults from the model's generation_config.json would change rows"),
    "enable_chunked_prefill": (False, "a split prefill crashes seeded requests on CPU and ties a row to its batch"),
}
# vLLM settings the engine derives from its arguments: where they come from
DERIVED_OPTIONS = {
    "model": "the model folder it serves (model_dir)",
    "skip_tokenizer_init": "structured_outputs (an engine option: true loads vLLM's tokenizer)",
}


def check_vllm_options(engine_options: Mapping[str, Any]) -> None:
    """Refuse ``engine_options`` that name a derived setting or give a pinned one another value."""
    for key, value in engine_options.items():
        if key in DERIVED_OPTIONS:
            raise ValueError(f"engine_options.{key} is refused: the engine sets it from {DERIVED_OPTIONS[key]}")
        if key in PINNED_OPTIONS:
            pinned, reason = PINNED_OPTIONS[key]
            if type(value) is not type(pinned) or value != pinned:
                raise ValueError(
                    f"engine_options.{key}={value!r} is refused: the vllm engine pins it to {pinned!r} ({reason}); "
                    f"remove {key} from engine_options"
                )


def check_engine_options(name: str, options: Mapping[str, Any]) -> None:
    """Refuse an unknown engine or options it would refuse, before any model or vLLM is loaded (a stage's
    config calls it so that nothing loads at all): ``hf`` takes ``HF_OPTIONS`` only; ``vllm`` refuses a
    pinned setting with another value (``trust_remote_code``, ``load_format``, ...: ``PINNED_OPTIONS``)."""
    if name == "hf":
        unknown = sorted(set(options) - set(HF_OPTIONS))
        if unknown:
            raise ValueError(f"engine_options {unknown} are not options of the hf engine; it takes {list(HF_OPTIONS)}")
    elif name == "vllm":
        check_vllm_options(options)
    else:
        raise ValueError(f"unknown rollout engine {name!r}; choose one of {list(ENGINES)}")
