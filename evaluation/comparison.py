"""One vocabulary for comparing models on the gold test pairs, and the champion rule.

The names an evaluation report (agpo evaluate's ``metrics.json``) gives its models, their titles, the baselines,
how a difference and its bootstrap interval are written and logged, and ``champion_candidate``: the rule that
decides which model a run may hand back. Evaluate, the registry, the pipeline, the studies and ``agpo compare``
read them here; the docs link here instead of restating the rule. Imports no torch, so configs may use it.

**The champion rule** (``champion_candidate``, on ``tracking.champion_metric``). The floor is the strongest
baseline: the best on the metric of the baselines the evaluation scored (``evaluate.baselines.names``, by default
the lexical matcher and the zero-shot encoder; on a tie the one registered first in evaluation.baseline_registry,
the simpler: the lexical matcher). Then, simplest first, the gold-only student (the same recipe on the team's
gold train pairs, no teacher) and the pipeline's student: each becomes the candidate when it beats every model
before it beyond its interval (the lower bound of each paired-bootstrap difference above 0), every baseline
included. So the model a run hands back is never below the strongest baseline on the metric, a more complex
model has to earn its place on the team's own test pairs, and a run whose teacher was skipped hands back the
gold-only student or a baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evaluation.baseline_registry import BASELINES as REGISTERED

STUDENT, GOLD_ONLY = "student", "gold_only"  # the pipeline's student; the same recipe on gold train pairs alone
BASELINES = tuple(REGISTERED)  # what a team has without this pipeline, simplest (registered) first
SIMPLEST_FIRST = (*BASELINES, GOLD_ONLY, STUDENT)
TITLES = {STUDENT: "student", GOLD_ONLY: "gold-only student"} | {name: b.title for name, b in REGISTERED.items()}
# the evaluation's plots of every model side by side (its confusion and reliability plots are the student's alone)
DIFFERENCES_PLOT, RANKING_PLOT = "differences.png", "ranking_curves.png"
CONFUSION_PLOT, RELIABILITY_PLOT = "confusion.png", "reliability.png"
COMPARED = ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ece")  # a comparison table's figures
COMPARISON_PLOTS = (DIFFERENCES_PLOT, RANKING_PLOT)


def title(name: str) -> str:
    """A model's title in tables and plots (another model of ``compare_with`` keeps its own name)."""
    return TITLES.get(name, name)


def table_columns(ndcg: str) -> tuple[str, ...]:
    """The metric columns of a comparison table: ``COMPARED``, with ``ndcg`` (NDCG@k, named by its k) before ece."""
    return (*COMPARED[:4], ndcg, COMPARED[4])


def the(name: str) -> str:
    """A model named in a sentence: "the zero-shot encoder", "the pipeline's student"."""
    return "the pipeline's student" if name == STUDENT else f"the {title(name)}"


def difference(a: str, b: str) -> str:
    """The report's key of the paired difference a - b."""
    return f"{a} - {b}"


def interval(diff: Mapping[str, float]) -> str:
    """``+0.012 [-0.010, +0.034]``: a difference and its bootstrap interval."""
    return f"{diff['difference']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]"


def interval_figures(key: str, diff: Mapping[str, float]) -> dict[str, float]:
    """MLflow metrics of one interval: ``key``, ``key_low``, ``key_high``."""
    return {key: diff["difference"], f"{key}_low": diff["low"], f"{key}_high": diff["high"]}


def evaluation_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the evaluate step logs beside the report's own figures: every other model's metrics as
    ``<model>_<metric>`` and every interval as ``diff_<a>_vs_<b>_<metric>`` (with ``_low`` and ``_high``)."""
    figures: dict[str, Any] = {}
    for name, metrics in report["models"].items():
        if name != STUDENT:
            figures.update({f"{name}_{k}": v for k, v in metrics.items()})
    for pair, values in report["differences"].items():
        a, b = pair.split(" - ")
        for metric, diff in values.items():
            figures.update(interval_figures(f"diff_{a}_vs_{b}_{metric}", diff))
    return figures


def baseline_figures(report: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The scored baselines' figures, by name, in the report's order (a model card sets the student beside them)."""
    return {name: figures for name, figures in (report.get("models") or {}).items() if name in BASELINES}


def strongest_baseline(models: Mapping[str, Mapping[str, Any]], metric: str) -> str | None:
    """The baseline with the highest ``metric`` among ``models`` (name -> metrics), the one registered first (the
    simpler) on a tie: the champion rule's floor; None when no baseline was scored."""
    return max((name for name in BASELINES if name in models), key=lambda name: models[name][metric], default=None)


def champion_candidate(report: Mapping[str, Any], metric: str) -> dict[str, Any]:
    """The model of an evaluation report that may become champion, by the module docstring's rule:
    {candidate (a name of ``SIMPLEST_FIRST``, None when no model was scored), strongest_baseline,
    teacher_added (the interval of student - gold_only, when both exist), reason}."""
    differences = report.get("differences") or {}
    models = report.get("models") or {}
    teacher = differences.get(difference(STUDENT, GOLD_ONLY), {}).get(metric)
    teacher_added = None if teacher is None else f"teacher labels added {interval(teacher)} {metric}"
    baselines = [name for name in BASELINES if name in models]
    floor = strongest_baseline(models, metric)
    base = {"strongest_baseline": floor, "teacher_added": teacher_added}
    if floor is None:  # no floor to clear: a student is never registered unmeasured against what a team has
        reason = "no baseline was scored (evaluate.baselines off, or no gold train pairs): nothing is registered"
        return {**base, "candidate": None, "reason": reason}
    ladder = baselines + [name for name in (GOLD_ONLY, STUDENT) if name in models]
    candidate = floor
    notes = [teacher_added] if teacher_added else []
    if len(baselines) > 1:
        notes.append(f"strongest baseline {floor}: " + ", ".join(f"{b} {models[b][metric]:.4f}" for b in baselines))
    for model in [name for name in ladder if name not in baselines]:
        simpler = ladder[: ladder.index(model)]
        against = [differences[difference(model, other)][metric] for other in simpler]
        notes.append(f"{model} - " + ", ".join(f"{o} {interval(d)}" for o, d in zip(simpler, against, strict=True)))
        if all(diff["low"] > 0 for diff in against):
            candidate = model
    more = [name for name in ladder[ladder.index(candidate) + 1 :] if name not in baselines]
    if candidate in baselines:
        why = f"{the(candidate)} is the candidate on {metric}: the strongest baseline"
    else:
        why = f"{the(candidate)} is the candidate on {metric}: it beats every simpler model beyond its interval"
    if more:
        why += f"; {', '.join(the(m) for m in more)} did not beat every simpler model"
    return {**base, "candidate": candidate, "reason": f"{why} ({'; '.join(notes)})" if notes else why}
