"""The rollout engine protocol: sample n responses per prompt, each prompt at its own temperature."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from agpo.rollout.constraint import DecodingConstraint

FINISH_STOP, FINISH_LENGTH = "stop", "length"


@dataclass
class Rollout:
    """Responses in prompt-major order: rows ``i * n .. i * n + n - 1`` belong to prompt ``i``.

    ``token_ids`` hold the generated tokens, EOS included when the model stopped; ``logprobs`` hold the
    log-probability of each generated token under the sampling distribution (logits / temperature);
    ``finish_reasons`` are ``"stop"`` (EOS) or ``"length"`` (hit max_new_tokens).
    """

    prompt_index: list[int]
    token_ids: list[list[int]]
    texts: list[str]
    logprobs: list[list[float]]
    finish_reasons: list[str]

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)


class RolloutEngine(Protocol):
    """What the trainer and the annotator need from a generation backend (``hf``, ``vllm``)."""

    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        *,
        n: int,
        temperatures: float | Sequence[float],
        max_new_tokens: int,
        greedy: bool = False,
        seed: int | Sequence[int] | None = None,
        constraint: DecodingConstraint | None = None,
    ) -> Rollout:
        """n samples per prompt. ``seed``: one int for the call, or one seed per prompt (see ``row_seeds``).

        With per-prompt seeds a prompt's samples do not depend on which other prompts share the batch, so
        a batch split across data-parallel ranks samples exactly what one process would.
        ``constraint``: decode within it (agpo.rollout.constraint; e.g. the ads pipeline's answer grammar, so every
        answer parses); the log-probs are then those of the constrained (masked, renormalised) distribution.
        None (the default, and what training uses): unconstrained.
        """
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the engine generate with ``model``'s current weights (after an optimizer step)."""
        ...


def per_prompt_temperatures(temperatures: float | Sequence[float], num_prompts: int) -> list[float]:
    """One positive temperature per prompt, from a scalar or a sequence of that length."""
    if isinstance(temperatures, int | float):
        values = [float(temperatures)] * num_prompts
    else:
        values = [float(t) for t in temperatures]
        if len(values) != num_prompts:
            raise ValueError(f"need one temperature per prompt: {num_prompts} prompts, {len(values)} temperatures")
    bad = [t for t in values if not t > 0]
    if bad:
        raise ValueError(f"temperatures must be > 0, got {bad[0]!r}")
    return values


def per_prompt_seeds(seed: int | Sequence[int] | None, num_prompts: int) -> list[int] | None:
    """One seed per prompt: ``None`` stays unseeded, an int seeds prompt i with ``seed * 1_000_003 + i``."""
    if seed is None:
        return None
    if isinstance(seed, int):
        return [seed * 1_000_003 + i for i in range(num_prompts)]
    seeds = [int(s) for s in seed]
    if len(seeds) != num_prompts:
        raise ValueError(f"need one seed per prompt: {num_prompts} prompts, {len(seeds)} seeds")
    return seeds


def row_seed(prompt_seed: int, sample: int) -> int:
    """The seed of sample ``sample`` of a prompt seeded ``prompt_seed``: a 63-bit hash, so rows never collide."""
    digest = hashlib.blake2b(f"{prompt_seed}:{sample}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def check_generate_args(
    prompt_ids: Sequence[Sequence[int]],
    n: int,
    temperatures: float | Sequence[float],
    max_new_tokens: int,
    seed: int | Sequence[int] | None,
) -> tuple[list[float], list[int]]:
    """Validate a ``generate`` call; one temperature and one seed per prompt (unseeded: drawn from torch's
    global generator, so ``torch.manual_seed`` still governs)."""
    if n < 1 or max_new_tokens < 1:
        raise ValueError(f"n and max_new_tokens must be >= 1, got n={n}, max_new_tokens={max_new_tokens}")
    if any(len(p) == 0 for p in prompt_ids):
        raise ValueError("every prompt needs at least one token")
    temps = per_prompt_temperatures(temperatures, len(prompt_ids))
    seeds = per_prompt_seeds(seed, len(prompt_ids))
    if seeds is None:
        seeds = torch.randint(0, 2**62, (len(prompt_ids),)).tolist()
    return temps, seeds


def encode_prompts(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids of each prompt as the engines take them: no BOS/EOS added (templates carry their own)."""
    return [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
