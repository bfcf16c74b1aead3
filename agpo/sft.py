"""Supervised warm start: next-token cross-entropy on the completion tokens of (prompt, completion) pairs.

Each example is tokenized as prompt + completion + EOS; the prompt tokens are masked out of the loss, so
the model learns to answer, not to echo queries. Batches are right-padded; examples are shuffled per epoch
with the config's seed, so the same seed gives the same weights.

Class balance (``balance``, with one class per example, e.g. the gold grade, passed as ``classes``). Real
label sets are skewed (ESCI is mostly Exact): trained on them as they are, a small model learns to answer
the top grade for every pair. With N examples, K distinct classes and n_c examples of class c, example i
of class c_i weighs

    w_i = N / (K * n_{c_i})          (counts [3, 1] -> weights 2/3 and 2; sum_i w_i = N)

  none    the loss of a batch B is the mean cross-entropy over all its completion tokens
          (sum of token losses / number of completion tokens); each epoch is a shuffle of the examples.
  loss    the same shuffled batches; example i's loss l_i is the mean over its own completion tokens and
          the batch loss is  (1 / |B|) * sum_{i in B} w_i * l_i.  The normaliser is the batch size, not
          sum w_i: since the weights average 1 over the data set, an epoch's mean batch loss is the
          class-balanced mean (1/K) * sum_c mean_{i in c} l_i, and a batch never rescales its own weights.
  sample  each epoch gives every class N/K of the epoch's N slots (the remainder, one each, to classes
          drawn at random); a class fills its slots with shuffled passes over its examples, cut at the last
          slot, and the slots are shuffled: example i is trained on w_i times per epoch (in expectation), a
          common class shows a fresh subset each epoch, and on balanced classes it is a plain shuffle.
          The batch loss is as in ``none``. All draws come from the config's seed.

Budget and selection. ``max_steps`` caps the optimizer steps (the schedule spans the capped total), so the
examples can be all the data while the cost stays bounded. ``stop_when(step, loss)`` is asked after every
step and ends training when it answers True: ``BestCheckpoint`` is such a monitor. Every ``every`` steps it
evaluates the model (``evaluate`` returns named figures; the caller's, e.g. held-out accuracy), keeps a copy
of the trainable weights at the best value of ``metric`` (strictly better replaces), stops after
``patience`` evaluations without improvement (0: never), and ``finish`` evaluates the last step, restores
the best weights and returns that evaluation. The step-0 evaluation of the untrained model is recorded but
is no candidate: the weights SFT leaves are chosen among its own steps. A value chosen as the best of
several is optimistic as an estimate of that checkpoint; the caller says so.

``sample`` is the default: on skewed grades it is the one mode whose teacher answers every grade
(docs/teacher.md, "Imbalanced grades", has the figures). Where no classes are given (math SFT has none),
every mode trains as ``none``.
The loss returned per step is the batch loss the mode defines.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Hashable, Sequence

import torch
from transformers import PreTrainedTokenizerBase

from agpo.checks import require_choice
from agpo.models import autocast, model_device
from agpo.optim import build_optimizer
from agpo.sft_config import LEARNING_RATES, SFTConfig

IGNORE = -100


def class_weights(classes: Sequence[Hashable]) -> list[float]:
    """``N / (K * count[class])`` per example: the weights average 1 and every class's total is N / K."""
    counts = Counter(classes)
    return [len(classes) / (len(counts) * counts[c]) for c in classes]


def epoch_order(rng: random.Random, size: int, classes: Sequence[Hashable] | None = None) -> list[int]:
    """One epoch's example indices: a shuffle of all ``size``, or (``classes``) N/K slots per class, each
    class filling its slots with shuffled passes over its examples (cut at the last slot), then shuffled."""
    if classes is None:
        order = list(range(size))
        rng.shuffle(order)
        return order
    members: dict[Hashable, list[int]] = {}
    for i, c in enumerate(classes):
        members.setdefault(c, []).append(i)
    share, left = divmod(size, len(members))
    extra = set(rng.sample(range(len(members)), left))  # the remainder's slots go to classes drawn at random
    order = []
    for k, indices in enumerate(members.values()):
        slots, drawn = share + (k in extra), []
        while len(drawn) < slots:
            drawn += rng.sample(indices, len(indices))
        order += drawn[:slots]
    rng.shuffle(order)
    return order


def tokenize_example(tokenizer: PreTrainedTokenizerBase, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Input ids and labels (prompt positions masked) for one example."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [IGNORE] * len(prompt_ids) + completion_ids


def supervised_finetune(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[tuple[str, str]],
    config: SFTConfig = SFTConfig(),
    on_step: Callable[[int, float], None] | None = None,
    classes: Sequence[Hashable] | None = None,
    regime: str = "scratch",
    stop_when: Callable[[int, float], bool] | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> list[float]:
    """Fine-tune ``model`` in place on ``(prompt, completion)`` examples; returns the loss per step.

    Batches go to the model's device; ``autocast_dtype`` (bf16) runs the forward passes in mixed precision.

    Training ends after ``config.max_steps`` steps, or when ``stop_when(step, loss)`` answers True.

    ``classes`` (one per example, e.g. the gold grade) is what ``config.balance`` balances; None: no balance.
    ``regime`` (``scratch``, ``full``, ``lora``) picks the learning rate when ``config.learning_rate`` is null.
    """
    if not examples:
        raise ValueError("SFT needs at least one (prompt, completion) example")
    require_choice("regime", regime, LEARNING_RATES)
    if classes is not None and len(classes) != len(examples):
        raise ValueError(f"need one class per example, got {len(classes)} classes for {len(examples)} examples")
    balance = config.balance if classes is not None else "none"
    weights = class_weights(classes) if balance == "loss" else None
    encoded = [tokenize_example(tokenizer, p, c) for p, c in examples]
    total = planned_steps(len(encoded), config)
    optimizer, scheduler = build_optimizer(
        model,
        learning_rate=config.learning_rate if config.learning_rate is not None else LEARNING_RATES[regime],
        weight_decay=config.weight_decay,
        total_steps=total,
        warmup_steps=config.warmup_steps,
        schedule=config.lr_schedule,
    )
    rng = random.Random(config.seed)
    device = model_device(model)
    model.train()
    losses = []
    for _ in range(config.epochs):
        if len(losses) >= total:
            break
        order = epoch_order(rng, len(encoded), classes if balance == "sample" else None)
        for start in range(0, len(order), config.batch_size):
            if len(losses) >= total:
                break
            rows = order[start : start + config.batch_size]
            padded = _right_pad([encoded[i] for i in rows], tokenizer.pad_token_id)
            input_ids, labels, attention = (tensor.to(device) for tensor in padded)
            with autocast(model, autocast_dtype):
                logits = model(input_ids=input_ids, attention_mask=attention).logits[:, :-1]
            if balance == "loss":
                example_weights = torch.tensor([weights[i] for i in rows], device=device)
                loss = weighted_example_loss(logits, labels[:, 1:], example_weights)
            else:
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=IGNORE
                )
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step(len(losses), losses[-1])
            if stop_when is not None and stop_when(len(losses), losses[-1]):
                model.eval()
                return losses
    model.eval()
    return losses


def planned_steps(examples: int, config: SFTConfig) -> int:
    """Optimizer steps of a full run: epochs x batches per epoch, capped at ``max_steps``."""
    steps = math.ceil(examples / config.batch_size) * config.epochs
    return min(steps, config.max_steps) if config.max_steps is not None else steps


class BestCheckpoint:
    """A ``stop_when`` monitor: evaluate every ``every`` steps, keep the best trainable weights by ``metric``,
    stop after ``patience`` evaluations without improvement (module docstring, "Budget and selection")."""

    def __init__(
        self,
        model: torch.nn.Module,
        evaluate: Callable[[], dict[str, float]],
        metric: str,
        every: int = 0,
        patience: int = 0,
    ) -> None:
        self.model, self.evaluate, self.metric = model, evaluate, metric
        self.every, self.patience = every, patience
        self.history: list[dict[str, float]] = []
        self.best: dict[str, float] | None = None
        self._best_weights: dict[str, torch.Tensor] = {}
        self._since_best = 0
        self._check(0, candidate=False)

    def __call__(self, step: int, loss: float) -> bool:
        if not self.every or step % self.every:
            return False
        self._check(step, loss)
        return bool(self.patience) and self._since_best >= self.patience

    def finish(self, step: int) -> dict[str, float]:
        """Evaluate the last step (when not just done), load the best weights; the best evaluation."""
        if self.history[-1]["step"] != step:
            self._check(step)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                if name in self._best_weights:
                    parameter.copy_(self._best_weights[name])
        self.model.eval()
        return self.best

    def _check(self, step: int, loss: float | None = None, candidate: bool = True) -> None:
        was_training = self.model.training
        self.model.eval()
        figures = {"step": step, **({"loss": loss} if loss is not None else {}), **self.evaluate()}
        self.model.train(was_training)
        self.history.append(figures)
        if not candidate:
            return
        if self.best is None or figures[self.metric] > self.best[self.metric]:
            self.best, self._since_best = figures, 0
            self._best_weights = {
                name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad
            }
        else:
            self._since_best += 1


def weighted_example_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``(1/B) * sum_i w_i * l_i``, l_i the mean cross-entropy over example i's labelled (non-IGNORE) tokens."""
    tokens = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE, reduction="none"
    ).view(labels.shape)
    mask = labels != IGNORE
    per_example = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return (weights * per_example).sum() / len(weights)


def _right_pad(batch: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        attention[row, : len(ids)] = 1
    return input_ids, labels, attention
