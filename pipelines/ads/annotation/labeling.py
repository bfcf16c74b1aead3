"""Teacher votes -> one label per pair: majority grade, vote counts, confidence, parse failures.

For each pair the teacher samples ``votes`` answers at ``temperature``; parseable answers fill the pair's
vote slots in order. A pair left with open slots (some answers did not parse) is sampled again, a whole
round of ``votes`` answers, up to ``max_retries`` more rounds; its parseable answers fill the open slots in
order and the rest of the round is dropped. Then

- ``votes[g]`` counts the filled slots that chose grade g;
- ``grade`` is the most voted grade; a tie goes to the *lower* grade (over-stating relevance costs an
  advertiser's money and a user's trust, under-stating costs less; agpo.evaluation.majority, the rule the
  teacher's maj@n gate uses too); null when no slot was filled (the pair is *abstained*);
- ``confidence`` = votes[grade] / votes requested, so unfilled slots lower it;
- ``parse_failures`` counts every unparseable answer seen, retries included.

Sampling is seeded per pair from ``(seed, pair_id, round)``, and the engines sample each row
independently of its batch-mates, so a pair gets the same label in any batch, shard or rerun.
Pairs are sorted by prompt length before being cut into generation batches, so padding stays small.
With ``constrained`` (the default) the votes are decoded within the answer grammar
(``agpo.rewards.relevance.AnswerGrammar``), so every answer parses; parse failures are still counted.
Pairs whose confidence is under ``review_threshold``, or abstained, also go to the human review queue
with the teacher's answers as its reasons.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from agpo.checks import require_int
from agpo.evaluation import majority
from agpo.rewards import ESCI_GRADES, parse_grade
from agpo.rewards.relevance import AnswerGrammar
from agpo.rollout import RolloutEngine, encode_prompts
from pipelines.ads.prompts import RelevancePrompt

LABELS_SCHEMA = pa.schema(
    [
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("grade", pa.int8()),
        pa.field("votes", pa.list_(pa.int16()), nullable=False),
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


@dataclass(frozen=True)
class VotingConfig:
    """How many answers the teacher gives per pair and how they become a label."""

    votes: int = field(default=4, metadata={"help": "answers sampled per pair"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the votes"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest answer in tokens"})
    max_retries: int = field(default=2, metadata={"help": "extra rounds for votes whose answer did not parse"})
    review_threshold: float = field(
        default=0.75, metadata={"help": "pairs with confidence below this (or abstained) go to the review queue"}
    )
    batch_pairs: int = field(default=128, metadata={"help": "pairs per generation call (rows = pairs x votes)"})
    seed: int = field(default=0, metadata={"help": "sampling seed (per pair: hash of seed and pair_id)"})
    constrained: bool = field(
        default=True,
        metadata={
            "help": "decode within the answer grammar (reason, <answer>k</answer>, EOS): every answer parses; "
            "needs max_new_tokens >= the shortest answer"
        },
    )

    def __post_init__(self) -> None:
        require_int("votes", self.votes, 1)
        require_int("max_new_tokens", self.max_new_tokens, 1)
        require_int("max_retries", self.max_retries, 0)
        require_int("batch_pairs", self.batch_pairs, 1)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 <= self.review_threshold <= 1:
            raise ValueError(f"review_threshold must be in [0, 1], got {self.review_threshold!r}")


def pair_seed(seed: int, pair_id: str, round_: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{pair_id}\x00{round_}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**62 - 1)


@dataclass
class LabelingStats:
    pairs: int = 0
    generated_tokens: int = 0
    generation_seconds: float = 0.0


class PairLabeler:
    """Labels batches of pairs with a teacher engine (see the module docstring for the rules)."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: Any,
        prompt: RelevancePrompt,
        config: VotingConfig,
        teacher_run_id: str,
        grades: Sequence[int] = ESCI_GRADES,
    ) -> None:
        if sorted(grades) != list(range(len(grades))):
            raise ValueError(f"grades must be 0..K-1, got {list(grades)}")
        self.engine, self.tokenizer, self.prompt, self.config = engine, tokenizer, prompt, config
        self.teacher_run_id, self.grades = teacher_run_id, tuple(grades)
        self.constraint = AnswerGrammar(self.grades) if config.constrained else None
        self.stats = LabelingStats()

    def label(self, pairs: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(label rows, review-queue rows) for ``pairs``, labels in the same order as ``pairs``."""
        self.stats.pairs += len(pairs)
        prompt_ids = encode_prompts(self.tokenizer, [self.prompt.render_pair(p) for p in pairs])
        order = sorted(range(len(pairs)), key=lambda i: len(prompt_ids[i]))
        answers: dict[int, PairAnswers] = {}
        step = self.config.batch_pairs
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            voted = self._vote([pairs[i] for i in batch], [prompt_ids[i] for i in batch])
            answers.update(zip(batch, voted, strict=True))
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

    def _label_row(self, pair: dict[str, Any], answers: PairAnswers) -> tuple[dict[str, Any], dict[str, Any] | None]:
        votes = [answers.grades.count(g) for g in range(len(self.grades))]
        grade = majority(answers.grades, tie="lowest")
        confidence = votes[grade] / self.config.votes if grade is not None else 0.0
        label = {
            "pair_id": pair["pair_id"],
            "grade": grade,
            "votes": votes,
            "confidence": confidence,
            "parse_failures": len(answers.failed),
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
            "teacher_answers": [t.strip() for t in answers.texts + answers.failed],
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
