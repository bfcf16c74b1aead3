"""The relevance answer format as a decoding constraint (an ``agpo.rollout.constraint.DecodingConstraint``):
``AnswerGrammar``, a reason that contains neither tag and fits the cap, then the canonical
``<answer>k</answer>`` (no spaces inside the tag), then end of sequence. Every text it admits parses
(``pipelines.ads.teacher.relevance_reward.parse_grade``). For the ``hf`` engine it compiles to a token-level
automaton (``TokenAutomaton``) and a per-step mask (``GrammarMask``) that the decode loop applies; for vLLM
to a regex.

Algorithm
---------
The grammar is ``reason <answer>k</answer> EOS``. It is walked byte by byte over each token's bytes (the
byte-level BPE bytes, else the UTF-8 of its decoded text), so a token may span the reason, the tag and the
grade ("e <answer>2</", "2</answer>"). The automaton states are

- *reason* states: the longest suffix of the text so far that is a proper prefix of ``<answer>`` or
  ``</answer>`` (Aho-Corasick on the two tags, 15 states). Completing ``<answer>`` enters the answer;
  completing ``</answer>`` is dead (a second closing tag would not parse);
- *answer* states: the nodes of a trie of the strings ``k</answer>`` for k in the grades; its leaves
  admit only EOS;
- *done*, after EOS (everything allowed; the decode loop drops finished rows anyway).

Per state and token, once per tokenizer and grammar: the next state (or dead), the reason bytes the token
adds (``delta``; bytes that may still become part of ``<answer>`` count only once they cannot), and
``dist``: the fewest tokens from a state to EOS that add no reason bytes. Each row carries its state and
its reason byte count r; at a step with R tokens of budget left, token t is allowed when its next state is
alive, ``r + delta <= cap`` and ``dist(next) <= R - 1``. So the reason is free text (any token without a
tag), the cap holds, the answer is forced as soon as the remaining budget only fits it, and no row ever
reaches a state with nothing allowed (the zero-byte shortest path is always open). A step costs two
``[rows, vocab]`` gathers and a ``masked_fill``.

Log-probs recorded by the engine are of the constrained distribution (masked, renormalised): they are the
probabilities the tokens were sampled with, not the model's unconstrained ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from agpo.rollout.constraint import token_bytes
from pipelines.ads.teacher.relevance_reward import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ESCI_GRADES,
    MAX_REASON_CHARS,
    format_answer,
)

DEAD = -1
_FAR = 1 << 20  # "cannot finish"


@dataclass(frozen=True)
class AnswerGrammar:
    """The answer format as a decoding constraint: ``reason <answer>k</answer>`` then EOS.

    The reason may not contain ``<answer>`` or ``</answer>`` and is capped at ``max_reason_chars``
    (the ``hf`` engine counts UTF-8 bytes, which are never fewer than characters, so the cap holds for
    ``parse_grade``); k is one of ``grades``.
    """

    grades: tuple[int, ...] = ESCI_GRADES
    max_reason_chars: int = MAX_REASON_CHARS

    def __post_init__(self) -> None:
        if not self.grades or len(set(self.grades)) != len(self.grades):
            raise ValueError(f"grades must be distinct and non-empty, got {self.grades!r}")
        if not 0 <= self.max_reason_chars <= MAX_REASON_CHARS:
            raise ValueError(f"max_reason_chars must be in [0, {MAX_REASON_CHARS}], got {self.max_reason_chars!r}")

    def answers(self) -> list[str]:
        """The admitted answer tags, one per grade."""
        return [format_answer(g) for g in self.grades]

    def token_constraint(self, tokenizer) -> TokenAutomaton:
        """The grammar over ``tokenizer``'s vocabulary (the ``hf`` engine compiles it once per tokenizer)."""
        return TokenAutomaton(self, tokenizer)

    def regex(self) -> str:
        """A regex of (a subset of) the grammar for regex-constrained decoders such as vLLM's structured
        outputs: the reason is ``[^<]{0,cap}`` (no ``<`` at all: regex backends lack the lookahead that
        "no tag" needs), then one of the answer tags."""
        tags = "|".join(re.escape(a) for a in self.answers())
        return f"[^<]{{0,{self.max_reason_chars}}}(?:{tags})"


class TokenAutomaton:
    """The answer grammar over one tokenizer's vocabulary (see the module docstring)."""

    def __init__(self, grammar: AnswerGrammar, tokenizer) -> None:
        self.grammar, self.cap = grammar, grammar.max_reason_chars
        self.eos = tokenizer.eos_token_id
        opening, closing = ANSWER_OPEN.encode(), ANSWER_CLOSE.encode()
        prefixes = sorted({p[:i] for p in (opening, closing) for i in range(len(p))}, key=lambda s: (len(s), s))
        self.reason_states = {s: i for i, s in enumerate(prefixes)}
        literals = [f"{g}{ANSWER_CLOSE}".encode() for g in grammar.grades]
        nodes = sorted({lit[:i] for lit in literals for i in range(len(lit) + 1)}, key=lambda s: (len(s), s))
        self.answer_states = {s: len(prefixes) + i for i, s in enumerate(nodes)}
        self.leaves = {self.answer_states[lit] for lit in literals}
        self.done = len(prefixes) + len(nodes)
        self.start = self.reason_states[b""]
        self._opening, self._closing = opening, closing
        vocab = token_bytes(tokenizer)
        num_states = self.done + 1
        nxt = torch.full((num_states, len(vocab)), DEAD, dtype=torch.long)
        delta = torch.zeros((num_states, len(vocab)), dtype=torch.long)
        first_bytes = {
            node: {lit[len(node)] for lit in literals if lit.startswith(node) and lit != node} for node in nodes
        }
        for token_id, data in enumerate(vocab):
            if not data:
                continue
            for state, index in self.reason_states.items():
                nxt[index, token_id], delta[index, token_id] = self._walk(state, data)
            for node, index in self.answer_states.items():
                if data[0] in first_bytes[node]:
                    nxt[index, token_id] = self.answer_states.get(node + data, DEAD)
        for leaf in self.leaves:
            nxt[leaf, self.eos] = self.done
        nxt[self.done, :] = self.done
        self.next, self.delta = nxt, delta
        self.dist = self._distances()
        self.next_dist = torch.where(nxt >= 0, self.dist[nxt.clamp(min=0)], _FAR)
        if self.dist[self.start] >= _FAR:
            raise ValueError(f"the tokenizer cannot spell the answer grammar {grammar.answers()} (missing tokens)")

    def _pending(self, state: bytes) -> int:
        """Bytes of a reason state that may still become part of ``<answer>`` (not yet reason text)."""
        return len(state) if self._opening.startswith(state) else 0

    def _walk(self, state: bytes, data: bytes) -> tuple[int, int]:
        """(next state, reason bytes added) of a token read from reason state ``state``."""
        pending = self._pending(state)
        for i in range(len(data)):
            text = state + data[i : i + 1]
            if text == self._opening:
                rest = data[i + 1 :]
                return self.answer_states.get(rest, DEAD), pending + i + 1 - len(self._opening)
            if text == self._closing:
                return DEAD, 0
            state = next(text[j:] for j in range(len(text) + 1) if text[j:] in self.reason_states)
            if state == b"" and b"<" not in data[i + 1 :]:
                break
        return self.reason_states[state], pending + len(data) - self._pending(state)

    def _distances(self) -> torch.Tensor:
        """Fewest tokens from each state to EOS along moves that add no reason bytes."""
        dist = torch.full((self.done + 1,), _FAR, dtype=torch.long)
        dist[self.done] = 0
        usable = (self.next >= 0) & (self.delta == 0)
        for _ in range(self.done + 1):
            reach = torch.where(usable, dist[self.next.clamp(min=0)], _FAR).min(dim=1).values + 1
            new = torch.minimum(dist, reach)
            new[self.done] = 0
            if torch.equal(new, dist):
                break
            dist = new
        return dist

    def min_new_tokens(self) -> int:
        """The fewest tokens a complete answer takes (EOS included): the least ``max_new_tokens``."""
        return int(self.dist[self.start])

    def rows(self, count: int, device: torch.device) -> GrammarMask:
        return GrammarMask(self, count, device)


class GrammarMask:
    """Each decoding row's automaton state and reason byte count; masks a step's scores to the tokens the
    answer grammar allows (module docstring). The decode loop calls it once per step, then ``advance``
    with the chosen tokens, and ``keep`` when finished rows leave the batch."""

    def __init__(self, automaton: TokenAutomaton, rows: int, device: torch.device) -> None:
        self.next, self.delta = automaton.next.to(device), automaton.delta.to(device)
        self.next_dist, self.cap = automaton.next_dist.to(device), automaton.cap
        self.state = torch.full((rows,), automaton.start, dtype=torch.long, device=device)
        self.reason = torch.zeros(rows, dtype=torch.long, device=device)

    def __call__(self, scores: torch.Tensor, remaining: int) -> torch.Tensor:
        """``scores`` with disallowed tokens at -inf; ``remaining``: tokens of budget left, this one included."""
        vocab = self.next.shape[1]
        allowed = (self.next_dist[self.state] <= remaining - 1) & (
            self.reason[:, None] + self.delta[self.state] <= self.cap
        )
        if scores.shape[1] < vocab:  # tokenizer ids past the model's embedding (added tokens): never sampled
            allowed = allowed[:, : scores.shape[1]]
        elif scores.shape[1] > vocab:  # the model's padded vocabulary: ids no token spells
            allowed = torch.cat([allowed, allowed.new_zeros(len(allowed), scores.shape[1] - vocab)], dim=1)
        return scores.masked_fill(~allowed, float("-inf"))

    def advance(self, chosen: torch.Tensor) -> None:
        """Move each row along its chosen token."""
        self.reason += self.delta[self.state].gather(1, chosen[:, None]).squeeze(1)
        self.state = self.next[self.state].gather(1, chosen[:, None]).squeeze(1)

    def keep(self, index: torch.Tensor) -> None:
        """Keep only rows ``index`` (in that order)."""
        self.state, self.reason = self.state[index], self.reason[index]
