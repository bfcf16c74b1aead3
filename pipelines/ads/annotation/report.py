"""The annotation quality report: label distribution, abstentions, parse failures, agreement with gold
where gold exists (accuracy, macro-F1, confusion matrix), throughput. Written as JSON and one PNG.

The parse-failure rate is per answer the teacher writes (``votes`` per pair in sample mode, one greedy
answer in score mode); ``mean_confidence`` is the mean vote share or, in score mode, the mean top
probability. Throughput splits the teacher's time into generation (sampling, greedy decoding) and scoring
(score mode's teacher-forced grade endings); ``engine_time_share`` is both over the wall time.

Deduplication (pipelines.ads.annotation.dedup): ``counts`` holds ``distinct_pairs`` (pairs the teacher
graded) and ``duplicate_rows`` (labels fanned out from them); ``dedup_ratio`` = labels / distinct_pairs,
the labelled rows per graded pair; of the graded pairs, ``cache_hits`` were read from the label cache and
``cache_misses`` labelled by the teacher (pipelines.ads.annotation.label_cache). The review queue holds graded
pairs only, so ``review_rate`` is per distinct pair; every other rate is per label row (fanned-out labels count
as often as they occur).

Gold comes from the input rows' own ``gold_grade`` and from the optional ``gold`` Parquet (pair_id ->
gold_grade, e.g. the synthetic set's hidden ``unlabeled_gold.parquet``). Agreement is measured on the
pairs that have gold; abstained pairs count as wrong for accuracy and are reported separately.

``human_agreement`` scores the teacher against human review (``agpo review import`` adds it to the report
as ``human_agreement``): accuracy over the reviewed pairs (abstained ones count as wrong), Cohen's kappa
over the pairs the teacher graded, and the confusion matrix. The review queue holds the teacher's doubtful
pairs only, so these figures are lower than its agreement on all pairs would be.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from evaluation.metrics import cohen_kappa, confusion_matrix, macro_f1_from_confusion
from pipelines.ads.annotation.commits import shard_done, shard_file
from pipelines.ads.annotation.shards import shard_input
from pipelines.io import write_json_atomic
from pipelines.plots import plot_annotation_quality


def shard_gold(shard_input: Path, gold_path: str | None) -> dict[str, int]:
    """Gold grades of one shard's pairs: the input's own, then the gold file's for the shard's pair_ids
    (both read in batches; memory: the shard's pair_ids)."""
    gold: dict[str, int] = {}
    pair_ids: set[str] = set()
    for batch in pq.ParquetFile(shard_input).iter_batches(columns=["pair_id", "gold_grade"]):
        ids, grades = batch.column(0).to_pylist(), batch.column(1).to_pylist()
        pair_ids.update(ids)
        gold.update((p, g) for p, g in zip(ids, grades, strict=True) if g is not None)
    if gold_path and Path(gold_path).is_file():
        for batch in pq.ParquetFile(gold_path).iter_batches(columns=["pair_id", "gold_grade"]):
            for p, g in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                if g is not None and p in pair_ids:
                    gold[p] = g
    return gold


@dataclass
class LabelTally:
    """Label rows counted as they stream by: per-grade distribution, abstentions, parse failures, confidence,
    and against gold the confusion (gold x label) and the abstentions per gold grade."""

    grades: int
    rows: int = 0
    abstained: int = 0
    parse_failures: int = 0
    confidence: float = 0.0
    distribution: list[int] = field(init=False)
    confusion: list[list[int]] = field(init=False)
    abstained_by_gold: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.distribution = [0] * self.grades
        self.confusion = [[0] * self.grades for _ in range(self.grades)]
        self.abstained_by_gold = [0] * self.grades

    def add(self, labels: dict[str, list], gold: dict[str, int]) -> None:
        """One batch of label rows (pair_id, grade, parse_failures, confidence) and the shard's gold grades."""
        self.rows += len(labels["pair_id"])
        self.parse_failures += sum(labels["parse_failures"])
        self.confidence += sum(labels["confidence"])
        for pair_id, grade in zip(labels["pair_id"], labels["grade"], strict=True):
            if grade is None:
                self.abstained += 1
            else:
                self.distribution[grade] += 1
            truth = gold.get(pair_id)
            if truth is not None:
                if grade is None:
                    self.abstained_by_gold[truth] += 1
                else:
                    self.confusion[truth][grade] += 1

    def gold_agreement(self) -> dict[str, Any] | None:
        scored = sum(map(sum, self.confusion)) + sum(self.abstained_by_gold)
        if not scored:
            return None
        return {
            "pairs": scored,
            "accuracy": sum(self.confusion[g][g] for g in range(self.grades)) / scored,
            "macro_f1": macro_f1_from_confusion(confusion=self.confusion, missed_by_gold=self.abstained_by_gold),
            "abstained": sum(self.abstained_by_gold),
            "confusion_gold_by_label": self.confusion,
        }


def quality_report(config: Any, counts: dict[str, int], throughput: dict[str, Any], out: Path) -> dict[str, Path]:
    """Accumulated in batches of label rows: memory holds one batch and one shard's gold grades (pair id ->
    grade, only for pairs that have gold), never a whole shard's labels."""
    tally = LabelTally(len(config.input.grades))
    for shard in range(config.num_shards):
        gold = shard_gold(shard_input(out, shard), config.gold)
        labels_file = pq.ParquetFile(shard_file(out, shard_done(out, shard), "labels"))
        for batch in labels_file.iter_batches(columns=["pair_id", "grade", "parse_failures", "confidence"]):
            tally.add(batch.to_pydict(), gold)
    rows = tally.rows
    report: dict[str, Any] = {
        "mode": config.voting.mode,
        "counts": counts,
        "label_distribution": {str(g): tally.distribution[g] for g in range(tally.grades)},
        "abstention_rate": tally.abstained / max(rows, 1),
        "parse_failure_rate": tally.parse_failures / max(config.voting.answers_per_pair * rows, 1),
        "mean_confidence": tally.confidence / max(rows, 1),
        "review_rate": counts["review_queue"] / max(counts["distinct_pairs"], 1),
        "dedup_ratio": rows / max(counts["distinct_pairs"], 1),
    }
    agreement = tally.gold_agreement()
    if agreement is not None:
        report["gold_agreement"] = agreement
    report["throughput"] = throughput_figures(throughput)
    return {
        "report": write_json_atomic(out / "quality_report.json", report),
        "plot": plot_annotation_quality(report, out / "quality_report.png"),
    }


def throughput_figures(throughput: dict[str, Any]) -> dict[str, Any]:
    """The run's throughput with its rates (pairs/s, tokens/s, the engine's share of the time); {} untimed."""
    seconds = throughput.get("seconds")
    if not seconds:
        return {}
    return {
        **throughput,
        "pairs_per_s": throughput["pairs"] / seconds,
        "tokens_per_s": throughput["generated_tokens"] / seconds,
        "engine_tokens_per_s": throughput["generated_tokens"] / max(throughput["generation_seconds"], 1e-9),
        "engine_time_share": (throughput["generation_seconds"] + throughput.get("scoring_seconds", 0.0)) / seconds,
    }


def human_agreement(*, human: list[int], teacher: list[int | None], num_grades: int) -> dict[str, Any]:
    """The teacher's grades (None: abstained) against the human grades of the same reviewed pairs."""
    if len(human) != len(teacher) or not human:
        raise ValueError(f"human and teacher need one grade per reviewed pair, got {len(human)} and {len(teacher)}")
    graded = [(h, t) for h, t in zip(human, teacher, strict=True) if t is not None]
    truth, predicted = [h for h, _ in graded], [t for _, t in graded]
    return {
        "pairs": len(human),
        "accuracy": sum(h == t for h, t in graded) / len(human),
        "cohen_kappa": cohen_kappa(y_true=truth, y_pred=predicted, num_grades=num_grades) if graded else None,
        "abstained": len(human) - len(graded),
        "confusion_human_by_teacher": (
            confusion_matrix(y_true=truth, y_pred=predicted, num_grades=num_grades) if graded else None
        ),
    }
