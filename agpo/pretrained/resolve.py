"""What a ``base_model`` setting means: a local model directory as it is, or a registered packaged model's
converted cache entry."""

from __future__ import annotations

from pathlib import Path

from agpo.pretrained.catalog import PACKAGED_MODELS, packaged_model_names
from agpo.pretrained.convert import convert_packaged_model


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
