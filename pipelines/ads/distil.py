"""Stage ``agpo distil``: train the student on the teacher's labels.

Reads the annotation run's ``labels/``, each file checked against the checksum its merge recorded (or,
with ``label_source: gold``, the hidden gold grades of the same pairs: the gold-label reference student,
or with ``gold_noise: p`` a control whose gold grade is replaced by another grade on a seeded share p of them;
with ``train-gold``, the gold grades of the pairs file's train split, no labels folder: the student a team
gets from the graded pairs it already had, without a teacher), replaces the teacher label of every pair a
person graded (``review_gold``, from ``agpo review import``) with that grade: one-hot, confidence 1 and
its gold grade, so ``distill.gold_weight`` adds cross-entropy on it, joins the pairs' text from the pairs
file and distils
(student.distill) with early stopping on the gold ``audit`` split, checkpointing every epoch into
``out_dir/checkpoints`` (a rerun after a kill resumes; a rerun of a finished run writes the same model).
Writes into ``out_dir``: ``model/`` (``save_pretrained`` files plus ``model.onnx``) and ``distil.json``
(the training history; ``seconds`` is this invocation's wall time and ``resumed_from_epoch`` the epoch it
resumed at, so a rerun of a finished run reads as a reload, not as a fast training). ``agpo evaluate``
scores the model on the gold test split.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from tqdm import tqdm

from agpo.checks import require_choice
from agpo.evaluation import majority
from pipelines.ads.annotation.dedup import pair_key
from pipelines.ads.annotation.merge import verified_labels
from pipelines.ads.contracts import ContractError, read_pairs
from pipelines.io import print_summary, write_json_atomic
from student.distill import DistillConfig, distill, resolved_schedule
from student.export import export_onnx
from student.model import RelevanceStudent, StudentConfig

LABEL_SOURCES = ("teacher", "gold", "train-gold")


@dataclass(frozen=True)
class DistilConfig:
    """Labels to learn from, gold splits to stop and score on, and the student."""

    labels: str = field(default="work/annotate/labels", metadata={"help": "labels Parquet folder (agpo annotate)"})
    pairs: str = field(default="work/data/pairs.parquet", metadata={"help": "pairs file: text, audit and test gold"})
    label_source: str = field(default="teacher", metadata={"help": f"one of {list(LABEL_SOURCES)}"})
    gold: str = field(
        default="work/data/unlabeled_gold.parquet",
        metadata={"help": "hidden gold of the labeled pairs (label_source: gold)"},
    )
    gold_noise: float = field(
        default=0.0,
        metadata={
            "help": "label_source gold: replace the grade of round(p * pairs) pairs, drawn with gold_noise_seed, by "
            "another grade drawn uniformly (a control of known label accuracy 1 - p); 0: clean gold"
        },
    )
    gold_noise_seed: int = field(default=0, metadata={"help": "seed of gold_noise (fixed across student seeds)"})
    review_gold: str | None = field(
        default=None,
        metadata={
            "help": "human grades from `agpo review import` (gold_labels.parquet): each replaces its pair's teacher "
            "label (one-hot, confidence 1, gold term weighted by distill.gold_weight); null: none"
        },
    )
    out_dir: str = field(default="work/student", metadata={"help": "output folder"})
    student: StudentConfig = field(default_factory=StudentConfig, metadata={"help": "the student model"})
    distill: DistillConfig = field(default_factory=DistillConfig, metadata={"help": "distillation"})
    export_onnx: bool = field(default=True, metadata={"help": "also write model/model.onnx (onnxruntime serving)"})

    def __post_init__(self) -> None:
        require_choice("label_source", self.label_source, LABEL_SOURCES)
        if not 0 <= self.gold_noise < 1 or (self.gold_noise and self.label_source != "gold"):
            raise ValueError(f"gold_noise must be in [0, 1) and needs label_source: gold, got {self.gold_noise!r}")
        if self.review_gold is not None and self.label_source != "teacher":
            raise ValueError("review_gold replaces teacher labels: it needs label_source: teacher")


def one_hot(pair_id: str, grade: int, grades: int) -> dict[str, Any]:
    """A label row that is certain of ``grade`` (gold labels as the student reads teacher labels)."""
    return {"pair_id": pair_id, "grade": grade, "confidence": 1.0, "votes": [int(g == grade) for g in range(grades)]}


def training_rows(config: DistilConfig, text: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Labeled pairs with their text; gold sources: one-hot votes of a gold grade."""
    grades = config.student.num_grades
    if config.label_source == "train-gold":
        rows = [
            one_hot(pair_id, r["gold_grade"], grades)
            for pair_id, r in text.items()
            if r["split"] == "train" and r["gold_grade"] is not None
        ]
        if not rows:
            raise ContractError(f"{config.pairs} has no gold-graded train pairs for label_source: train-gold")
    else:
        rows = annotation_rows(config, text)
        if config.review_gold is not None:
            rows = with_human_grades(rows, config.review_gold, text, grades)
    return [{**r, "query": text[r["pair_id"]]["query"], "ad_title": text[r["pair_id"]]["ad_title"]} for r in rows]


def annotation_rows(config: DistilConfig, text: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The label rows of the annotation run (source ``gold``: the same pairs, their hidden gold grade)."""
    rows = [r for f in verified_labels(config.labels) for r in pq.read_table(f).to_pylist()]
    missing = [r["pair_id"] for r in rows if r["pair_id"] not in text]
    if missing:
        raise ContractError(f"{len(missing)} labeled pair_ids are not in {config.pairs}, e.g. {missing[0]!r}")
    if config.label_source == "gold":
        table = pq.read_table(config.gold)
        gold = dict(zip(table["pair_id"].to_pylist(), table["gold_grade"].to_pylist(), strict=True))
        grades = config.student.num_grades
        graded = [(r["pair_id"], gold[r["pair_id"]]) for r in rows if gold.get(r["pair_id"]) is not None]
        rows = [one_hot(pair_id, grade, grades) for pair_id, grade in corrupted(graded, config, grades)]
    return rows


def corrupted(graded: list[tuple[str, int]], config: DistilConfig, grades: int) -> list[tuple[str, int]]:
    """(pair_id, grade) with exactly round(gold_noise * n) grades, drawn with ``gold_noise_seed``, replaced by
    a different grade drawn uniformly from the others: labels whose accuracy against gold is known exactly."""
    rng = random.Random(config.gold_noise_seed)
    flipped = set(rng.sample(range(len(graded)), round(config.gold_noise * len(graded))))
    return [
        (pair_id, rng.choice([g for g in range(grades) if g != grade]) if i in flipped else grade)
        for i, (pair_id, grade) in enumerate(graded)
    ]


def with_human_grades(
    rows: list[dict[str, Any]], review_gold: str, text: dict[str, dict[str, Any]], grades: int
) -> list[dict[str, Any]]:
    """Teacher label rows with every human-graded pair's row replaced by its human grade: one-hot, confidence
    1, and ``gold_grade`` set, so the gold term (``distill.gold_weight``) applies to it; a graded pair the
    teacher abstained on becomes usable. Annotation's dedup puts one row per distinct (query, ad text) in the
    review queue, so a human grade also replaces the label of every row with the same dedup key (its
    copies); a key graded by several people takes their majority (ties to the lower grade)."""
    path = Path(review_gold)
    if not path.is_file():
        raise FileNotFoundError(f"no human gold labels at {path}; run `agpo review import` or unset review_gold")
    table = pq.read_table(path, columns=["pair_id", "grade"])
    human = dict(zip(table["pair_id"].to_pylist(), table["grade"].to_pylist(), strict=True))
    unknown = [p for p in human if p not in text]
    if unknown:
        raise ContractError(f"{len(unknown)} human-graded pair_ids are not in the pairs file, e.g. {unknown[0]!r}")
    by_key: dict[bytes, list[int]] = {}
    for pair_id, grade in human.items():
        by_key.setdefault(pair_key(text[pair_id]), []).append(grade)
    key_grade = {key: majority(votes, tie="lowest") for key, votes in by_key.items()}

    def human_grade(pair_id: str) -> int | None:
        return human[pair_id] if pair_id in human else key_grade.get(pair_key(text[pair_id]))

    labeled = {r["pair_id"] for r in rows}
    replaced = []
    for r in rows:
        grade = human_grade(r["pair_id"])
        replaced.append(r if grade is None else {**one_hot(r["pair_id"], grade, grades), "gold_grade": grade})
    extra = [{**one_hot(p, g, grades), "gold_grade": g} for p, g in sorted(human.items()) if p not in labeled]
    return replaced + extra


def run(config: DistilConfig) -> dict[str, Path]:
    pairs = read_pairs(config.pairs).to_pylist()
    text = {r["pair_id"]: r for r in pairs}
    validation = [r for r in pairs if r["split"] == "audit" and r["gold_grade"] is not None]
    if not validation:
        raise ContractError(f"{config.pairs} needs a gold audit split for early stopping; it has none")
    rows = training_rows(config, text)
    started = time.perf_counter()
    # the tokenizer learns from every split but test: the test pairs stay unseen until evaluation
    student = RelevanceStudent.build(
        config.student, texts=[f"{r['query']} {r['ad_title']}" for r in pairs if r["split"] != "test"]
    )
    out = Path(config.out_dir)
    with tqdm(total=config.distill.epochs, desc=f"distil ({config.label_source} labels)", unit="epoch") as bar:

        def progress(record: dict[str, float]) -> None:
            bar.set_postfix(val_f1=f"{record['val_macro_f1']:.3f}", refresh=False)
            bar.update()

        result = distill(
            student, rows, validation, config.distill, on_epoch=progress, checkpoint_dir=out / "checkpoints"
        )
    model_dir = student.save(out / "model")
    if config.export_onnx:
        export_onnx(student, model_dir)
    summary = {
        "label_source": config.label_source,
        "labels": config.labels,
        "review_gold": config.review_gold,
        "human_graded_pairs": sum(r.get("gold_grade") is not None for r in rows) if config.review_gold else 0,
        "training_pairs": len(rows),
        "gold_noise": config.gold_noise,
        "abstained_skipped": result.skipped_abstained,
        "best_epoch": result.best_epoch,
        "best_val_macro_f1": result.best_val_macro_f1,
        "learning_rate_and_schedule": list(resolved_schedule(config.distill, student.pretrained)),
        "history": result.history,
        "seconds": round(time.perf_counter() - started, 1),  # this invocation's: a resumed run's last epochs only
        "resumed_from_epoch": result.resumed_from_epoch,
    }
    paths = {"model": model_dir, "summary": write_json_atomic(out / "distil.json", summary)}
    print_summary(
        f"student from {config.label_source} labels ({len(rows):,} pairs): best epoch {result.best_epoch} of "
        f"{len(result.history)}, gold audit macro-F1 {result.best_val_macro_f1:.3f}; score it with `agpo evaluate`",
        paths,
    )
    return paths
