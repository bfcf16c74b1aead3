"""The baselines a team has without this pipeline, fitted on its gold train pairs and scored like a student:
those ``evaluate.baselines.names`` names, each a class of evaluation.baseline_registry, which fits them
(``fit_baselines``). By default:

- ``zero-shot``: a sentence encoder (``encoder``; all-MiniLM-L6-v2 by default, packaged) read as a
  bi-encoder with no training: the cosine of query and ad, mapped to grades by the monotone ordinal head
  (student.ordinal) fitted on the gold train pairs. Its ranking (ROC-AUC, NDCG) is the cosine's own; only
  the grade cut-points are learned. It is also the floor no shipped student may fall below
  (pipelines.ads.distillation.distil).
- ``lexical``: the lexical matcher (evaluation.lexical: BM25, TF-IDF cosines of words and character n-grams,
  token, number and brand overlap, lengths; logistic regression) fitted on the gold train pairs.

Opt-in: ``bm25`` (evaluation.bm25: rank_bm25's score of the ad title, grades by a regression on it).

"The strongest baseline" on a metric is the comparison vocabulary's (evaluation.comparison).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from compute.placement import ON_CPU, Placement
from student.model import RelevanceStudent, StudentConfig


def gold_train_rows(pairs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gold-graded train pairs of a pairs file: what every baseline is fitted on."""
    return [r for r in pairs if r["split"] == "train" and r["gold_grade"] is not None]


def zero_shot_student(
    encoder: str,
    rows: Sequence[dict[str, Any]],
    num_grades: int,
    max_length: int = 96,
    placement: Placement = ON_CPU,
) -> RelevanceStudent:
    """``encoder`` as an untrained bi-encoder student, its ordinal head fitted to ``rows``' gold grades. Fitted
    once per process for the same encoder, pairs and grades (an evaluate step asks twice: the gold-only
    student's floor and the baseline; a run of every step in one process, three times), so the student is
    shared: callers only read it."""
    if not rows:
        raise ValueError("the zero-shot baseline needs gold-graded train pairs to fit its grade cut-points")
    pairs = tuple((r["query"], r["ad_title"], r["gold_grade"]) for r in rows)
    return _fitted_zero_shot(encoder, pairs, num_grades, max_length, placement)


@functools.lru_cache(maxsize=1)
def _fitted_zero_shot(
    encoder: str, pairs: tuple[tuple[str, str, int], ...], num_grades: int, max_length: int, placement: Placement
) -> RelevanceStudent:
    student = RelevanceStudent.build(
        StudentConfig(backbone=encoder, kind="bi", num_grades=num_grades, max_length=max_length)
    ).place(placement)
    queries, ads, grades = (list(column) for column in zip(*pairs, strict=True))
    student.fit_head(queries, ads, grades)
    return student
