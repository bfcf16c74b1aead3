"""Teacher answers -> one label per pair: grade, grade distribution, confidence, parse failures, in two modes.

``sample`` (the default): the teacher samples ``votes`` answers at ``temperature``; parseable answers fill
the pair's vote slots in order. A pair left with open slots (some answers did not parse) is sampled again, a
whole round of ``votes`` answers, up to ``max_retries`` more rounds; its parseable answers fill the open
slots in order and the rest of the round is dropped. Then

- ``votes[g]`` counts the filled slots that chose grade g; ``grade_probs`` is null;
- ``grade`` is the most voted grade; a tie goes to the *lower* grade (over-stating relevance costs an
  advertiser's money and a user's trust, under-stating costs less; agpo.sampling_metrics.majority, the rule the
  teacher's maj@n gate uses too); null when no slot was filled (the pair is *abstained*);
- ``confidence`` = votes[grade] / votes requested, so unfilled slots lower it;
- ``parse_failures`` counts every unparseable answer seen, retries included.

Sampling is seeded per pair from ``(seed, pair_id, round)``, each row independently of its batch-mates, so a pair
gets the same label in any batch, shard or rerun. With ``constrained`` (the default) the votes are decoded within
the answer grammar (``pipelines.ads.teacher.answer_grammar``), so every answer parses.

``score``: the teacher's exact grade distribution at the answer slot, nothing sampled (engine ``hf``).

1. The prefix r: a teacher whose answer format has a reason (it writes ``reason <answer>k</answer>``; the
   prompt's ``answer_format``, ``reason`` for a bare template) decodes one answer greedily within the
   answer grammar, and r is its text up to and including ``<answer>``. For an answer-only teacher r is the
   opening of its SFT target up to ``<answer>`` (the prompt's ``target``: `` <answer>`` after a plain
   prompt, ``<answer>`` in a chat turn), and nothing is decoded.
2. ``p(k) = P(k</answer> EOS | prompt, r)`` renormalised over the grades k: the summed token log-probs of
   each ending, teacher-forced in one batched pass and soft-maxed over the grades
   (``agpo.rollout.continuations``, through the engine's ``score_continuations``).
3. ``grade_probs`` = p; ``grade`` = argmax p (a tie goes to the lower grade); ``confidence`` = p(grade);
   ``votes`` all 0; ``parse_failures`` 1 when the greedy answer did not parse (the pair then abstains).

p is an answer-only teacher's whole grade distribution, exactly (votes only estimate it); for a reason teacher it
is the distribution *given its one greedy reason*, which mostly commits to a grade already (docs/annotation.md
has the figures). Greedy decoding and exact scoring make the labels deterministic: a rerun or a resumed run gives
identical labels; another sharding or ``chunk_pairs`` can move the probabilities in the last float32 bits.

In both modes pairs are sorted by prompt length into batches of ``batch_pairs``; pairs under ``review_threshold``
confidence, or abstained, also go to the human review queue with the teacher's answers as reasons.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch

from agpo.rollout import RolloutEngine, encode_prompts
from agpo.sampling_metrics import majority
from pipelines.ads.teacher.prompts import TeacherPrompt
from pipelines.ads.teacher.relevance_reward import ANSWER_OPEN, ESCI_GRADES, format_answer, parse_grade
from pipelines.ads.teacher.voting_config import SCORE_NEEDS_HF, VotingConfig
from pipelines.memory import release_free_memory

LABELS_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("grade", pa.int8()),
        pa.field("votes", pa.list_(pa.int16()), nullable=False),
        pa.field("grade_probs", pa.list_(pa.float32())),  # score mode's p(k); null in sample mode
        pa.field("confidence", pa.float32(), nullable=False),
        pa.field("parse_failures", pa.int16(), nullable=False),
        pa.field("teacher_run_id", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
    ]
)
REVIEW_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("query", pa.string(), nullable=False),
        pa.field("ad_title", pa.string(), nullable=False),
        pa.field("grade", pa.int8()),
        pa.field("confidence", pa.float32(), nullable=False),
        pa.field("abstained", pa.bool_(), nullable=False),
        pa.field("teacher_answers", pa.list_(pa.string()), nullable=False),
        pa.field("teacher_run_id", pa.string(), nullable=False),
        pa.field("prompt_version", pa.string(), nullable=False),
    ]
)


def pair_seed(seed: int, pair_id: str, round_: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{pair_id}\x00{round_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**62 - 1)


@dataclass
class LabelingStats:
    pairs: int = 0
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    scoring_seconds: float = 0.0  # score mode: teacher-forcing the grade endings


class PairLabeler:
    """Labels batches of pairs with a teacher engine (see the module docstring for the rules)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        prompt: TeacherPrompt,
        config: VotingConfig,
        teacher_run_id: str,
        grades: Sequence[int] = ESCI_GRADES,
    ) -> None:
        if sorted(grades) != list(range(len(grades))):
            raise ValueError(f"grades must be 0..K-1, got {list(grades)}")
        if config.mode == "score" and engine is not None and not hasattr(engine, "score_continuations"):
            raise ValueError(f"{SCORE_NEEDS_HF}; {type(engine).__name__} cannot score continuations")
        self.engine, self.tokenizer, self.prompt, self.config = engine, tokenizer, prompt, config
        self.teacher_run_id, self.grades = teacher_run_id, tuple(grades)
        self.constraint = prompt.grammar(self.grades) if config.constrained else None
        # score mode: the grade endings "k</answer>" and an answer-only teacher's prefix (" <answer>"), cut from
        # the canonical answer and the SFT target so that they cannot drift from them
        self.endings = [format_answer(g)[len(ANSWER_OPEN) :] for g in range(len(self.grades))]
        self.decodes_reason = prompt.answer_format == "reason"
        target = prompt.target(self.grades[0])
        self.answer_prefix = target[: target.index(ANSWER_OPEN) + len(ANSWER_OPEN)]
        self.stats = LabelingStats()

    def label(self, pairs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(label rows, review-queue rows) for ``pairs``, labels in the same order as ``pairs``."""
        self.stats.pairs += len(pairs)
        prompt_ids = encode_prompts(self.tokenizer, [self.prompt.render_pair(p) for p in pairs])
        order = sorted(range(len(pairs)), key=lambda i: len(prompt_ids[i]))
        read = self._score if self.config.mode == "score" else self._vote
        answers: dict[int, PairAnswers | PairScore] = {}
        step = self.config.batch_pairs
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            read_batch = read([pairs[i] for i in batch], [prompt_ids[i] for i in batch])
            answers.update(zip(batch, read_batch, strict=True))
            release_free_memory()  # the batch's freed tensors back to the system: RSS stays flat
        labels, review = [], []
        for i, pair in enumerate(pairs):
            label, queued = self._label_row(pair, answers[i])
            labels.append(label)
            if queued is not None:
                review.append(queued)
        return labels, review

    def _vote(self, pairs: list[dict[str, Any]], prompt_ids: list[list[int]]) -> list[PairAnswers]:
        """Sample ``votes`` answers per pair; pairs with open slots get whole new rounds (module docstring)."""
        config = self.config
        answers = [PairAnswers(config.votes) for _ in pairs]
        for round_ in range(config.max_retries + 1):
            todo = [i for i, a in enumerate(answers) if a.open_slots]
            if not todo:
                break
            started = time.perf_counter()
            rollout = self.engine.generate(
                [prompt_ids[i] for i in todo],
                n=config.votes,
                temperatures=config.temperature,
                max_new_tokens=config.max_new_tokens,
                seed=[pair_seed(config.seed, pairs[i]["pair_id"], round_) for i in todo],
                constraint=self.constraint,
            )
            self.stats.generation_seconds += time.perf_counter() - started
            self.stats.generated_tokens += rollout.num_tokens
            for row, text in zip(rollout.prompt_index, rollout.texts, strict=True):
                answers[todo[row]].add(text, parse_grade(text, self.grades))
        return answers

    def _score(self, pairs: list[dict[str, Any]], prompt_ids: list[list[int]]) -> list[PairScore]:
        """The exact grade distribution after each pair's greedy reason (module docstring, score mode)."""
        prefixes: list[str | None] = [self.answer_prefix] * len(pairs)
        texts = [""] * len(pairs)
        if self.decodes_reason:
            started = time.perf_counter()
            rollout = self.engine.generate(
                prompt_ids,
                n=1,
                temperatures=1.0,
                max_new_tokens=self.config.max_new_tokens,
                greedy=True,
                constraint=self.constraint,
            )
            self.stats.generation_seconds += time.perf_counter() - started
            self.stats.generated_tokens += rollout.num_tokens
            texts = rollout.texts
            prefixes = [
                t[: t.index(ANSWER_OPEN) + len(ANSWER_OPEN)] if parse_grade(t, self.grades) is not None else None
                for t in texts
            ]
        scorable = [i for i, prefix in enumerate(prefixes) if prefix is not None]
        started = time.perf_counter()
        logprobs = self.engine.score_continuations(
            [prompt_ids[i] for i in scorable], [prefixes[i] for i in scorable], self.endings
        )
        self.stats.scoring_seconds += time.perf_counter() - started
        scores = [PairScore(None, None, text) for text in texts]
        for row, i in enumerate(scorable):
            scores[i] = PairScore(logprobs[row].exp().tolist(), int(torch.argmax(logprobs[row])), prefixes[i])
        return scores

    def _label_row(
        self, pair: dict[str, Any], answers: PairAnswers | PairScore
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        if isinstance(answers, PairScore):
            votes, grade, probs = [0] * len(self.grades), answers.grade, answers.probs
            confidence = probs[grade] if grade is not None else 0.0
            failures, shown = int(grade is None), answers.shown(self.endings)
        else:
            votes = [answers.grades.count(g) for g in range(len(self.grades))]
            grade, probs = majority(answers.grades, tie="lowest"), None
            confidence = votes[grade] / self.config.votes if grade is not None else 0.0
            failures, shown = len(answers.failed), answers.texts + answers.failed
        label = {
            "pair_id": pair["pair_id"],
            "grade": grade,
            "votes": votes,
            "grade_probs": probs,
            "confidence": confidence,
            "parse_failures": failures,
            "teacher_run_id": self.teacher_run_id,
            "prompt_version": self.prompt.version,
        }
        if grade is not None and confidence >= self.config.review_threshold:
            return label, None
        queued = {
            "pair_id": pair["pair_id"],
            "query": pair["query"],
            "ad_title": pair["ad_title"],
            "grade": grade,
            "confidence": confidence,
            "abstained": grade is None,
            "teacher_answers": [t.strip() for t in shown],
            "teacher_run_id": self.teacher_run_id,
            "prompt_version": self.prompt.version,
        }
        return label, queued


class PairAnswers:
    """One pair's vote slots: parsed answers fill slots in order; unparseable ones are kept as failures."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.grades: list[int] = []
        self.texts: list[str] = []
        self.failed: list[str] = []

    @property
    def open_slots(self) -> int:
        return self.slots - len(self.grades)

    def add(self, text: str, grade: int | None) -> None:
        if grade is None:
            self.failed.append(text)
        elif self.open_slots:
            self.grades.append(grade)
            self.texts.append(text)


@dataclass(frozen=True)
class PairScore:
    """One pair's score-mode reading: p over the grades and its argmax, or None (the greedy answer did not
    parse); ``text``: the prefix that was scored, or the unparseable answer."""

    probs: list[float] | None
    grade: int | None
    text: str

    def shown(self, endings: Sequence[str]) -> list[str]:
        """What the review queue shows: the reason with the label's ending, or the unparseable answer."""
        return [self.text if self.grade is None else self.text + endings[self.grade]]
