"""The distillation's batches: seeded, length-grouped batches of labelled pairs, tokenized by a DataLoader.

Each epoch draws a permutation of the pairs from the run's generator (the one a checkpoint keeps). Grouped by
length (``length_grouped``), the permutation is cut into mega-batches of ``MEGABATCH`` batches, each sorted by
text length (characters of query + ad: the token count's proxy, known without tokenizing), cut into batches,
and the batches' order drawn again from the generator, as transformers' ``LengthGroupedSampler`` groups: a
batch then pads to pairs of similar length instead of to the longest of a random draw. Not grouped, the batches
are consecutive runs of the permutation.

An optimizer step takes ``accumulation_steps`` consecutive batches (``optimizer_steps``). The DataLoader's
workers tokenize (``LabelledBatch``: the student kind's feature groups, ``student.pair_features``) while the
model computes; 0 workers tokenize in this process. The batch order is decided here, in the main process, so
the workers change nothing a run computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from student.pair_features import featurize

MEGABATCH = 50  # batches sorted together: as transformers' LengthGroupedSampler (mega_batch_mult 50)


def epoch_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, length_grouped: bool
) -> list[list[int]]:
    """One epoch's batches of pair indices, drawn from ``generator`` (module docstring)."""
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not length_grouped:
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    span = batch_size * MEGABATCH
    for start in range(0, len(order), span):
        mega = sorted(order[start : start + span], key=lambda i: -lengths[i])  # stable: ties keep the draw's order
        cut = [mega[k : k + batch_size] for k in range(0, len(mega), batch_size)]
        batches += [cut[k] for k in torch.randperm(len(cut), generator=generator).tolist()]
    return batches


def optimizer_steps(batches: list[list[int]], accumulation_steps: int) -> list[list[list[int]]]:
    """The epoch's batches grouped into optimizer steps of ``accumulation_steps`` batches (the last may be short)."""
    return [batches[k : k + accumulation_steps] for k in range(0, len(batches), accumulation_steps)]


def text_lengths(rows: Sequence[dict[str, Any]]) -> list[int]:
    return [len(r["query"]) + len(r["ad_title"]) for r in rows]


@dataclass(frozen=True)
class LabelledBatch:
    """A DataLoader's ``collate_fn``: labelled rows -> the student kind's feature tensors and the loss's targets
    (votes, majority grade, pair weight, gold grade or -1, exact grade probabilities or zeros)."""

    tokenizer: Any
    groups: tuple[str, ...]
    max_length: int
    confidence_weighting: bool
    teacher_weight: float

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        queries, ads = [r["query"] for r in rows], [r["ad_title"] for r in rows]
        features = featurize(self.tokenizer, self.groups, queries, ads, self.max_length)
        votes = torch.tensor([r["votes"] for r in rows])
        grades = votes.shape[1]
        return {
            "features": {name: torch.from_numpy(values) for name, values in features.items()},
            "votes": votes,
            "grades": torch.tensor([r["grade"] for r in rows]),
            "weights": torch.tensor(pair_weights(rows, self.confidence_weighting, self.teacher_weight)),
            "gold": torch.tensor([-1 if r.get("gold_grade") is None else r["gold_grade"] for r in rows]),
            "probs": label_probs(rows, grades),
        }


def label_probs(rows: Sequence[dict[str, Any]], num_grades: int) -> torch.Tensor:
    """The rows' ``grade_probs`` as a [rows, grades] tensor, zeros where a row has none (sampled votes)."""
    return torch.tensor([r.get("grade_probs") or [0.0] * num_grades for r in rows], dtype=torch.float32)


def pair_weights(
    rows: Sequence[dict[str, Any]], confidence_weighting: bool, teacher_weight: float = 1.0
) -> list[float]:
    """w_i of the loss (student.training): the confidence under confidence weighting (else 1), times
    ``teacher_weight`` for a teacher-labeled row."""
    return [
        (float(r["confidence"]) if confidence_weighting else 1.0)
        * (teacher_weight if r.get("source") == "teacher" else 1.0)
        for r in rows
    ]
