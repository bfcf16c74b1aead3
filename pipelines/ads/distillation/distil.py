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
text is joined from the pairs file and the student distils (student.training) with early stopping on the
gold ``audit`` split, checkpointing every epoch into ``out_dir/checkpoints`` (a rerun after a kill
resumes; a rerun of a finished run writes the same model).

The zero-shot floor (``zero_shot_floor``, on by default): no student is shipped whose gold audit score on
``training.selection_metric`` (ROC-AUC of "relevant" by default) is below that of the zero-shot baseline
(evaluation.zero_shot: the untrained ``zero_shot_encoder``'s cosine, graded by an ordinal fit on the gold
train pairs). Such a student is replaced by the zero-shot model itself (a bi-encoder student with no
training, servable like any other), and ``distil.json`` and the summary say so with both figures.

Writes into ``out_dir``: ``model/`` (``save_pretrained`` files plus ``student.onnx``) and ``distil.json``
(the label counts per source, the training history, the kind, what was shipped and the floor's figures;
``seconds`` is this invocation's wall time and ``resumed_from_epoch`` the epoch it resumed at, so a
rerun of a finished run reads as a reload, not as a fast training). ``agpo evaluate`` scores the model on
the gold test split.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agpo.sampling_metrics import majority
from compute.placement import Placement
from evaluation.backend_choice import choose_backend
from evaluation.metrics import validation_scores
from evaluation.zero_shot import gold_train_rows, zero_shot_student
from pipelines.ads.annotation.dedup import pair_key
from pipelines.ads.annotation.merge import verified_labels
from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.intake.contracts import ContractError, gold_rows, read_pairs, tokenizer_pairs
from pipelines.devices import use_device
from pipelines.io import print_summary, require_file, write_json_atomic
from pipelines.progress import progress_bar
from pipelines.threads import use_threads
from student.export import export_onnx
from student.model import RelevanceStudent
from student.pair_rows import READ_BATCH_ROWS, PairRows
from student.training import distil, resolved_schedule, score_validation

# the columns the student reads (student.training), typed so that every source casts to them exactly
TRAINING_SCHEMA = pa.schema(
    [
        ("pair_id", pa.string()),
        ("query", pa.string()),
        ("ad_title", pa.string()),
        ("grade", pa.int64()),
        ("votes", pa.list_(pa.int64())),
        ("grade_probs", pa.list_(pa.float64())),
        ("confidence", pa.float64()),
        ("gold_grade", pa.int64()),
        ("source", pa.string()),
    ]
)
LABEL_SCHEMA = pa.schema([field for field in TRAINING_SCHEMA if field.name not in ("query", "ad_title")])


def one_hot(pair_id: str, grade: int, grades: int, source: str = "gold") -> dict[str, Any]:
    """A label row that is certain of ``grade`` (gold labels as the student reads teacher labels)."""
    votes = [int(g == grade) for g in range(grades)]
    return {"pair_id": pair_id, "grade": grade, "confidence": 1.0, "votes": votes, "source": source}


def training_rows(config: DistilConfig, pairs: pa.Table) -> PairRows:
    """Labeled pairs with their text and ``source`` (gold, teacher or human), columnar: gold rows first (one-hot
    votes of a gold grade), then the labels in file order. Under ``gold+teacher`` a pair with a gold train
    grade keeps it over the teacher's label. Python rows are made of the gold pairs and a batch of labels at a
    time only, so a run over millions of teacher labels holds them as Arrow columns."""
    grades = config.student.num_grades
    gold: list[dict[str, Any]] = []
    if config.label_source in ("train-gold", "gold+teacher"):
        gold = [
            {**one_hot(r["pair_id"], r["gold_grade"], grades), "query": r["query"], "ad_title": r["ad_title"]}
            for r in gold_train_rows(gold_rows(pairs))
        ]
        if not gold:
            raise ContractError(
                f"{config.pairs} has no gold-graded train pairs for label_source: {config.label_source}; grade "
                "some train pairs or use label_source: teacher"
            )
    tables = [pa.Table.from_pylist(gold, schema=TRAINING_SCHEMA)]
    if config.label_source != "train-gold":
        labeled = annotation_labels(config, pairs)
        if config.review_gold is not None:
            labeled = with_human_grades(labeled, HumanGrades.read(config.review_gold, pairs), grades)
        graded = pa.array([r["pair_id"] for r in gold], pa.string())
        tables.append(labeled.filter(pc.invert(pc.is_in(labeled["pair_id"], value_set=graded))))
    return PairRows(pa.concat_tables(tables))


def annotation_labels(config: DistilConfig, pairs: pa.Table) -> pa.Table:
    """The label rows of the annotation run with their text (``TRAINING_SCHEMA``), source ``teacher``
    (label_source ``gold``: the same pairs with their hidden gold grade, source ``gold``)."""
    files = verified_labels(config.labels)  # never empty: a merge that recorded no file is refused there
    raw = pa.concat_tables([label_columns(pq.read_table(f), "teacher") for f in files])
    labels = with_text(raw, pairs, config.pairs)
    if config.label_source != "gold":
        return labels
    if config.gold is None:
        raise ContractError("label_source gold needs the labeled pairs' hidden gold: set gold to its Parquet file")
    gold_file = require_file(config.gold, "gold file", "fix gold or run `agpo data` first", ContractError)
    gold = pq.read_table(gold_file, columns=["pair_id", "gold_grade"])
    at = pc.index_in(labels["pair_id"], value_set=gold["pair_id"].combine_chunks())
    grade = gold["gold_grade"].take(at)
    has_gold = pc.is_valid(grade)
    kept = labels.filter(has_gold)
    graded = list(zip(kept["pair_id"].to_pylist(), grade.filter(has_gold).to_pylist(), strict=True))
    texts = zip(kept["query"].to_pylist(), kept["ad_title"].to_pylist(), strict=True)
    grades = config.student.num_grades
    rows = [
        one_hot(pair_id, g, grades) | {"query": query, "ad_title": ad_title}
        for (pair_id, g), (query, ad_title) in zip(corrupted(graded, config, grades), texts, strict=True)
    ]
    return pa.Table.from_pylist(rows, schema=TRAINING_SCHEMA)


def label_columns(table: pa.Table, source: str) -> pa.Table:
    """A label file's columns in ``LABEL_SCHEMA`` (exact casts: wider ints and floats), tagged ``source``; a
    column the file lacks (``grade_probs`` in sample mode, ``gold_grade``) is null."""
    columns = {
        field.name: table[field.name] if field.name in table.column_names else pa.nulls(table.num_rows, field.type)
        for field in LABEL_SCHEMA
        if field.name != "source"
    }
    return pa.table(columns | {"source": pa.repeat(source, table.num_rows)}).cast(LABEL_SCHEMA)


def with_text(labels: pa.Table, pairs: pa.Table, source: object) -> pa.Table:
    """``labels`` with each pair's query and ad title from ``pairs`` (``TRAINING_SCHEMA``, the labels' order); a
    label of a pair that ``pairs`` (read from ``source``) does not hold is an error naming it."""
    at = pc.index_in(labels["pair_id"], value_set=pairs["pair_id"].combine_chunks())
    missing = labels["pair_id"].filter(pc.is_null(at))
    if len(missing):
        raise ContractError(f"{len(missing)} labeled pair_ids are not in {source}, e.g. {missing[0].as_py()!r}")
    text = pairs.select(["query", "ad_title"]).take(at)
    columns = {name: labels[name] for name in labels.column_names} | {n: text[n] for n in ("query", "ad_title")}
    return pa.table({field.name: columns[field.name] for field in TRAINING_SCHEMA}).cast(TRAINING_SCHEMA)


def pair_texts(pairs: pa.Table) -> Iterator[str]:
    """Each pair's "query ad_title", a batch of rows at a time (the tiny backbone's tokenizer corpus)."""
    return (f"{r['query']} {r['ad_title']}" for r in PairRows(pairs.select(["query", "ad_title"])))


def corrupted(graded: list[tuple[str, int]], config: DistilConfig, grades: int) -> list[tuple[str, int]]:
    """(pair_id, grade) with exactly round(gold_noise * n) grades, drawn with ``gold_noise_seed``, replaced by
    a different grade drawn uniformly from the others: labels whose accuracy against gold is known exactly."""
    rng = random.Random(config.gold_noise_seed)
    flipped = set(rng.sample(range(len(graded)), round(config.gold_noise * len(graded))))
    return [
        (pair_id, rng.choice([g for g in range(grades) if g != grade]) if i in flipped else grade)
        for i, (pair_id, grade) in enumerate(graded)
    ]


@dataclass(frozen=True)
class HumanGrades:
    """People's grades (``review_gold``, from ``agpo review import``) and the pairs they graded. Annotation's
    dedup puts one row per distinct (query, ad text) in the review queue, so a human grade also stands for
    every pair with the same dedup key (its copies); a key graded by several people takes their majority
    (ties to the lower grade). A pair's own grade comes before its key's."""

    by_pair: dict[str, int]
    by_key: dict[bytes, int]
    graded: dict[str, dict[str, Any]]  # the graded pairs' rows of the pairs file (their text)

    @classmethod
    def read(cls, review_gold: str, pairs: pa.Table) -> HumanGrades:
        fix = "run `agpo review import` or unset review_gold"
        path = require_file(review_gold, "human gold labels file", fix, FileNotFoundError)
        table = pq.read_table(path, columns=["pair_id", "grade"])
        by_pair = dict(zip(table["pair_id"].to_pylist(), table["grade"].to_pylist(), strict=True))
        graded = pairs.filter(pc.is_in(pairs["pair_id"], value_set=table["pair_id"].combine_chunks())).to_pylist()
        text = {r["pair_id"]: r for r in graded}
        unknown = [p for p in by_pair if p not in text]
        if unknown:
            raise ContractError(f"{len(unknown)} human-graded pair_ids are not in the pairs file, e.g. {unknown[0]!r}")
        votes: dict[bytes, list[int]] = {}
        for pair_id, grade in by_pair.items():
            votes.setdefault(pair_key(text[pair_id]), []).append(grade)
        return cls(by_pair, {key: majority(v, tie="lowest") for key, v in votes.items()}, text)

    def grade(self, row: dict[str, Any]) -> int | None:
        """The human grade of ``row`` (pair_id, query, ad_title): its own, else its copies' (None: ungraded)."""
        own = self.by_pair.get(row["pair_id"])
        return own if own is not None else self.by_key.get(pair_key(row))

    @staticmethod
    def row(pair: dict[str, Any], grade: int, grades: int) -> dict[str, Any]:
        """The training row of ``pair`` (pair_id, query, ad_title) graded ``grade`` by a person: one-hot,
        confidence 1, ``gold_grade`` set."""
        human = one_hot(pair["pair_id"], grade, grades, "human")
        return human | {"gold_grade": grade, "query": pair["query"], "ad_title": pair["ad_title"]}


def with_human_grades(labeled: pa.Table, human: HumanGrades, grades: int) -> pa.Table:
    """Teacher label rows (``TRAINING_SCHEMA``) with every human-graded pair's row, and its copies', replaced by
    its human grade (``HumanGrades.row``, so the gold term, ``training.gold_weight``, applies to it), in place;
    then the graded pairs the teacher did not label (abstained ones stay in place and become usable), in
    pair_id order. Read a batch of rows at a time."""
    batches = []
    for batch in labeled.to_batches(max_chunksize=READ_BATCH_ROWS):
        rows = batch.to_pylist()
        for i, row in enumerate(rows):
            grade = human.grade(row)
            rows[i] = row if grade is None else human.row(row, grade, grades)
        batches.append(pa.Table.from_pylist(rows, schema=TRAINING_SCHEMA))
    ids = pa.array(sorted(human.by_pair), pa.string())
    unlabeled = ids.filter(pc.invert(pc.is_in(ids, value_set=labeled["pair_id"].combine_chunks()))).to_pylist()
    extra = [human.row(human.graded[pair_id], human.by_pair[pair_id], grades) for pair_id in unlabeled]
    return pa.concat_tables([*batches, pa.Table.from_pylist(extra, schema=TRAINING_SCHEMA)])


def zero_shot_floor(
    config: DistilConfig,
    gold: list[dict[str, Any]],
    validation: list[dict[str, Any]],
    student_score: float,
    placement: Placement,
) -> tuple[RelevanceStudent | None, dict[str, Any]]:
    """The zero-shot student (on ``placement``) when the trained student's audit score
    (``training.selection_metric``) is below it (else None), and the figures of the comparison
    (``zero_shot_floor`` off or no gold train pairs: not checked, and why)."""
    if not config.zero_shot_floor:
        return None, {"checked": False, "why": "zero_shot_floor is off"}
    gold_rows = gold_train_rows(gold)
    if not gold_rows:
        return None, {"checked": False, "why": f"{config.pairs} has no gold-graded train pairs to fit it on"}
    zero_shot = zero_shot_student(
        config.zero_shot_encoder, gold_rows, config.student.num_grades, config.student.max_length, placement
    )
    metric = config.training.selection_metric
    floor = score_validation(zero_shot, validation, config.training.relevant_from, validation_scores)[f"val_{metric}"]
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
    pairs = read_pairs(config.pairs)  # columnar: only the gold pairs and a batch of labels become Python rows
    gold = gold_rows(pairs)
    validation = [r for r in gold if r["split"] == "audit"]
    if not validation:
        raise ContractError(f"{config.pairs} needs a gold audit split for early stopping; it has none")
    rows = training_rows(config, pairs)
    started = time.perf_counter()
    student = RelevanceStudent.build(config.student, texts=pair_texts(tokenizer_pairs(pairs)))
    student = student.place(device.placement())
    out = Path(config.out_dir)
    metric = f"val_{config.training.selection_metric}"
    with progress_bar(total=config.training.epochs, desc=f"distil ({config.label_source} labels)", unit="epoch") as bar:

        def progress(record: dict[str, float]) -> None:
            bar.set_postfix(val=f"{record[metric]:.3f}", refresh=False)
            bar.update(record["epoch"] > 0)

        result = distil(
            student,
            rows,
            validation,
            config.training,
            score=validation_scores,
            on_epoch=progress,
            checkpoint_dir=out / "checkpoints",
        )
    zero_shot, floor = zero_shot_floor(config, gold, validation, result.best_val, device.placement())
    shipped = student if zero_shot is None else zero_shot
    model_dir = shipped.save(out / "model")
    if config.export_onnx:
        export_onnx(shipped, model_dir)
    if config.serving_backends:  # the int8 graphs, and what backend=auto serves (evaluation.backend_choice)
        choose_backend(model_dir, validation, config.training.relevant_from, threads=threads.threads)
    seconds = time.perf_counter() - started  # this invocation's: a resumed run's last epochs only
    summary = _summary(config, rows, result, student, zero_shot is not None, floor, seconds)
    paths = {"model": model_dir, "summary": write_json_atomic(out / "distil.json", summary)}
    print_summary(_headline(config, summary, floor), paths, threads, device)
    return paths


def _summary(
    config, rows: PairRows, result, student, floored: bool, floor: dict[str, Any], seconds: float
) -> dict[str, Any]:
    """``distil.json``: what the student learned from, what shipped and its early-stopping history."""
    graded = rows.table.filter(pc.is_valid(rows.table["grade"]))
    sources = {count["values"]: count["counts"] for count in pc.value_counts(graded["source"]).to_pylist()}
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
