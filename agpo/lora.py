"""LoRA fine-tuning through ``peft``, merged back into a plain model before it is saved.

LoRA (Hu et al., 2021) freezes every base weight and gives each targeted linear layer ``W`` (d_out x d_in)
a trainable low-rank update: the layer computes ``W x + (alpha / rank) * B A x`` with ``A`` (rank x d_in)
initialised randomly and ``B`` (d_out x rank) at zero, so training starts exactly at the base model and
trains ``rank * (d_in + d_out)`` numbers per layer instead of ``d_in * d_out``.

:func:`add_adapters` wraps a causal LM for training; :func:`merge_adapters` folds each update into its
layer (``W <- W + (alpha / rank) * B A``) and returns the base model class without any ``peft`` wrapper,
so rollout engines, vLLM and annotation load an ordinary model directory and never need ``peft``.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from agpo.lora_config import LoRAConfig
from agpo.models import top_layer_indices


def add_adapters(model: torch.nn.Module, config: LoRAConfig, top_layers: int = 0) -> PeftModel:
    """``model`` with LoRA adapters on ``config.target_modules``; only the adapters are trainable.

    ``top_layers`` > 0 puts adapters in the top ``top_layers`` decoder layers only, so backward stops there.
    """
    if not config.enabled:
        raise ValueError("LoRA is off (rank 0); train the model itself")
    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(config.target_modules) - present)
    if missing:
        raise ValueError(
            f"lora.target_modules {missing} are not layers of this {type(model).__name__}; its linear layers "
            f"include {sorted(n for n in present if n.endswith('proj'))[:12]}"
        )
    adapter = LoraConfig(
        r=config.rank,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
        layers_to_transform=list(top_layer_indices(model, top_layers)) if top_layers else None,
    )
    return get_peft_model(model, adapter)


def merge_adapters(model: PeftModel) -> torch.nn.Module:
    """The base model with every adapter folded into its layer (``W + (alpha / rank) B A``), peft removed."""
    merged = model.merge_and_unload()
    merged.eval()
    return merged


def trainable_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
