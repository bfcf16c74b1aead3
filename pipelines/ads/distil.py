"""Stage ``agpo distil``: train the student on the team's gold grades and the teacher's labels.

What the student learns from (``label_source``):

- ``gold+teacher`` (the default): the pairs file's gold-graded train pairs with their gold grade (one-hot,
  confidence 1, source ``gold``) and the annotation run's labels of the other pairs (source ``teacher``:
  in score mode the teacher's grade distribution is the soft target, in sample mode its votes); a pair in
  both keeps its gold grade. ``training.teacher_weight`` weighs a teacher pair against a gold one;
- ``teacher``: the annotation run's labels alone;
- ``train-gold``: the gold train pairs alone, no labels folder: the student a team gets from the graded
  pairs it already had, without a teacher;
- ``gold``: the annotation run's pairs with their hidden gold grades (``gold``): the gold-label reference
  student, or with ``gold_noise: p`` a control whose gold grade is replaced by another grade on a seeded
  share p of them.

Teacher labels are read from ``labels/``, each file checked against the checksum its merge recorded; a
person's grade (``review_gold``, from ``agpo review import``) replaces the teacher label of its pair:
one-hot, confidence 1 and its gold grade, so ``training.gold_weight`` adds cross-entropy on it. The pairs'
text is joined from the pairs file and the student distils (student.distil) with early stopping on the
gold ``audit`` split, checkpointing every epoch into ``out_dir/checkpoints`` (a rerun after a kill
resumes; a rerun of a finished run writes the same model).

The zero-shot floor (``zero_shot_floor``, on by default): no student is shipped whose gold audit score on
``training.selection_metric`` (ROC-AUC of "relevant" by default) is below that of the zero-shot baseline
(pipelines.ads.baselines: the untrained ``zero_shot_encoder``'s cosine, graded by an ordinal fit on the gold
train pairs). Such a student is replaced by the zero-shot model itself (a bi-encoder student with no
training, servable like any other), and ``distil.json`` and the summary say so with both figures.

Writes into ``out_dir``: ``model/`` (``save_pretrained`` files plus ``model.onnx``) and ``distil.json``
(the label counts per source, the training history, the kind, what was shipped and the floor's figures;
``seconds`` is this invocation's wall time and ``resumed_from_epoch`` the epoch it resumed at, so a
rerun of a finished run reads as a reload, not as a fast training). ``agpo evaluate`` scores the model on
the gold test split.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from agpo.sampling_metrics import majority
from pipelines.ads.annotation.dedup import pair_key
from pipelines.ads.annotation.merge import verified_labels
from pipelines.ads.baselines import gold_train_rows, zero_shot_student
from pipelines.ads.contracts import ContractError, read_pairs
from pipelines.ads.distil_config import DistilConfig
from pipelines.devices import use_device
from pipelines.io import print_summary, require_file, write_json_atomic
from pipelines.progress import progress_bar
from pipelines.threads import use_threads
from student.distil import distil, resolved_schedule, validation_scores
from student.export import export_onnx
from student.model import RelevanceStudent
from student.model_config import Placement


def one_hot(pair_id: str, grade: int, grades: int, source: str = "gold") -> dict[str, Any]:
    """A label row that is certain of ``grade`` (gold labels as the student reads teacher labels)."""
    votes = [int(g == grade) for g in range(grades)]
    return {"pair_id": pair_id, "grade": grade, "confidence": 1.0, "votes": votes, "source": source}


def training_rows(config: DistilConfig, text: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Labeled pairs with their text and ``source`` (gold, teacher or human); gold rows: one-hot votes of a
    gold grade. Under ``gold+teacher`` a pair with a gold train grade keeps it over the teacher's label."""
    grades = config.student.num_grades
    rows: list[dict[str, Any]] = []
    if config.label_source in ("train-gold", "gold+teacher"):
        rows = [one_hot(r["pair_id"], r["gold_grade"], grades) for r in gold_train_rows(list(text.values()))]
        if not rows:
            raise ContractError(
                f"{config.pairs} has no gold-graded train pairs for label_source: {config.label_source}; grade "
                "some train pairs or use label_source: teacher"
            )
    if config.label_source != "train-gold":
        labeled = annotation_rows(config, text)
        if config.review_gold is not None:
            labeled = with_human_grades(labeled, config.review_gold, text, grades)
        gold = {r["pair_id"] for r in rows}
        rows += [r for r in labeled if r["pair_id"] not in gold]
    return [{**r, "query": text[r["pair_id"]]["query"], "ad_title": text[r["pair_id"]]["ad_title"]} for r in rows]


def annotation_rows(config: DistilConfig, text: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The label rows of the annotation run, source ``teacher`` (label_source ``gold``: the same pairs with
    their hidden gold grade, source ``gold``)."""
    rows = [{**r, "source": "teacher"} for f in verified_labels(config.labels) for r in pq.read_table(f).to_pylist()]
    missing = [r["pair_id"] for r in rows if r["pair_id"] not in text]
    if missing:
        raise ContractError(f"{len(missing)} labeled pair_ids are not in {config.pairs}, e.g. {missing[0]!r}")
    if config.label_source == "gold":
        if config.gold is None:
            raise ContractError("label_source gold needs the labeled pairs' hidden gold: set gold to its Parquet file")
        gold_file = require_file(config.gold, "gold file", "fix gold or run `agpo data` first", ContractError)
        table = pq.read_table(gold_file)
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
    1, and ``gold_grade`` set, so the gold term (``training.gold_weight``) applies to it; a graded pair the
    teacher abstained on becomes usable. Annotation's dedup puts one row per distinct (query, ad text) in the
    review queue, so a human grade also replaces the label of every row with the same dedup key (its
    copies); a key graded by several people takes their majority (ties to the lower grade)."""
    fix = "run `agpo review import` or unset review_gold"
    path = require_file(review_gold, "human gold labels file", fix, FileNotFoundError)
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
        replaced.append(r if grade is None else {**one_hot(r["pair_id"], grade, grades, "human"), "gold_grade": grade})
    extra = [{**one_hot(p, g, grades, "human"), "gold_grade": g} for p, g in sorted(human.items()) if p not in labeled]
    return replaced + extra


def zero_shot_floor(
    config: DistilConfig,
    pairs: list[dict[str, Any]],
    validation: list[dict[str, Any]],
    student_score: float,
    placement: Placement,
) -> tuple[RelevanceStudent | None, dict[str, Any]]:
    """The zero-shot student (on ``placement``) when the trained student's audit score
    (``training.selection_metric``) is below it (else None), and the figures of the comparison
    (``zero_shot_floor`` off or no gold train pairs: not checked, and why)."""
    if not config.zero_shot_floor:
        return None, {"checked": False, "why": "zero_shot_floor is off"}
    gold_rows = gold_train_rows(pairs)
    if not gold_rows:
        return None, {"checked": False, "why": f"{config.pairs} has no gold-graded train pairs to fit it on"}
    zero_shot = zero_shot_student(
        config.zero_shot_encoder, gold_rows, config.student.num_grades, config.student.max_length, placement
    )
    metric = config.training.selection_metric
    floor = validation_scores(zero_shot, validation, config.training.relevant_from)[f"val_{metric}"]
    figures = {
        "checked": True,
        "encoder": config.zero_shot_encoder,
        "metric": metric,
        "zero_shot_audit": floor,
        "student_audit": student_score,
    }
    return (zero_shot if student_score < floor else None), figures


def run(config: DistilConfig) -> dict[str, Path]:
    threads, device = use_threads(config.threads), use_device(config)
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
    ).place(device.placement())
    out = Path(config.out_dir)
    metric = f"val_{config.training.selection_metric}"
    with progress_bar(total=config.training.epochs, desc=f"distil ({config.label_source} labels)", unit="epoch") as bar:

        def progress(record: dict[str, float]) -> None:
            bar.set_postfix(val=f"{record[metric]:.3f}", refresh=False)
            bar.update(record["epoch"] > 0)

        result = distil(
            student, rows, validation, config.training, on_epoch=progress, checkpoint_dir=out / "checkpoints"
        )
    zero_shot, floor = zero_shot_floor(config, pairs, validation, result.best_val, device.placement())
    shipped = student if zero_shot is None else zero_shot
    model_dir = shipped.save(out / "model")
    if config.export_onnx:
        export_onnx(shipped, model_dir)
    seconds = time.perf_counter() - started  # this invocation's: a resumed run's last epochs only
    summary = _summary(config, rows, result, student, zero_shot is not None, floor, seconds)
    paths = {"model": model_dir, "summary": write_json_atomic(out / "distil.json", summary)}
    print_summary(_headline(config, summary, floor), paths, threads, device)
    return paths


def _summary(config, rows, result, student, floored: bool, floor: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``distil.json``: what the student learned from, what shipped and its early-stopping history."""
    sources = Counter(r["source"] for r in rows if r["grade"] is not None)
    return {
        "label_source": config.label_source,
        "labels": config.labels,
        "review_gold": config.review_gold,
        "human_graded_pairs": sources.get("human", 0),
        "training_pairs": len(rows),
        "training_pairs_by_source": dict(sorted(sources.items())),
        "teacher_weight": config.training.teacher_weight,
        "gold_noise": config.gold_noise,
        "abstained_skipped": result.skipped_abstained,
        "kind": student.kind,
        "shipped": "zero-shot" if floored else "student",
        "zero_shot_floor": floor,
        "best_epoch": result.best_epoch,
        "selection_metric": config.training.selection_metric,
        "best_val": result.best_val,
        "learning_rate_and_schedule": list(resolved_schedule(config.training, student.pretrained)),
        "history": result.history,
        "seconds": round(seconds, 1),
        "resumed_from_epoch": result.resumed_from_epoch,
    }


def _headline(config: DistilConfig, summary: dict[str, Any], floor: dict[str, Any]) -> str:
    counts = ", ".join(f"{n:,} {source}" for source, n in summary["training_pairs_by_source"].items())
    metric = summary["selection_metric"]
    epochs = sum(record["epoch"] > 0 for record in summary["history"])
    best = "epoch 0 (the untrained encoder)" if summary["best_epoch"] == 0 else f"epoch {summary['best_epoch']}"
    headline = (
        f"student ({summary['kind']}) from {config.label_source} labels ({counts}): best {best} of {epochs}, "
        f"gold audit {metric} {summary['best_val']:.3f}"
    )
    if summary["shipped"] == "zero-shot":
        headline += (
            f"\nbelow the zero-shot floor ({config.zero_shot_encoder}, audit {metric} "
            f"{floor['zero_shot_audit']:.3f}): shipping the zero-shot encoder instead of this student"
        )
    return headline + "; score it with `agpo evaluate`"
