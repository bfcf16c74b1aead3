"""The teacher gate: may the trained teacher label data? No retry changes the answer, so a failure stops.

The prior check (``judge_prior``) runs twice: on the SFT teacher (its ``teacher_report.json``, before any RL
or annotation compute is spent) and on the RL teacher. A teacher whose greedy audit balanced accuracy B is
not above the class-prior bar P = 1/K (what any answer that ignores the pair scores;
pipelines.ads.teacher.audit_metrics) by

    B - P >= max(min_balanced_margin, 2 * se)      (se: the null standard error of B on these audit pairs)

answers at its class prior on held-out queries: it fits its training pairs and learns nothing that
transfers, and its labels would carry the class rates, not the pairs. Then, on the RL stage's
``summary.json``:

1. accuracy: ``summary[gate_metric] >= min_audit_accuracy``;
2. one grade: the largest share of the teacher's greedy audit answers taken by one grade
   (``audit_predicted/g{k}_end``) is at most ``max_predicted_share`` (1.0: no check). A teacher SFT'd on
   skewed real grades that answers the top grade for every pair passes an accuracy bar at the top grade's
   share, and would label everything alike. A summary without the shares (a teacher trained before they
   were recorded) fails, saying so, unless the check is off.

Reuse (``reuse_verdict``): a run may start from a teacher that passed these gates before
(``TeacherReuseConfig``; registered by pipelines.ads.serving.teacher_registry). It is reused unless asked to
retrain (``mode: never``), or, in ``mode: auto``, the gold train pairs changed since it was trained by more
than ``retrain_gold_change`` (pairs added plus pairs removed, over the pairs it was trained with), or its figures
on this run's audit pairs fall below the gates above. ``mode: always`` reuses it whatever changed (the gate
step still judges it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from pipelines.ads.teacher.relevance_reward import ESCI_GRADES
from pipelines.errors import StageFailed, StepSkipped
from pipelines.io import write_json_atomic


class GateFailed(StageFailed):
    """The teacher is not good enough to label data; retrying will not change that."""


PRIOR_FIX = "more or cleaner gold, a larger base model, or a GPU preset"
REUSE_MODES = ("auto", "always", "never")


@dataclass(frozen=True)
class TeacherReuseConfig:
    """Start a run from a teacher that passed its gates before, and register the ones that pass."""

    source: str | None = field(
        default=None,
        metadata={
            "help": "the teacher to start from: current (this run's teacher model's current version: "
            "models:/<registered_model>@current), models:/<name>@<alias>, models:/<name>/<N>, or a teacher folder; "
            "null: every run trains its teacher (SFT, then RL). A scheduled DAG run that names none takes current"
        },
    )
    mode: str = field(
        default="auto",
        metadata={
            "help": f"one of {list(REUSE_MODES)}: auto reuses the source unless the gold train pairs changed by "
            "more than retrain_gold_change or its audit figures on this run's audit pairs fall below the gates; "
            "always reuses it as is; never trains anew (asked to retrain)"
        },
    )
    retrain_gold_change: float = field(
        default=0.1,
        metadata={
            "help": "auto: retrain when (gold train pairs added + removed) / the pairs the teacher was trained on "
            "exceeds this (a changed grade or text counts as one removed and one added)"
        },
    )
    register: bool = field(
        default=True,
        metadata={"help": "register a trained teacher that passes its gates and move its `current` alias to it"},
    )
    registered_model: str | None = field(
        default=None,
        metadata={"help": "registry name of the teacher; null: <tracking.registered_model>-teacher"},
    )

    def __post_init__(self) -> None:
        if self.mode not in REUSE_MODES:
            raise ValueError(f"teacher_reuse.mode must be one of {list(REUSE_MODES)}, got {self.mode!r}")
        if not 0.0 <= self.retrain_gold_change <= 1.0:
            raise ValueError(f"teacher_reuse.retrain_gold_change must be in [0, 1], got {self.retrain_gold_change!r}")


def gold_change(trained_on: set[str], now: set[str]) -> float:
    """(pairs added + pairs removed) / the pairs the teacher was trained on: 0.0 for the same set."""
    return len(trained_on ^ now) / max(len(trained_on), 1)


def reuse_verdict(
    config: TeacherReuseConfig, change: float | None, audit_failure: str | None = None
) -> tuple[bool, str]:
    """Whether to reuse the teacher (the module docstring's rule) and why; ``change``: ``gold_change`` since it
    was trained (None: not recorded, e.g. a folder); ``audit_failure``: why it fails the gates on this run's
    audit pairs, else None."""
    if config.mode == "never":
        return False, "teacher_reuse.mode is never: asked to retrain"
    moved = "not recorded" if change is None else f"{change:.1%}"
    if config.mode == "always":
        return True, f"teacher_reuse.mode is always (gold train pairs changed: {moved})"
    if change is not None and change > config.retrain_gold_change:
        return False, f"the gold train pairs changed by {moved} > retrain_gold_change {config.retrain_gold_change:.1%}"
    if audit_failure is not None:
        return False, f"on this run's audit pairs it fails its gates: {audit_failure}"
    return True, f"gold train pairs changed by {moved} <= {config.retrain_gold_change:.1%} and it passes its gates"


def judge_prior(
    balanced: float, prior: float, null_se: float, min_margin: float | None, path: Path
) -> tuple[dict[str, float], str | None]:
    """The prior check of the module docstring: its figures and why the teacher fails, or None (also when
    ``min_margin`` is None: the check is off)."""
    figures = {"audit_balanced_accuracy": balanced, "audit_balanced_prior": prior, "audit_balanced_null_se": null_se}
    if min_margin is None:
        return figures, None
    needed = max(min_margin, 2 * null_se)
    figures["gate_balanced_needed"] = prior + needed
    if balanced - prior >= needed:
        return figures, None
    return figures, (
        f"the teacher answers at its class prior on held-out queries: audit balanced accuracy {balanced:.3f}, "
        f"where any answer that ignores the pair scores {prior:.3f}; it needs {prior + needed:.3f} "
        f"(min_balanced_margin {min_margin} or twice the {null_se:.3f} that chance reaches on these audit pairs). "
        f"Its labels would carry its training class rates, not the pairs: {PRIOR_FIX} "
        f"(min_balanced_margin: null skips this check) ({path})"
    )


def judge_sft_teacher(report: dict[str, Any], path: Path, min_margin: float | None) -> str | None:
    """Why the SFT teacher (its ``teacher_report.json``) fails the prior check, or None."""
    return judge_prior(
        report["audit_balanced_accuracy_sft"],
        report["audit_sft_balanced_accuracy_prior"],
        report["audit_sft_balanced_accuracy_null_se"],
        min_margin,
        path,
    )[1]


def judge_teacher(
    summary: dict[str, Any],
    path: Path,
    gate_metric: str,
    min_audit_accuracy: float,
    max_predicted_share: float,
    min_balanced_margin: float | None = None,
) -> tuple[dict[str, float], str | None]:
    """The gate's figures (for tracking) and why the RL teacher fails, or None when it passes."""
    figures: dict[str, float] = {}
    if min_balanced_margin is not None:
        keys = (
            "audit_balanced_accuracy_end",
            "audit_balanced_accuracy_prior_end",
            "audit_balanced_accuracy_null_se_end",
        )
        if any(k not in summary for k in keys):
            raise GateFailed(
                f"{path} has no {keys[1]} / {keys[2]} (a teacher trained before they were recorded), so the gate "
                "cannot compare the teacher with its class prior: train it again, or set min_balanced_margin: null"
            )
        figures, failure = judge_prior(*(float(summary[k]) for k in keys), min_balanced_margin, path)
        if failure:
            return figures, failure
    value = float(summary[gate_metric])
    figures.update({gate_metric: value, "gate_threshold": min_audit_accuracy})
    if value < min_audit_accuracy:
        return figures, (
            f"teacher {gate_metric} {value:.3f} < min_audit_accuracy {min_audit_accuracy}: "
            f"it would label badly; train longer or lower the threshold ({path})"
        )
    if max_predicted_share >= 1:
        return figures, None
    grade, share = top_predicted_grade(summary, path)
    figures.update(audit_top_predicted_share=share, gate_max_predicted_share=max_predicted_share)
    if share > max_predicted_share:
        return figures, (
            f"teacher answers grade {grade} for {share:.1%} of audit pairs > max_predicted_share "
            f"{max_predicted_share}: it has collapsed to one grade and would label everything alike; "
            f"SFT it class-balanced (teacher.sft.balance: sample, the default) on more pairs of its rare grades, "
            f"or raise max_predicted_share (1.0: no check) ({path})"
        )
    return figures, None


def top_predicted_grade(summary: dict[str, Any], path: Path) -> tuple[int, float]:
    """The grade the teacher answered most on the audit split at the end of RL, and its share."""
    shares = {g: summary.get(f"audit_predicted/g{g}_end") for g in ESCI_GRADES}
    if None in shares.values():
        raise GateFailed(
            f"{path} has no audit_predicted/g{{k}}_end shares (a teacher trained before they were recorded), "
            "so the gate cannot tell whether the teacher answers one grade: train it again, or set "
            "max_predicted_share: 1.0 to skip this check"
        )
    grade = max(shares, key=lambda g: shares[g])
    return grade, float(shares[grade])


def skipped_record(record: Path) -> dict[str, Any] | None:
    """{step, reason} of a teacher that failed a gate (its ``teacher_skipped.json``), else None."""
    return json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None


def skip_teacher(record: Path, step: str, reason: str) -> NoReturn:
    """Record that the teacher failed a gate at ``step`` (``teacher_skipped.json``) and raise ``StepSkipped``:
    the teacher path stops here and the run goes on with the gold-only student and the baselines."""
    write_json_atomic(record, {"step": step, "reason": reason})
    raise StepSkipped(
        f"{reason}\nthe teacher is skipped: no RL, no annotation; the run goes on with the student on the gold "
        "train pairs alone and the baselines, and registers the best of them. To try the teacher again with "
        "other gates or another model, start a new run (another run name): this run's student is the gold-only one"
    )
