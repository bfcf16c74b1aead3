"""Plots people would rather look at than read. Matplotlib with the file-only Agg backend."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pipelines.io import write_atomic


def _save(fig: plt.Figure, path: str | Path) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return write_atomic(path, buffer.getvalue())


def plot_pass_at_k(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float], Sequence[float]]],
    path: str | Path,
    title: str,
    baseline: tuple[str, Sequence[int], Sequence[float]] | None = None,
) -> Path:
    """pass@k against k (log2 axis): one line per algorithm with a +/- std band, the base model dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if baseline is not None:
        name, ks, values = baseline
        ax.plot(ks, values, "k--", label=name)
    _mean_sd_lines(ax, curves, "k (samples)", "pass@k", title)
    return _save(fig, path)


def plot_mean_sd_panels(
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float]]]],
    path: str | Path,
    title: str,
    xlabel: str,
) -> Path:
    """One panel per y label (e.g. a metric), side by side: one line per name with a +/- sd band, log2 x."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (ylabel, curves) in zip(axes[0], panels.items(), strict=True):
        _mean_sd_lines(ax, curves, xlabel, ylabel, ylabel)
    fig.suptitle(title)
    return _save(fig, path)


def _mean_sd_lines(ax, curves: Mapping[str, tuple[Sequence, Sequence, Sequence]], xlabel, ylabel, title) -> None:
    for name, (xs, mean, sd) in curves.items():
        (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=name)
        low = [m - s for m, s in zip(mean, sd, strict=True)]
        high = [m + s for m, s in zip(mean, sd, strict=True)]
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def plot_frontier(
    paths: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]]]], path: str | Path, title: str, k: int
) -> Path:
    """pass@k against pass@1 along training: one colour per algorithm, one line per seed, a star at its end."""
    fig, ax = plt.subplots(figsize=(6.5, 5))
    for index, (name, seeds) in enumerate(paths.items()):
        color = f"C{index}"
        for seed, (pass1, passk) in enumerate(seeds):
            ax.plot(pass1, passk, marker="o", markersize=3, color=color, alpha=0.8, label=name if seed == 0 else None)
            ax.plot(pass1[-1:], passk[-1:], marker="*", markersize=10, color=color)
    ax.set_xlabel("held-out pass@1")
    ax.set_ylabel(f"held-out pass@{k}")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_scatter_fit(
    points: tuple[Sequence[float], Sequence[float]],
    line: tuple[float, float],
    labeled: Mapping[str, tuple[float, float]],
    path: str | Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Grey points with their fitted line y = intercept + slope * x, and named points on top of them."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ax.scatter(*points, color="0.5", s=18, label="controls")
    xs = [min([*points[0], *(x for x, _ in labeled.values())]), max(points[0])]
    intercept, slope = line
    ax.plot(xs, [intercept + slope * x for x in xs], "k--", label=f"fit: slope {slope:.3f}")
    for index, (name, (x, y)) in enumerate(labeled.items()):
        ax.scatter([x], [y], color=f"C{index}", s=50, marker="D", label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_learning_curves(
    curves: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    path: str | Path,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """One line per run name: y against x (e.g. pass@1 against generated tokens)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (xs, ys) in curves.items():
        ax.plot(xs, ys, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_annotation_quality(report: Mapping, path: str | Path) -> Path:
    """Label distribution (bars) beside the gold-by-label confusion matrix (heat map) when gold exists."""
    agreement = report.get("gold_agreement")
    fig, axes = plt.subplots(1, 2 if agreement else 1, figsize=(10 if agreement else 5, 4))
    bars = axes[0] if agreement else axes
    grades = list(report["label_distribution"])
    bars.bar(grades, [report["label_distribution"][g] for g in grades], color="tab:blue")
    bars.set_xlabel("grade")
    bars.set_ylabel("pairs")
    bars.set_title(
        f"labels (abstained {report['abstention_rate']:.1%}, parse failures {report['parse_failure_rate']:.1%})"
    )
    if agreement:
        _confusion_heatmap(axes[1], agreement["confusion_gold_by_label"], grades, "teacher label")
        axes[1].set_title(
            f"agreement with gold: accuracy {agreement['accuracy']:.3f}, macro-F1 {agreement['macro_f1']:.3f}"
        )
    return _save(fig, path)


def _confusion_heatmap(ax, matrix: Sequence[Sequence[int]], grades: Sequence[str], xlabel: str) -> None:
    """Counts of gold grade (rows) by predicted label (columns), each cell written in a readable colour."""
    ax.imshow(matrix, cmap="Blues")
    darkest = max(max(row) for row in matrix) or 1
    for g, row in enumerate(matrix):
        for c, value in enumerate(row):
            colour = "white" if value > darkest / 2 else "black"  # readable on dark cells
            ax.text(c, g, str(value), ha="center", va="center", fontsize=8, color=colour)
    ax.set_xticks(range(len(matrix)), grades)
    ax.set_yticks(range(len(matrix)), grades)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("gold grade")


def plot_confusion(matrix: Sequence[Sequence[int]], path: str | Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(5, 4))
    _confusion_heatmap(ax, matrix, [str(g) for g in range(len(matrix))], "predicted grade")
    ax.set_title(title)
    return _save(fig, path)


def plot_reliability(bins: Sequence[Mapping], ece: float, path: str | Path, title: str) -> Path:
    """Reliability diagram: accuracy against mean confidence per bin, the diagonal is perfect calibration."""
    fig, ax = plt.subplots(figsize=(5, 4))
    filled = [b for b in bins if b["count"]]
    width = 1 / len(bins)
    ax.bar(
        [b["lower"] for b in filled],
        [b["accuracy"] for b in filled],
        width=width,
        align="edge",
        edgecolor="black",
        color="tab:blue",
        label="accuracy",
    )
    ax.plot([0, 1], [0, 1], "--", color="grey", label="perfect calibration")
    ax.set_xlabel("confidence (top-grade probability)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"{title} (ECE {ece:.3f})")
    ax.legend(loc="upper left")
    return _save(fig, path)


def plot_ranking_curves(
    curves: Mapping[str, Mapping[str, Sequence[Sequence[float]]]], aucs: Mapping[str, Mapping[str, float]], path
) -> Path:
    """ROC and precision-recall curves of "relevant", one line per model (``evaluation.metrics.relevance_curves``),
    each labelled with its area (``aucs``: roc_auc_relevant, pr_auc_relevant)."""
    fig, (roc, pr) = plt.subplots(1, 2, figsize=(10, 4.5))
    for name, curve in curves.items():
        roc.plot(*curve["roc"], label=f"{name} (AUC {aucs[name]['roc_auc_relevant']:.3f})")
        pr.step(*curve["pr"], where="post", label=f"{name} (AP {aucs[name]['pr_auc_relevant']:.3f})")
    roc.plot([0, 1], [0, 1], "--", color="grey", linewidth=1)
    roc.set(xlabel="false positive rate", ylabel="true positive rate", title='ROC of "relevant"')
    pr.set(xlabel="recall", ylabel="precision", title='precision-recall of "relevant"', ylim=(0, 1.02))
    for ax in (roc, pr):
        ax.legend(loc="lower right" if ax is roc else "lower left", fontsize=8)
    return _save(fig, path)


def plot_differences(differences: Mapping[str, Mapping[str, Mapping]], path: str | Path, confidence: float) -> Path:
    """A forest plot: per metric, every "a - b" difference as a point with its bootstrap interval, and 0 marked
    (an interval clear of 0 is a difference the gold pairs can tell)."""
    metrics = list(next(iter(differences.values())))
    names = list(differences)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 0.5 * len(names) + 1.5), sharey=True)
    axes_list = list(np.atleast_1d(axes))
    for ax, metric in zip(axes_list, metrics, strict=True):
        values = [differences[name][metric] for name in names]
        centre = [v["difference"] for v in values]
        errors = [
            [c - v["low"] for c, v in zip(centre, values, strict=True)],
            [v["high"] - c for c, v in zip(centre, values, strict=True)],
        ]
        ax.errorbar(centre, range(len(names)), xerr=errors, fmt="o", capsize=3)
        ax.axvline(0, color="grey", linestyle="--", linewidth=1)
        ax.set_title(f"{metric}: difference, {confidence:.0%} interval")
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels(names, fontsize=8)
    axes_list[0].invert_yaxis()  # the axes share y: invert once, so the first difference is on top
    return _save(fig, path)
