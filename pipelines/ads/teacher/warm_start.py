"""Stage ``agpo teacher``: the base teacher, warmed up with SFT on gold pairs.

The base is either

- a pretrained causal LM (``base_model``: a local HF directory or a packaged name, ``smollm2-135m-instruct``
  or ``gemma-3-270m``): loaded as it is; instruction-tuned models are prompted through their chat template,
  base models (Gemma 3 270M) with the plain prompt after their BOS token (:mod:`pipelines.ads.teacher.prompts`), or
- the tiny teacher built here (``base_model: null``): a byte-level BPE tokenizer trained on the pairs' text
  (train, audit and unlabeled splits: no labels are read from unlabeled rows, only text; the test split
  stays unseen) and a randomly initialised Qwen2 decoder (head_dim 64).

Then:

1. split the gold train pairs into the SFT part and the RL part (``rl_share``: whole queries go to RL, so
   RL later trains on pairs SFT has not fitted; 0: no split) and keep the first ``sft_examples`` of the SFT
   part (null: all of them; ``sft.max_steps`` bounds the cost instead);
2. SFT: prompt -> the target of ``answer_format`` (``reason``: the pair's rationale when it has one, then
   ``<answer>k</answer>``; ``answer``: the tag alone), the whole model or, with ``lora.rank > 0``,
   low-rank adapters that are merged into the weights afterwards; with ``trainable_layers: N`` only the top
   N decoder layers (or their adapters) train;
3. the checkpoint is chosen on pairs SFT does not train on: before SFT, every ``sft.eval_every`` steps and
   at the end the teacher grades the audit split and an equal sample of its SFT pairs as annotation reads
   a grade (score mode: the argmax of the exact grade distribution, after a greedy reason in the ``reason``
   format; greedy free-running decoding with ``audit_constrained: false``). The weights with the best audit
   balanced accuracy are kept; ``sft.patience`` evaluations without improvement end SFT early;
4. save the model directory (safetensors, plus ``teacher_prompt.json`` so later stages prompt it the same
   way), ``teacher_report.json`` and ``sft_curve.png``: audit and train accuracy and balanced accuracy per
   evaluation, the train-versus-audit gap, per-grade recall, the predicted grade shares, and the class-prior
   baseline (answering the SFT pairs' most common grade: its audit accuracy; any constant answer has
   balanced accuracy 1/K over the K grades audit has). ``audit_balanced_margin`` (chosen checkpoint's
   audit balanced accuracy minus 1/K) is what the pipeline's prior gate reads (pipelines.ads.teacher.gate);
5. ranking (``audit_ranking``): the chosen teacher's expected grade sum_k k p(k) under its exact grade
   distribution (score mode) ranks the audit pairs; its ROC-AUC of "relevant" (gold grade >= 2) stands in the
   report beside the zero-shot encoder's on the same pairs (evaluation.zero_shot, fitted on the gold train
   pairs), so a teacher that fails on argmax shows whether it still ranks, and against what a team has.

The audit figures of the chosen checkpoint are the best of several evaluations, so slightly optimistic; the
RL stage grades the same audit split again from scratch, and the test split stays unseen.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from agpo.lora import add_adapters, merge_adapters, trainable_parameters
from agpo.models import (
    build_tiny_qwen2,
    count_parameters,
    load_model,
    model_device,
    save_model,
    train_bpe_tokenizer,
    train_top_layers,
)
from agpo.pretrained import resolve_base_model
from agpo.rollout import HFRolloutEngine
from agpo.sft import LEARNING_RATES, BestCheckpoint, planned_steps, supervised_finetune
from compute.placement import Placement
from evaluation.baselines_config import BaselinesConfig
from evaluation.metrics import roc_auc
from evaluation.zero_shot import gold_train_rows, zero_shot_student
from pipelines.ads.intake.contracts import (
    ContractError,
    gold_rows,
    labeled_splits,
    read_pairs,
    teacher_part,
    tokenizer_pairs,
)
from pipelines.ads.teacher.audit_metrics import grade_breakdown, grade_pairs, relevance_accuracy
from pipelines.ads.teacher.labeling import PairLabeler
from pipelines.ads.teacher.prompts import TeacherPrompt, teacher_prompt
from pipelines.ads.teacher.relevance_reward import ESCI_GRADES
from pipelines.ads.teacher.voting_config import VotingConfig
from pipelines.ads.teacher.warm_start_config import TeacherConfig
from pipelines.devices import use_device
from pipelines.io import print_summary, write_json_atomic
from pipelines.plots import plot_learning_curves
from pipelines.progress import progress_bar
from pipelines.threads import use_threads
from student.pair_rows import PairRows


def run(config: TeacherConfig) -> dict[str, Path]:
    threads, device = use_threads(config.threads), use_device(config)
    pairs = read_pairs(config.pairs)  # columnar: only the gold pairs become Python rows
    gold = gold_rows(pairs)
    train, audit = labeled_splits(gold, config.pairs, None, config.audit_examples)
    train = teacher_part(train, config.rl_share, "sft")[: config.sft_examples]
    if not train:
        raise ContractError(f"{config.pairs}: rl_share {config.rl_share} leaves no gold train pair for SFT")
    started = time.perf_counter()
    model, tokenizer, prompt = _base_teacher(config, pairs, train)
    model.to(device.torch_device())  # before LoRA: its adapters are made where the layers they wrap are
    precision = device.autocast_dtype()
    trained = _with_trainable_part(config, model)
    train_sample = random.Random(config.sft.seed).sample(train, min(len(audit), len(train)))
    # the grader reads ``model``: LoRA adapters are injected into it in place, so it grades what SFT trains
    grader = HeldOutGrader(model, tokenizer, prompt, config, audit, train_sample, precision)
    sft = _warm_start(config, trained, tokenizer, prompt, train, grader)
    model = merge_adapters(trained) if config.lora.enabled else trained
    out = Path(config.out_dir)
    save_model(model, tokenizer, out)
    prompt.save(out)
    report = _report(config, model, tokenizer, prompt, sft, grader, class_prior(train, audit), len(audit))
    report.update(audit_ranking(model, tokenizer, prompt, grader.voting, audit, gold_train_rows(gold), precision))
    report["seconds"] = round(time.perf_counter() - started, 1)
    paths = {
        "model": out,
        "report": write_json_atomic(out / "teacher_report.json", report),
        "curve": plot_sft_curve(sft.monitor.history, report, out / "sft_curve.png"),
    }
    print_summary(_summary_line(config, report), paths, threads, device)
    return paths


@dataclass
class WarmStart:
    """What SFT did: its examples, per-step losses, planned steps, the checkpoint monitor, seconds, and the
    number of parameters it trained."""

    examples: int
    losses: list[float]
    planned_steps: int
    monitor: BestCheckpoint
    seconds: float
    trainable: int

    @property
    def best(self) -> dict[str, float]:
        return self.monitor.best


def _base_teacher(config: TeacherConfig, pairs: pa.Table, train: list[dict]) -> tuple[Any, Any, TeacherPrompt]:
    """The pretrained base (``base_model``) or the tiny teacher built here, and how it is prompted."""
    if config.base_model:
        model_dir = resolve_base_model(config.base_model)
        model, tokenizer = load_model(model_dir)
        prompt = teacher_prompt(model_dir, tokenizer, config.prompt_version, config.answer_format, config.chat_template)
        return model, tokenizer, prompt
    prompt = teacher_prompt(None, None, config.prompt_version, config.answer_format, config.chat_template)
    return *_build_tiny(config, prompt, pairs, train), prompt


def _with_trainable_part(config: TeacherConfig, model):
    """What SFT trains: LoRA adapters (``lora.rank > 0``) or the model itself, in the top
    ``trainable_layers`` only when set."""
    if config.lora.enabled:
        return add_adapters(model, config.lora, top_layers=config.trainable_layers)
    if config.trainable_layers:
        train_top_layers(model, config.trainable_layers)
    return model


def _warm_start(config: TeacherConfig, trained, tokenizer, prompt: TeacherPrompt, train, grader) -> WarmStart:
    """SFT on the gold train pairs with the checkpoint chosen on audit (module docstring, steps 2 and 3)."""
    examples = [(prompt.render_pair(r), prompt.target(r["gold_grade"], r.get("rationale"))) for r in train]
    trainable = trainable_parameters(trained)
    monitor = BestCheckpoint(trained, grader, SELECTION_METRIC, config.sft.eval_every, config.sft.patience)
    steps = planned_steps(len(examples), config.sft)
    started = time.perf_counter()
    with progress_bar(total=steps, desc="SFT warm start", unit="step", mininterval=1.0) as bar:
        losses = supervised_finetune(
            trained,
            tokenizer,
            examples,
            config.sft,
            on_step=lambda _, loss: (bar.update(), bar.set_postfix(loss=f"{loss:.3f}", refresh=False)),
            classes=[r["gold_grade"] for r in train],  # what sft.balance balances
            regime=_regime(config),
            stop_when=monitor,
            autocast_dtype=grader.autocast_dtype,
        )
    monitor.finish(len(losses))
    return WarmStart(len(examples), losses, steps, monitor, time.perf_counter() - started, trainable)


def _regime(config: TeacherConfig) -> str:
    return ("lora" if config.lora.enabled else "full") if config.base_model else "scratch"


def _report(config, model, tokenizer, prompt, sft: WarmStart, grader, prior, audit_examples: int) -> dict:
    """``teacher_report.json`` (without ``seconds``): the model, the SFT run, the chosen checkpoint's audit and
    train figures, the class-prior baseline and the margin the prior gate reads."""
    best, before = sft.best, sft.monitor.history[0]
    chosen = grader.breakdown[sft.monitor.history.index(best)]
    prior = {**prior, "audit_prior_balanced_accuracy": chosen["balanced_accuracy_prior"]}
    return {
        "base_model": config.base_model or "tiny",
        "parameters": count_parameters(model),
        "trainable_parameters": sft.trainable,
        "lora_rank": config.lora.rank,
        "trainable_layers": config.trainable_layers,
        "vocab_size": len(tokenizer),
        "rl_share": config.rl_share,
        "sft_examples": sft.examples,
        "sft_steps": len(sft.losses),
        "sft_planned_steps": sft.planned_steps,
        "sft_stopped_early": len(sft.losses) < sft.planned_steps,
        "sft_best_step": best["step"],
        "sft_final_loss": sft.losses[-1],
        "sft_seconds_per_step": round(sft.seconds / len(sft.losses), 2),
        "sft_learning_rate": config.sft.learning_rate or LEARNING_RATES[_regime(config)],
        "audit_examples": audit_examples,
        "audit_constrained": config.audit_constrained,
        "audit_accuracy_base": before["audit_accuracy"],
        "audit_balanced_accuracy_base": before["audit_balanced_accuracy"],
        "audit_accuracy_sft": best["audit_accuracy"],
        "audit_balanced_accuracy_sft": best["audit_balanced_accuracy"],
        "audit_unparseable_sft": best["audit_unparseable"],
        **grade_breakdown("audit_sft_", chosen),
        "train_accuracy_sft": best["train_accuracy"],
        "train_balanced_accuracy_sft": best["train_balanced_accuracy"],
        "train_audit_gap": best["train_balanced_accuracy"] - best["audit_balanced_accuracy"],
        **prior,
        "audit_balanced_margin": best["audit_balanced_accuracy"] - chosen["balanced_accuracy_prior"],
        "sft_curve": sft.monitor.history,
        "prompt_version": prompt.version,
        "chat_template": prompt.chat_tokenizer is not None,
        "answer_format": prompt.answer_format,
    }


def _summary_line(config: TeacherConfig, report: dict) -> str:
    what = f"tiny teacher, vocab {report['vocab_size']}" if not config.base_model else config.base_model
    how = f"LoRA rank {config.lora.rank}" if config.lora.enabled else "fine-tuning"
    if config.trainable_layers:
        how += f" of the top {config.trainable_layers} layers"
    steps, planned = report["sft_steps"], report["sft_planned_steps"]
    stopped = f", stopped early at step {steps} of {planned}" if report["sft_stopped_early"] else ""
    best = {k: report[f"{k}_sft"] for k in ("audit_accuracy", "audit_balanced_accuracy", "train_balanced_accuracy")}
    return (
        f"teacher ({what}): {report['parameters']:,} parameters ({report['trainable_parameters']:,} trained, {how}); "
        f"SFT on {report['sft_examples']} pairs, {steps} steps{stopped}, checkpoint of step {report['sft_best_step']} "
        f"chosen on audit: audit accuracy {report['audit_accuracy_base']:.3f} -> {best['audit_accuracy']:.3f}, "
        f"balanced {report['audit_balanced_accuracy_base']:.3f} -> {best['audit_balanced_accuracy']:.3f} (class "
        f"prior {report['audit_prior_accuracy']:.3f}, balanced {report['audit_prior_balanced_accuracy']:.3f}); "
        f"train balanced accuracy {best['train_balanced_accuracy']:.3f} (gap {report['train_audit_gap']:+.3f}); "
        f"{ranking_note(report)} ({report['seconds']} s)"
    )


def ranking_note(report: dict) -> str:
    """How the teacher ranks the audit pairs beside the zero-shot encoder, in words (``audit_ranking``)."""
    ours, encoder = report.get("audit_roc_auc_expected_grade"), report.get("audit_zero_shot_roc_auc")
    if ours is None:
        return "audit ranking: not measured (audit holds one side of relevant only)"
    against = "" if encoder is None else f", the zero-shot encoder {encoder:.3f}"
    return f"its expected grade ranks audit pairs at ROC-AUC {ours:.3f}{against}"


SELECTION_METRIC = "audit_balanced_accuracy"
RELEVANT_FROM = 2  # gold grades counted as relevant by the ranking figures (agpo evaluate's default)


class HeldOutGrader:
    """The ``evaluate`` of SFT's checkpoint choice: the teacher's grades of the audit pairs and of a sample of
    its SFT pairs, read as annotation reads them (module docstring, step 3). Keeps each evaluation's
    per-grade audit figures (``breakdown``, in evaluation order) for the report."""

    def __init__(
        self, model, tokenizer, prompt: TeacherPrompt, config: TeacherConfig, audit, train_sample, autocast_dtype=None
    ) -> None:
        self.model, self.tokenizer, self.prompt, self.config = model, tokenizer, prompt, config
        self.autocast_dtype = autocast_dtype  # the stage's precision (pipelines.devices): grading and SFT alike
        self.sets = {"audit": audit, "train": train_sample}
        self.breakdown: list[dict[str, float]] = []
        self.voting = VotingConfig(mode="score", max_new_tokens=config.max_new_tokens, batch_pairs=64)

    def __call__(self) -> dict[str, float]:
        engine = HFRolloutEngine(self.model, self.tokenizer, autocast_dtype=self.autocast_dtype)
        figures = {}
        for name, rows in self.sets.items():
            metrics = relevance_accuracy(self._grades(engine, rows), [r["gold_grade"] for r in rows])
            figures[f"{name}_accuracy"] = metrics["accuracy"]
            figures[f"{name}_balanced_accuracy"] = metrics["balanced_accuracy"]
            if name == "audit":
                figures["audit_unparseable"] = metrics["unparseable"]
                self.breakdown.append(metrics)
        return figures

    def _grades(self, engine: HFRolloutEngine, rows: list[dict]) -> list[int | None]:
        if not self.config.audit_constrained:
            prompts = [self.prompt.render_pair(r) for r in rows]
            return grade_pairs(engine, self.tokenizer, prompts, self.config.max_new_tokens)[0]
        labeler = PairLabeler(engine, self.tokenizer, self.prompt, self.voting, teacher_run_id="sft-checkpoint")
        return [label["grade"] for label in labeler.label(rows)[0]]


def audit_ranking(
    model,
    tokenizer,
    prompt: TeacherPrompt,
    voting: VotingConfig,
    audit: list[dict],
    gold_train: list[dict],
    autocast_dtype=None,
) -> dict[str, float | int | None]:
    """ROC-AUC of "relevant" (gold grade >= 2) on the audit pairs ranked by the teacher's expected grade (its
    exact grade distribution, score mode; a pair it abstains on ranks lowest and is counted), beside the
    zero-shot encoder's on the same pairs (None where audit holds one side only, or no gold train pair
    fits the encoder's grades)."""
    engine = HFRolloutEngine(model, tokenizer, autocast_dtype=autocast_dtype)
    labels = PairLabeler(engine, tokenizer, prompt, voting, "sft-ranking").label(audit)[0]
    expected = [-1.0 if p is None else sum(k * q for k, q in enumerate(p)) for p in (r["grade_probs"] for r in labels)]
    relevant = [int(r["gold_grade"] >= RELEVANT_FROM) for r in audit]
    figures: dict[str, float | int | None] = {
        "audit_roc_auc_expected_grade": None,
        "audit_zero_shot_roc_auc": None,
        "audit_ranking_abstained": sum(r["grade_probs"] is None for r in labels),
    }
    if len(set(relevant)) < 2:
        return figures
    figures["audit_roc_auc_expected_grade"] = roc_auc(y_true=relevant, scores=expected)
    if gold_train:
        placement = Placement(str(model_device(model)), autocast_dtype)
        encoder = zero_shot_student(BaselinesConfig().encoder, gold_train, len(ESCI_GRADES), placement=placement)
        cosine = encoder.similarity([r["query"] for r in audit], [r["ad_title"] for r in audit])
        figures["audit_zero_shot_roc_auc"] = roc_auc(y_true=relevant, scores=cosine.tolist())
    return figures


def class_prior(train: list[dict], audit: list[dict]) -> dict[str, float]:
    """The class-prior baseline on audit: the SFT pairs' most common grade (ties to the lower grade) and the
    accuracy of answering it for every audit pair."""
    counts = Counter(r["gold_grade"] for r in train)
    majority = min(counts, key=lambda g: (-counts[g], g))
    gold = [r["gold_grade"] for r in audit]
    return {"class_prior_grade": majority, "audit_prior_accuracy": gold.count(majority) / len(gold)}


def plot_sft_curve(history: list[dict[str, float]], prior: dict[str, float], path: Path) -> Path:
    """Audit and train accuracy and balanced accuracy against SFT steps, with the class-prior lines."""
    steps = [h["step"] for h in history]
    ends = [steps[0], steps[-1]]
    curves = {
        f"{split} {label}": (steps, [h[f"{split}_{metric}"] for h in history])
        for split in ("train", "audit")
        for label, metric in (("accuracy", "accuracy"), ("balanced accuracy", "balanced_accuracy"))
    }
    curves["class prior: audit accuracy"] = (ends, [prior["audit_prior_accuracy"]] * 2)
    curves["class prior: balanced accuracy (1/K)"] = (ends, [prior["audit_prior_balanced_accuracy"]] * 2)
    return plot_learning_curves(
        curves, path, title="Teacher SFT: train vs held-out audit", xlabel="SFT step", ylabel="accuracy"
    )


def _build_tiny(config: TeacherConfig, prompt: TeacherPrompt, pairs: pa.Table, train: list[dict]):
    """The tiny teacher: a BPE tokenizer on the prompts (read a batch of pairs at a time) and SFT targets, and a
    fresh Qwen2 decoder."""
    corpus = itertools.chain(
        (prompt.render_pair(r) for r in PairRows(tokenizer_pairs(pairs))),
        (prompt.target(r["gold_grade"], r.get("rationale")) for r in train),
    )
    tokenizer = train_bpe_tokenizer(corpus, config.model.vocab_size)
    return build_tiny_qwen2(tokenizer, config.model), tokenizer
