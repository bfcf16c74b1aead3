"""Does a better teacher give a better student? The student's sensitivity to label accuracy, measured on
controls of known label accuracy, and where each teacher's students land against it.

Controls are students trained on gold labels (label accuracy 1) and on gold with a share p of the grades
replaced by another grade (1 - p, exactly). Over every control student (one point each) a least-squares
line gives macro-F1 = a + b * label accuracy; b is the student's macro-F1 change per unit of label accuracy
(0.2 means 0.2 points of macro-F1 per point of label accuracy), with its standard error
sqrt(SSR / (n - 2) / Sxx). A teacher's label set is placed by its mean label accuracy (agreement with the
hidden gold) and its students' mean macro-F1: ``residual`` = actual - (a + b * label accuracy). A residual
near 0 means the student follows label accuracy as the controls do; a positive one, that the teacher's
errors hurt less than random flips of the same share (errors on hard pairs, or soft labels that carry the
right grade as a second choice).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.plots import plot_scatter_fit


def fit_sensitivity(students: Sequence[dict[str, Any]], metric: str = "macro_f1") -> dict[str, Any]:
    """The control line over every control student and each teacher label set's place against it."""
    controls = [s for s in students if s.get("control")]
    x = np.array([s["label_accuracy"] for s in controls], dtype=float)
    y = np.array([s[metric] for s in controls], dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError("the sensitivity line needs control students at two label accuracies at least")
    slope, intercept = np.polyfit(x, y, 1)
    residuals = y - (intercept + slope * x)
    sxx = float(((x - x.mean()) ** 2).sum())
    slope_se = float(np.sqrt((residuals**2).sum() / (len(x) - 2) / sxx)) if len(x) > 2 else None
    teachers = []
    for name in dict.fromkeys(s["labels"] for s in students if not s.get("control")):
        mine = [s for s in students if s["labels"] == name]
        if mine[0].get("label_accuracy") is None:
            continue  # no hidden gold for this label set: it cannot be placed
        accuracy, actual = float(mine[0]["label_accuracy"]), float(np.mean([s[metric] for s in mine]))
        predicted = float(intercept + slope * accuracy)
        teachers.append(
            {
                "labels": name,
                "label_accuracy": accuracy,
                metric: actual,
                "predicted": predicted,
                "residual": actual - predicted,
                "seeds": len(mine),
            }
        )
    return {
        "metric": metric,
        "slope": float(slope),
        "slope_se": slope_se,
        "intercept": float(intercept),
        "control_students": len(controls),
        "teachers": teachers,
    }


def sensitivity_markdown(fit: dict[str, Any]) -> str:
    metric = fit["metric"]
    se = f" ± {fit['slope_se']:.3f} (standard error)" if fit["slope_se"] is not None else ""
    lines = [
        f"Student {metric} against label accuracy over {fit['control_students']} control students (gold and "
        f"gold with grades replaced): {metric} = {fit['intercept']:.3f} + **{fit['slope']:.3f}**{se} x label "
        f"accuracy, i.e. {fit['slope']:.3f} points of student {metric} per point of label accuracy.",
        "",
        f"| teacher labels | label acc | student {metric} | line predicts | residual |",
        "|---|---:|---:|---:|---:|",
    ]
    for t in fit["teachers"]:
        lines.append(
            f"| {t['labels']} | {t['label_accuracy']:.3f} | {t[metric]:.3f} | {t['predicted']:.3f} "
            f"| {t['residual']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot_sensitivity(students: Sequence[dict[str, Any]], fit: dict[str, Any], path: Path) -> Path:
    metric = fit["metric"]
    controls = [s for s in students if s.get("control")]
    return plot_scatter_fit(
        ([s["label_accuracy"] for s in controls], [s[metric] for s in controls]),
        (fit["intercept"], fit["slope"]),
        {t["labels"]: (t["label_accuracy"], t[metric]) for t in fit["teachers"]},
        path,
        title=f"student {metric} against label accuracy (controls: gold with grades replaced)",
        xlabel="label accuracy against hidden gold",
        ylabel=f"student {metric} on gold test",
    )
