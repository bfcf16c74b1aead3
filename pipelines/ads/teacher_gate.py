"""The teacher gate: may the trained teacher label data? No retry changes the answer, so a failure stops.

Two checks on the RL stage's ``summary.json``:

1. accuracy: ``summary[gate_metric] >= min_audit_accuracy``;
2. one grade: the largest share of the teacher's greedy audit answers taken by one grade
   (``audit_predicted/g{k}_end``) is at most ``max_predicted_share`` (1.0: no check). A teacher SFT'd on
   skewed real grades that answers the top grade for every pair passes an accuracy bar at the top grade's
   share, and would label everything alike. A summary without the shares (a teacher trained before they
   were recorded) fails, saying so, unless the check is off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agpo.rewards import ESCI_GRADES
from pipelines.errors import StageFailed

GATE_METRICS = ("audit_accuracy_end", "audit_greedy_accuracy_end", "audit_maj@4_end")


class GateFailed(StageFailed):
    """The teacher is not good enough to label data; retrying will not change that."""


def judge_teacher(
    summary: dict[str, Any], path: Path, gate_metric: str, min_audit_accuracy: float, max_predicted_share: float
) -> tuple[dict[str, float], str | None]:
    """The gate's figures (for tracking) and why the teacher fails, or None when it passes."""
    value = float(summary[gate_metric])
    figures = {gate_metric: value, "gate_threshold": min_audit_accuracy}
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
