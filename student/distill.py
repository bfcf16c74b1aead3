"""Distil the teacher's labels into the student.

Per labeled pair i (abstained pairs are skipped) with teacher votes v_i, majority grade y_i, confidence c_i
and optional gold grade g_i, and student logits z_i:

    soft_i = T^2 * KL(q_i || softmax(z_i / T)),   q_i = normalize((v_i + s)^(1/T))   (s: vote smoothing)
    hard_i = CE(z_i, y_i)
    gold_i = CE(z_i, g_i) where gold exists, else 0
    loss   = sum_i w_i * (alpha * soft_i + (1 - alpha) * hard_i + gold_weight * gold_i) / sum_i w_i

with w_i = c_i under confidence weighting, else 1. Training is AdamW over seeded shuffles; after each epoch
the student is scored (macro-F1) on a gold validation split, and training stops after ``patience`` epochs
without improvement, keeping the best epoch's weights.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from student.metrics import macro_f1
from student.model import RelevanceStudent


@dataclass(frozen=True)
class DistillConfig:
    """How the student learns from the teacher's labels."""

    epochs: int = field(default=10, metadata={"help": "most passes over the labeled pairs"})
    batch_size: int = field(default=32, metadata={"help": "pairs per optimizer step"})
    learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate"})
    temperature: float = field(default=2.0, metadata={"help": "T of the soft-label term"})
    alpha: float = field(default=0.5, metadata={"help": "weight of the soft-label term (1 - alpha: hard labels)"})
    vote_smoothing: float = field(default=0.1, metadata={"help": "added to every vote count before normalising"})
    confidence_weighting: bool = field(default=True, metadata={"help": "weight each pair by the teacher's confidence"})
    gold_weight: float = field(default=0.0, metadata={"help": "weight of cross-entropy on gold grades where present"})
    patience: int = field(default=3, metadata={"help": "epochs without validation gain before stopping"})
    seed: int = field(default=0, metadata={"help": "shuffling seed"})

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1:
            raise ValueError("epochs, batch_size and patience must be >= 1")
        if not self.temperature > 0 or not 0 <= self.alpha <= 1 or self.gold_weight < 0 or self.vote_smoothing < 0:
            raise ValueError("temperature must be > 0, alpha in [0, 1], gold_weight and vote_smoothing >= 0")


def soft_targets(votes: torch.Tensor, temperature: float, smoothing: float) -> torch.Tensor:
    """normalize((votes + smoothing)^(1/T)) per row."""
    tempered = (votes.float() + smoothing).pow(1 / temperature)
    return tempered / tempered.sum(-1, keepdim=True)


def distill_loss(
    logits: torch.Tensor,
    votes: torch.Tensor,
    grades: torch.Tensor,
    weights: torch.Tensor,
    config: DistillConfig,
    gold: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weighted loss of the module docstring; ``gold`` uses -1 where a pair has no gold grade."""
    t = config.temperature
    target = soft_targets(votes, t, config.vote_smoothing)
    log_student = torch.log_softmax(logits / t, -1)
    soft = (target * (target.clamp_min(1e-12).log() - log_student)).sum(-1) * t * t
    hard = torch.nn.functional.cross_entropy(logits, grades, reduction="none")
    per_pair = config.alpha * soft + (1 - config.alpha) * hard
    if gold is not None and config.gold_weight > 0:
        has_gold = gold >= 0
        gold_ce = torch.nn.functional.cross_entropy(logits, gold.clamp_min(0), reduction="none")
        per_pair = per_pair + config.gold_weight * gold_ce * has_gold
    return (weights * per_pair).sum() / weights.sum().clamp_min(1e-12)


@dataclass
class DistillResult:
    best_epoch: int
    best_val_macro_f1: float
    history: list[dict[str, float]]
    skipped_abstained: int


def distill(
    student: RelevanceStudent,
    labels: Sequence[dict[str, Any]],
    validation: Sequence[dict[str, Any]],
    config: DistillConfig,
    on_epoch: Callable[[dict[str, float]], None] | None = None,
) -> DistillResult:
    """Train ``student`` on teacher ``labels`` (query, ad_title, votes, grade, confidence, optional
    gold_grade); early-stop on macro-F1 over ``validation`` (query, ad_title, gold_grade)."""
    usable = [row for row in labels if row["grade"] is not None]
    if not usable:
        raise ValueError("no labeled pairs to distil from (every pair abstained or the input is empty)")
    if not validation:
        raise ValueError("early stopping needs a non-empty gold validation split")
    generator = torch.Generator().manual_seed(config.seed)
    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW(student.model.parameters(), lr=config.learning_rate)
    best_f1, best_epoch, best_state, stale = -1.0, 0, None, 0
    history = []
    for epoch in range(1, config.epochs + 1):
        student.model.train()
        order = torch.randperm(len(usable), generator=generator).tolist()
        losses = []
        for start in range(0, len(order), config.batch_size):
            rows = [usable[i] for i in order[start : start + config.batch_size]]
            batch = student.encode([r["query"] for r in rows], [r["ad_title"] for r in rows])
            loss = distill_loss(
                student.logits(batch),
                torch.tensor([r["votes"] for r in rows]),
                torch.tensor([r["grade"] for r in rows]),
                torch.tensor([r["confidence"] if config.confidence_weighting else 1.0 for r in rows]),
                config,
                gold=torch.tensor([-1 if r.get("gold_grade") is None else r["gold_grade"] for r in rows]),
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        probs = student.predict_proba([r["query"] for r in validation], [r["ad_title"] for r in validation])
        f1 = macro_f1(y_true=[r["gold_grade"] for r in validation], y_pred=probs.argmax(1).tolist(),
                      num_grades=probs.shape[1])  # fmt: skip
        record = {"epoch": epoch, "loss": sum(losses) / len(losses), "val_macro_f1": f1}
        history.append(record)
        if on_epoch is not None:
            on_epoch(record)
        if f1 > best_f1:
            best_f1, best_epoch, stale = f1, epoch, 0
            best_state = copy.deepcopy(student.model.state_dict())
        else:
            stale += 1
            if stale >= config.patience:
                break
    student.model.load_state_dict(best_state)
    student.model.eval()
    return DistillResult(best_epoch, best_f1, history, len(labels) - len(usable))
