"""Distil the teacher's labels into the student.

Per labeled pair i (abstained pairs are skipped) with teacher votes v_i, majority grade y_i, confidence c_i
and optional gold grade g_i, and student logits z_i:

    soft_i = T^2 * KL(q_i || softmax(z_i / T)),   q_i = normalize((v_i + s)^(1/T))   (s: vote smoothing)
                                                  q_i = normalize(p_i^(1/T))         (exact probabilities)
    hard_i = CE(z_i, y_i)
    gold_i = CE(z_i, g_i) where gold exists, else 0
    loss   = sum_i w_i * (alpha * soft_i + (1 - alpha) * hard_i + gold_weight * gold_i) / sum_i w_i

with w_i = c_i under confidence weighting, else 1, times ``teacher_weight`` for a row whose ``source`` is
``teacher`` (gold rows, one-hot with confidence 1, keep weight 1): the weight of the teacher's labels
against the team's gold ones when a student learns from both. With ``teacher_weight`` 0 the teacher's rows
are left out altogether (``usable_labels``), so the student is exactly the gold-only one. A label row
with ``grade_probs`` p_i (annotation's score mode: the teacher's exact grade distribution, c_i its top
probability) takes the second q_i: tempered like the votes but not smoothed, as exact probabilities have no
sampling zeros.

A bi-encoder or hybrid student (student.model) first fits its ordinal head to the labels on the encoder's
pretrained cosines (weighted by w_i, the majority grade y_i): training starts from the encoder's own
similarity, mapped to grades, instead of a random head.

Training is AdamW over seeded batches (of similar text length with ``length_grouped``: student.batches), on the
student's device and precision, ``accumulation_steps`` batches per optimizer step (each batch's loss divided by the
step's sum of w_i: the gradient of one batch of all its pairs), at the backbone's rate and schedule unless set
(``resolved_schedule``: tiny, from scratch, 5e-4 constant; pretrained, 1e-4 with linear warm-up and decay). After
each epoch the student is scored on a gold validation split (``selection_metric``, ROC-AUC of "relevant" by
default); training stops after ``patience`` epochs without improvement (never before ``min_epochs``), keeping the
best epoch. A bi or hybrid student is also scored before its first epoch (epoch 0: exactly the zero-shot baseline
when it learns from gold alone), so fine-tuning that only moves it away from what the encoder knew is never kept.

With a ``checkpoint_dir`` every epoch ends with a checkpoint (durable.checkpoint: atomic, checksummed):
the weights, the optimizer and its schedule, the best epoch's weights, the shuffling generator and the RNG
states (torch's and Python's, both seeded), and the history. A rerun after a kill (after an epoch, within
one, or inside a checkpoint save) resumes after the last finished epoch and ends with the same weights and
the same checkpoint files, byte for byte, as an uninterrupted run (tests/durable/test_fault_injection_training.py);
a checkpoint of another config or other data (any per-pair input above: text, votes, grade probabilities,
grade, confidence, gold grade, or the validation split) is refused, naming what differs.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.utils.data import DataLoader
from transformers import get_constant_schedule, get_linear_schedule_with_warmup

from durable.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from student.batches import LabelledBatch, epoch_batches, optimizer_steps, pair_weights, text_lengths
from student.kinds import kind_of
from student.model import RelevanceStudent
from student.pair_rows import PairRows
from student.training_config import DistilTrainingConfig

# A tiny backbone trained from scratch takes a large constant rate; a pretrained encoder (all-MiniLM-L6-v2)
# is fine-tuned, so it gets a smaller one, warmed up and then decayed, as BERT-style fine-tuning does (the
# sweep that chose them: docs/student.md, "Student defaults per backbone").
LEARNING_RATES = {"scratch": 5e-4, "pretrained": 1e-4}


def resolved_schedule(config: DistilTrainingConfig, pretrained: bool) -> tuple[float, str]:
    """(peak learning rate, schedule) for a tiny (``pretrained`` false) or a pretrained backbone."""
    regime = "pretrained" if pretrained else "scratch"
    rate = config.learning_rate if config.learning_rate is not None else LEARNING_RATES[regime]
    schedule = config.schedule if config.schedule != "auto" else ("linear" if pretrained else "constant")
    return rate, schedule


def soft_targets(
    votes: torch.Tensor, temperature: float, smoothing: float, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """normalize((votes + smoothing)^(1/T)) per row; rows of ``probs`` that hold probabilities (not all zero)
    give normalize(probs^(1/T)) instead."""
    tempered = (votes.float() + smoothing).pow(1 / temperature)
    if probs is not None:
        exact = probs.float().sum(-1, keepdim=True) > 0
        tempered = torch.where(exact, probs.float().pow(1 / temperature), tempered)
    return tempered / tempered.sum(-1, keepdim=True)


def distill_loss(
    logits: torch.Tensor,
    votes: torch.Tensor,
    grades: torch.Tensor,
    weights: torch.Tensor,
    config: DistilTrainingConfig,
    gold: torch.Tensor | None = None,
    probs: torch.Tensor | None = None,
    normaliser: float | None = None,
) -> torch.Tensor:
    """The weighted loss of the module docstring; ``gold`` uses -1 where a pair has no gold grade; ``probs``
    (``label_probs``) holds the exact grade probabilities of score-mode labels; ``normaliser`` is sum_i w_i over
    the optimizer step's pairs when it accumulates several batches (None: this batch's own)."""
    t = config.temperature
    target = soft_targets(votes, t, config.vote_smoothing, probs)
    log_student = torch.log_softmax(logits / t, -1)
    soft = (target * (target.clamp_min(1e-12).log() - log_student)).sum(-1) * t * t
    hard = torch.nn.functional.cross_entropy(logits, grades, reduction="none")
    per_pair = config.alpha * soft + (1 - config.alpha) * hard
    if gold is not None and config.gold_weight > 0:
        has_gold = gold >= 0
        gold_ce = torch.nn.functional.cross_entropy(logits, gold.clamp_min(0), reduction="none")
        per_pair = per_pair + config.gold_weight * gold_ce * has_gold
    total = weights.sum() if normaliser is None else torch.tensor(normaliser, dtype=weights.dtype)
    return (weights * per_pair).sum() / total.clamp_min(1e-12)


def usable_labels(labels: Sequence[dict[str, Any]], teacher_weight: float = 1.0) -> PairRows:
    """The labeled pairs the student learns from, columnar (student.pair_rows): every pair but the abstained
    ones (grade null) and, with ``teacher_weight`` 0, the teacher's (source ``teacher``)."""
    table = PairRows.of(labels).table
    keep = pc.is_valid(table["grade"])
    if teacher_weight == 0 and "source" in table.column_names:
        teacher = pc.fill_null(pc.equal(table["source"].cast(pa.string()), "teacher"), False)
        keep = pc.and_(keep, pc.invert(teacher))
    return PairRows(table.filter(keep))


@dataclass
class DistilResult:
    best_epoch: int  # 0: the untrained start of a bi or hybrid student
    best_val: float  # the selection metric's value at best_epoch
    history: list[dict[str, float]]
    skipped_abstained: int
    resumed_from_epoch: int | None = None  # the checkpoint's epoch when the run resumed; None when it started fresh


def distil(
    student: RelevanceStudent,
    labels: Sequence[dict[str, Any]],
    validation: Sequence[dict[str, Any]],
    config: DistilTrainingConfig,
    *,
    score: ValidationScorer,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
    checkpoint_dir: str | Path | None = None,
) -> DistilResult:
    """Train ``student`` on teacher ``labels`` (query, ad_title, votes, grade, confidence, optional
    gold_grade and source; a list of rows or, for a large run, ``PairRows``); early-stop on ``selection_metric``
    over ``validation`` (query, ad_title, gold_grade), as ``score`` (the evaluation room's
    ``evaluation.metrics.validation_scores``) figures it; checkpoint every epoch into ``checkpoint_dir`` and resume
    from it when it holds one."""
    labels = PairRows.of(labels)
    usable = usable_labels(labels, config.teacher_weight)
    if not usable:
        raise ValueError("no labeled pairs to distil from (every pair abstained or the input is empty)")
    if not validation:
        raise ValueError("early stopping needs a non-empty gold validation split")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    random.seed(config.seed)  # unused here, but checkpointed: a resumed run's checkpoints then match byte for byte
    optimizer, scheduler = _optimizer(student, config, len(usable))
    if not 0 < config.relevant_from < student.num_grades:
        raise ValueError(
            f"relevant_from {config.relevant_from} leaves no relevant or no irrelevant grade among the student's "
            f"{student.num_grades}; set training.relevant_from in 1..{student.num_grades - 1}"
        )
    _require_both_classes(validation, config)
    progress = {"epoch": 0, "best": -1.0, "best_epoch": 0, "stale": 0, "history": []}
    best_state = None
    resumed_from_epoch = None
    fingerprint = _fingerprint(student, usable, validation, config)
    found = latest_checkpoint(checkpoint_dir) if checkpoint_dir is not None else None
    if found is not None:
        checkpoint, state = load_checkpoint(found, model=student.model, fingerprint=fingerprint)
        for part, stateful in (("optimizer", optimizer), ("scheduler", scheduler)):
            stateful.load_state_dict(state[part])
        generator.set_state(state["generator"])
        best_state, progress = state["best_weights"], checkpoint.trainer_state
        resumed_from_epoch = progress["epoch"]
        for record in progress["history"] if on_epoch is not None else []:
            on_epoch(record)
    elif student.model.head is not None:  # start from the encoder's similarity, mapped to the labels' grades
        student.fit_head(
            usable.column("query"),
            usable.column("ad_title"),
            usable.column("grade"),
            pair_weights(usable, config.confidence_weighting, config.teacher_weight),
        )
        record = {"epoch": 0, "loss": None, **score_validation(student, validation, config.relevant_from, score)}
        best_state = _keep_if_best(progress, record, student, config.selection_metric, best_state)
        if on_epoch is not None:
            on_epoch(record)
    while progress["epoch"] < config.epochs and (
        progress["stale"] < config.patience or progress["epoch"] < config.min_epochs
    ):
        epoch = progress["epoch"] + 1
        loss = _train_epoch(student, usable, optimizer, scheduler, generator, config)
        record = {"epoch": epoch, "loss": loss, **score_validation(student, validation, config.relevant_from, score)}
        progress["epoch"] = epoch
        best_state = _keep_if_best(progress, record, student, config.selection_metric, best_state)
        if checkpoint_dir is not None:
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            state |= {"generator": generator.get_state(), "best_weights": best_state}
            kept = {"model": student.model, "optimizer_state": state, "trainer_state": progress}
            save_checkpoint(checkpoint_dir, epoch, **kept, fingerprint=fingerprint, keep_last=1)
        if on_epoch is not None:
            on_epoch(record)
    student.model.load_state_dict(best_state)
    student.model.eval()
    abstained = labels.table["grade"].null_count
    return DistilResult(progress["best_epoch"], progress["best"], progress["history"], abstained, resumed_from_epoch)


def _optimizer(
    student: RelevanceStudent, config: DistilTrainingConfig, pairs: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW at the backbone's rate and transformers' schedule (constant, or a linear warm-up over
    ``warmup_ratio`` of the run's optimizer steps and a linear decay to 0) over the run's steps."""
    rate, schedule = resolved_schedule(config, student.pretrained)
    optimizer = torch.optim.AdamW(student.model.parameters(), lr=rate)
    batches = -(-pairs // config.batch_size)
    total_steps = config.epochs * -(-batches // config.accumulation_steps)
    if schedule == "constant":
        return optimizer, get_constant_schedule(optimizer)
    return optimizer, get_linear_schedule_with_warmup(optimizer, int(config.warmup_ratio * total_steps), total_steps)


# (gold grades, grade probabilities, relevant_from) -> {"val_macro_f1": ..., "val_roc_auc_relevant": ... or None}
ValidationScorer = Callable[[Sequence[int], np.ndarray, int], dict[str, float | None]]


def score_validation(
    student: RelevanceStudent, validation: Sequence[dict[str, Any]], relevant_from: int, score: ValidationScorer
) -> dict[str, float | None]:
    """``score``'s figures (``val_macro_f1``, ``val_roc_auc_relevant``) of the student's grade probabilities on the
    gold validation pairs."""
    probs = student.predict_proba([r["query"] for r in validation], [r["ad_title"] for r in validation])
    return score([r["gold_grade"] for r in validation], probs, relevant_from)


def _require_both_classes(validation: Sequence[dict[str, Any]], config: DistilTrainingConfig) -> None:
    """ROC-AUC as the selection metric needs relevant and irrelevant validation pairs: say so before training."""
    grades = sorted({r["gold_grade"] for r in validation})
    sides = {grade >= config.relevant_from for grade in grades}
    if config.selection_metric == "roc_auc_relevant" and len(sides) < 2:
        side = "relevant" if True in sides else "irrelevant"
        raise ValueError(
            f"every gold validation pair is {side} (grades {grades}, relevant from {config.relevant_from}), so "
            "ROC-AUC cannot pick an epoch; grade pairs of both kinds into the audit split or set "
            "training.selection_metric=macro_f1"
        )


def _keep_if_best(
    progress: dict[str, Any], record: dict[str, Any], student: RelevanceStudent, metric: str, best_state: Any
) -> Any:
    """Append ``record`` to the history; when its ``metric`` beats the best so far, make it the best (the
    student's weights now) and reset the stale count, else count a stale epoch. Returns the best weights."""
    progress["history"].append(record)
    value = record[f"val_{metric}"]
    if value > progress["best"]:
        progress.update(best=value, best_epoch=record["epoch"], stale=0)
        return copy.deepcopy(student.model.state_dict())
    progress["stale"] += 1
    return best_state


def _train_epoch(
    student: RelevanceStudent,
    usable: Sequence[dict[str, Any]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    generator: torch.Generator,
    config: DistilTrainingConfig,
) -> float:
    """One epoch of optimizer steps over seeded batches (student.batches); the mean step loss."""
    student.model.train()
    batches = epoch_batches(text_lengths(usable), config.batch_size, generator, config.length_grouped)
    collate = LabelledBatch(
        student.tokenizer,
        kind_of(student.kind).groups,
        student.max_length,
        config.confidence_weighting,
        config.teacher_weight,
    )
    on_gpu = student.device.type == "cuda"
    loader = iter(
        DataLoader(
            usable,  # type: ignore[arg-type]  # a map-style dataset: a batch is one Arrow take (__getitems__)
            batch_sampler=batches,
            collate_fn=collate,
            num_workers=config.loader_workers,
            pin_memory=on_gpu,
            # its own generator: an iterator draws its workers' base seed from it, not from torch's global RNG,
            # which dropout reads (a shared draw would change every run's training)
            generator=torch.Generator().manual_seed(config.seed),
        )
    )
    weights = pair_weights(usable, config.confidence_weighting, config.teacher_weight)
    losses = []
    for step in optimizer_steps(batches, config.accumulation_steps):
        # several batches: each one's loss divided by the step's sum of weights, so they add up to the step's loss
        normaliser = sum(weights[i] for batch in step for i in batch) if len(step) > 1 else None
        optimizer.zero_grad()
        step_loss = 0.0
        for _ in step:
            batch = next(loader)
            to_device = {k: v.to(student.device, non_blocking=on_gpu) for k, v in batch.items() if k != "features"}
            features = {k: v.to(student.device, non_blocking=on_gpu) for k, v in batch["features"].items()}
            loss = distill_loss(
                student.logits(features),
                to_device["votes"],
                to_device["grades"],
                to_device["weights"],
                config,
                gold=to_device["gold"],
                probs=to_device["probs"],
                normaliser=normaliser,
            )
            loss.backward()
            step_loss += loss.item()
        if config.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(student.model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(step_loss)
    return sum(losses) / len(losses)


def _fingerprint(
    student: RelevanceStudent,
    usable: Sequence[dict[str, Any]],
    validation: Sequence[dict[str, Any]],
    config: DistilTrainingConfig,
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the config, the model's size and a digest of every
    per-pair input to the loss and to early stopping: the pairs' text, votes, grades and grade probabilities
    (where present) with the validation split (``data_blake2b``), the confidences (the pair weights) and the
    gold grades of the labeled pairs (the gold term), each under its own key so that a refusal names what
    changed."""
    return {
        "distill": asdict(config),  # the key of earlier checkpoints (one without selection_metric is refused)
        "kind": student.kind,
        "parameters": sum(p.numel() for p in student.model.parameters()),
        "labels": len(usable),
        "data_blake2b": _digest(
            itertools.chain(
                (
                    [r["query"], r["ad_title"], r["votes"], r["grade"]]
                    + ([r["grade_probs"]] if r.get("grade_probs") is not None else [])
                    for r in usable
                ),
                ([r["query"], r["ad_title"], r["gold_grade"]] for r in validation),
            )
        ),
        "confidence_blake2b": _digest(r["confidence"] for r in usable),
        "source_blake2b": _digest(r.get("source") for r in usable),
        "gold_grade_blake2b": _digest(r.get("gold_grade") for r in usable),
    }


def _digest(items: Iterable[Any]) -> str:
    """BLAKE2b-128 of the JSON of each item in order (streamed: a generator is read once, never held)."""
    digest = hashlib.blake2b(digest_size=16)
    for item in items:
        digest.update(json.dumps(item).encode())
    return digest.hexdigest()
