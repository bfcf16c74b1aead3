"""Tiny teachers built locally: a byte-level BPE tokenizer trained with ``tokenizers`` and a small Qwen2
decoder (head_dim 64, so vLLM can serve it), saved as a normal Hugging Face model directory.

Nothing is downloaded: the tokenizer learns its merges from the texts it is given, and the model starts
from random weights with a fixed seed. Loading never runs remote code and reads safetensors only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from agpo.tiny_model_config import TinyModelConfig
from compute.placement import autocast as placement_autocast
from durable.fileio import share_like_open

PAD, EOS = "<|pad|>", "<|eos|>"


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, split_digits: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer learned from ``texts``: any input (Chinese, emoji, junk) encodes.

    ``split_digits`` makes every digit its own token, as Qwen2.5's and Llama 3's tokenizers do: with merged
    digits a number is one token in one context and several in another, and a tiny model did not learn
    to copy or add them (greedy accuracy on 2-digit arithmetic 0.00 merged, 0.37 split)."""
    tokenizer = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = pre_tokenizers.Digits(individual_digits=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level]) if split_digits else byte_level
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS, padding_side="left")


def build_tiny_qwen2(tokenizer: PreTrainedTokenizerFast, config: TinyModelConfig) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 decoder sized by ``config`` for ``tokenizer``'s vocabulary."""
    heads = config.hidden_size // 64
    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=64,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(config.seed)
    model = Qwen2ForCausalLM(model_config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def cache_argument(model: torch.nn.Module) -> str:
    """The keyword a causal LM takes its key/value cache by, and the name of its output's cache field:
    ``cache`` in transformers >= 5.2x, where ``past_key_values`` is deprecated (and logs a warning),
    ``past_key_values`` before (the vLLM venv pins transformers 5.19).
    ``model`` may be wrapped (a DeepSpeed engine keeps it as ``.module``)."""
    return _cache_argument_of(type(getattr(model, "module", model)))


@functools.cache
def _cache_argument_of(model_class: type) -> str:  # once per class: it is asked on every forward pass
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The stack of decoder layers of a causal LM (Llama, Qwen2, Gemma 3: ``model.model.layers``)."""
    layers = getattr(model.get_decoder(), "layers", None) if hasattr(model, "get_decoder") else None
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"{type(model).__name__} has no decoder layer stack to choose trainable layers from")
    return layers


def top_layer_indices(model: torch.nn.Module, count: int) -> range:
    """Indices of the top ``count`` decoder layers; a count outside 1..(number of layers) is a named error."""
    total = len(decoder_layers(model))
    if not 1 <= count <= total:
        raise ValueError(f"trainable_layers must be 0 (all) or 1..{total} for this model, got {count}")
    return range(total - count, total)


def train_top_layers(model: torch.nn.Module, count: int) -> int:
    """Freeze every parameter except those of the top ``count`` decoder layers; returns how many are trained.

    The embeddings, the lower layers, the final norm and the LM head stay as they are. Backward then stops at
    the lowest trained layer, so a step costs the forward pass plus the backward pass of ``count`` layers:
    on a pretrained model on a CPU this is what makes fine-tuning affordable (SmolLM2-135M, 30 layers, 8
    trained, a 61-token prompt: 1.65 s per step of 8 pairs; the whole model took about 27 s with a 130-token one).
    """
    layers = decoder_layers(model)
    indices = top_layer_indices(model, count)
    model.requires_grad_(False)
    for index in indices:
        layers[index].requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's parameters: where its batches must be."""
    return next(model.parameters()).device


def autocast(model: torch.nn.Module, dtype: torch.dtype | None) -> torch.autocast:
    """Forward passes of ``model`` in mixed precision ``dtype`` on the model's device (None: as the weights
    are; the stage's precision key chooses, pipelines.devices)."""
    return placement_autocast(model_device(model), dtype)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """``save_pretrained`` of model (safetensors) and tokenizer into ``directory``, each file readable as a plain
    ``open`` would leave it (``share_like_open``: safetensors writes 0600, and the stack's register step, another
    user of the workers' group, reads the teacher to register it)."""
    directory = Path(directory)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    share_like_open(directory)
    return directory


def load_model(
    directory: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """Load a causal LM and its tokenizer from a local directory: safetensors only, no remote code."""
    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a model directory (no config.json); build or train a teacher first"
        )
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=dtype, trust_remote_code=False, use_safetensors=True, local_files_only=True
    )
    return model, load_tokenizer(directory)


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer of a model directory: left padding, pad = eos when it has no pad token."""
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
