"""Constrained decoding as the rollout engines see it: a protocol, with no output format of its own.

A :class:`DecodingConstraint` says which texts a generation may produce. The engines read it two ways:

- the ``hf`` engine compiles it once per tokenizer (``token_constraint``) into a :class:`TokenConstraint`:
  the fewest new tokens a complete text takes (``min_new_tokens``: the least ``max_new_tokens``), and, per
  decoding batch, a :class:`RowMask` (``rows``) that holds each row's state, masks a step's scores to the
  tokens allowed next given the row's prefix (the others to -inf, before the log-softmax, so the recorded
  log-probs are those of the masked, renormalised distribution), moves along the chosen tokens and drops
  finished rows;
- the ``vllm`` engine passes ``regex()`` to vLLM's structured outputs.

The relevance answer grammar (pipelines.ads.teacher.answer_grammar) is one such constraint; a math format or a JSON
schema would be another. ``token_bytes`` is the helper a byte-level constraint needs: the bytes each token id
adds to the text.
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import cache
from typing import Protocol

import torch


class RowMask(Protocol):
    """One decoding batch's rows under a constraint (``agpo.rollout.decode.RowSampling`` calls it)."""

    def __call__(self, scores: torch.Tensor, remaining: int) -> torch.Tensor:
        """``scores`` ``[rows, vocab]`` with the tokens not allowed next at -inf; ``remaining``: tokens of budget
        left, this one included."""
        ...

    def advance(self, chosen: torch.Tensor) -> None:
        """Move each row along its chosen token ``[rows]``."""
        ...

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows ``index`` (in that order)."""
        ...


class TokenConstraint(Protocol):
    """A constraint compiled for one tokenizer."""

    def min_new_tokens(self) -> int:
        """The fewest tokens a complete text takes (EOS included)."""
        ...

    def rows(self, count: int, device: torch.device) -> RowMask:
        """The state of ``count`` fresh rows, on ``device``."""
        ...


class DecodingConstraint(Hashable, Protocol):
    """What ``generate(..., constraint=)`` takes; hashable, so an engine compiles it once per tokenizer."""

    def token_constraint(self, tokenizer) -> TokenConstraint:
        """The constraint over ``tokenizer``'s vocabulary (the ``hf`` engine)."""
        ...

    def regex(self) -> str:
        """A regex of (a subset of) the admitted texts, for regex-constrained decoders (vLLM)."""
        ...


@cache
def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode (how byte-level BPE vocabularies spell bytes)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer) -> list[bytes | None]:
    """The bytes each token id adds to the text; None for special tokens (they decode to nothing)."""
    special = set(tokenizer.all_special_ids)
    decoder = _byte_decoder()
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    result: list[bytes | None] = []
    for token_id, piece in enumerate(pieces):
        if token_id in special or piece is None:
            result.append(None)
        elif all(c in decoder for c in piece):
            result.append(bytes(decoder[c] for c in piece))
        else:  # not byte-level BPE (or an added token): its decoded text
            result.append(tokenizer.decode([token_id]).encode("utf-8"))
    return result
