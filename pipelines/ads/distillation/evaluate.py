"""Stage ``agpo evaluate``: score a student, the students it competes with and the baselines a team has
without this pipeline, on the same gold pairs, with paired bootstrap intervals of every difference.

Models, all scored on the gold pairs of ``split`` in the pairs file:

- ``student``: ``model`` (a ``save_pretrained`` student of any kind; ``backend: onnx`` serves its
  ``student.onnx`` with onnxruntime instead of torch);
- each of ``compare_with`` (name -> student folder, same backend): the pipeline passes its gold-only
  student (``gold_only``, trained on the gold train pairs alone), so the run shows what the teacher's labels
  added;
- the baselines ``baselines.names`` names (evaluation.baseline_registry), fitted on the pairs file's gold train
  pairs, by default the zero-shot sentence encoder (cosine, ordinal grade fit) and the lexical matcher (match
  features + regression); ``bm25`` adds rank-bm25's score (evaluation.bm25).

Per model: accuracy, macro-F1, per-grade precision and recall, ROC-AUC and PR-AUC of "relevant" (grade >=
``relevant_from``) and one-vs-rest, NDCG@k per query ranked by the expected grade with ESCI gains,
expected calibration error, the confusion matrix and the reliability bins. Per pair of models (each model
against every model after it, in the order student, the compared students, the baselines as named): the
difference in macro-F1 and in ROC-AUC(relevant) with its paired query-level bootstrap interval
(evaluation.bootstrap; ``bootstrap`` sets samples, confidence and seed). ``strongest_baseline`` names the best
baseline on each of those metrics. The champion rule (evaluation.comparison) reads these intervals.

The fitted baselines are saved as model folders (``baselines/<name>``: ``zero_shot`` a bi student with no
training; ``lexical`` and ``bm25`` their state as JSON), so whichever model the champion rule picks can be registered,
served and scored like a student; ``baseline_models`` in metrics.json names the folders.

Writes into ``out_dir``: ``metrics.json`` (the student's metrics at the top level, every model's under
``models``, the intervals under ``differences``), ``comparison.md`` (both tables), ``differences.png``
(every interval, where people would rather look than read), ``confusion.png`` and ``reliability.png``
(the student's).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from compute.placement import Placement
from evaluation.baseline_registry import fit_baselines
from evaluation.bootstrap import METRICS as BOOTSTRAP_METRICS
from evaluation.bootstrap import bootstrap_differences
from evaluation.comparison import (
    CONFUSION_PLOT,
    DIFFERENCES_PLOT,
    RANKING_PLOT,
    RELIABILITY_PLOT,
    STUDENT,
    interval,
    strongest_baseline,
    table_columns,
    title,
)
from evaluation.metrics import (
    accuracy,
    confusion_matrix,
    expected_calibration_error,
    macro_f1,
    ndcg_at_k,
    precision_recall_per_grade,
    relevance_aucs,
    relevance_curves,
)
from evaluation.predictors import Predictor, load_predictor
from evaluation.zero_shot import gold_train_rows
from pipelines.ads.distillation import distil as distil_stage
from pipelines.ads.distillation.distil import DistilConfig
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.ads.intake.contracts import ContractError, read_gold_pairs
from pipelines.devices import use_device
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_confusion, plot_differences, plot_ranking_curves, plot_reliability
from pipelines.progress import progress_bar
from pipelines.threads import use_threads


def relevance_metrics(
    probs: np.ndarray, gold: list[int], query_ids: list[str], relevant_from: int = 2, ndcg_k: int = 10
) -> dict[str, Any]:
    """Every offline metric of one set of predicted grade distributions against gold grades."""
    grades = probs.shape[1]
    predicted = probs.argmax(1).tolist()
    ece, bins = expected_calibration_error(y_true=gold, probs=probs)
    expected_grade = (probs * np.arange(grades)).sum(1).tolist()  # ranks each query's ads
    return {
        "pairs": len(gold),
        "accuracy": accuracy(y_true=gold, y_pred=predicted, num_grades=grades),
        "macro_f1": macro_f1(y_true=gold, y_pred=predicted, num_grades=grades),
        **relevance_aucs(y_true=gold, probs=probs, relevant_from=relevant_from),
        f"ndcg@{ndcg_k}": ndcg_at_k(query_ids=query_ids, y_true=gold, scores=expected_grade, k=ndcg_k),
        "ece": ece,
        "per_grade": precision_recall_per_grade(y_true=gold, y_pred=predicted, num_grades=grades),
        "confusion_gold_by_predicted": confusion_matrix(y_true=gold, y_pred=predicted, num_grades=grades),
        "reliability_bins": bins,
    }


def load_student(folder: str | Path, config: EvaluateConfig, threads: int, placement: Placement) -> Predictor:
    return load_predictor(folder, config.backend, config.max_length, threads, placement)


def predict(model: Predictor, rows: list[dict[str, Any]], batch_size: int, name: str) -> np.ndarray:
    """Grade distributions of ``rows`` in batches, with a progress bar."""
    parts = []
    for i in progress_bar(range(0, len(rows), batch_size), desc=f"evaluate {name}", unit="batch"):
        batch = rows[i : i + batch_size]
        parts.append(model.predict_proba([r["query"] for r in batch], [r["ad_title"] for r in batch]))
    return np.concatenate(parts)


def differences(
    probs: dict[str, np.ndarray], gold_pairs: list[dict[str, Any]], config: EvaluateConfig
) -> dict[str, dict[str, dict[str, Any]]]:
    """``"<a> - <b>"`` -> metric -> the paired bootstrap interval, for each model a against every model
    listed after it."""
    options = config.bootstrap
    by_metric = {
        metric: bootstrap_differences(
            y_true=[r["gold_grade"] for r in gold_pairs],
            probs=probs,
            groups=[r["query"] for r in gold_pairs],
            metric=metric,
            relevant_from=config.relevant_from,
            samples=options.samples,
            confidence=options.confidence,
            seed=options.seed,
        )
        for metric in BOOTSTRAP_METRICS
    }
    pairs = next(iter(by_metric.values()))
    return {pair: {metric: intervals[pair] for metric, intervals in by_metric.items()} for pair in pairs}


def comparison_table(models: dict[str, dict[str, Any]], diffs: dict[str, dict[str, Any]], ndcg: str) -> str:
    """Markdown: every model on the same gold pairs, then every difference with its interval."""
    keys = table_columns(ndcg)
    lines = [
        "| model | " + " | ".join(keys) + " |",
        "|---|" + "---:|" * len(keys),
        *(f"| {title(name)} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |" for name, m in models.items()),
    ]
    if diffs:
        metrics = list(BOOTSTRAP_METRICS)
        lines += ["", "| difference | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]
        for pair, values in diffs.items():
            a, b = pair.split(" - ")
            lines.append(f"| {title(a)} - {title(b)} | " + " | ".join(interval(values[m]) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def distil_and_evaluate(distil: DistilConfig, config: EvaluateConfig) -> tuple[dict[str, Path], dict[str, Path]]:
    """Train a student with ``distil`` and score it (``<distil.out_dir>/eval``) on the gold split of its pairs,
    beside ``config``'s comparisons; returns both stages' output paths."""
    trained = distil_stage.run(distil)
    scored = run(
        replace(config, model=str(trained["model"]), pairs=distil.pairs, out_dir=str(Path(distil.out_dir) / "eval"))
    )
    return trained, scored


def run(config: EvaluateConfig) -> dict[str, Path]:
    threads, device = use_threads(config.threads), use_device(config)
    graded = read_gold_pairs(config.pairs)  # every model is scored on, and every baseline fitted on, gold pairs
    gold_pairs = [r for r in graded if r["split"] == config.split]
    if not gold_pairs:
        raise ContractError(f"{config.pairs} has no gold pairs in split {config.split!r}; choose another split")
    probs, seconds, baseline_models = _probabilities(config, graded, gold_pairs, threads.threads, device.placement())
    queries, gold = [r["query"] for r in gold_pairs], [r["gold_grade"] for r in gold_pairs]
    models = {
        name: relevance_metrics(p, gold, queries, config.relevant_from, config.ndcg_k) for name, p in probs.items()
    }
    diffs = differences(probs, gold_pairs, config)
    report = {
        "model": config.model,
        "backend": config.backend,
        "split": config.split,
        "pairs_per_s": round(len(gold_pairs) / seconds, 1),
        **models[STUDENT],
        "models": models,
        "differences": diffs,
        "strongest_baseline": {metric: strongest_baseline(models, metric) for metric in BOOTSTRAP_METRICS},
        "baselines_fitted_on": len(gold_train_rows(graded)),
        "baseline_models": {name: str(folder) for name, folder in baseline_models.items()},
    }
    table = comparison_table(models, diffs, f"ndcg@{config.ndcg_k}")
    paths = _write_outputs(config, report, table) | {"ranking": _ranking_plot(config, probs, gold, models)}
    fitted = "" if report["baselines_fitted_on"] else " (no gold train pairs: no baselines)"
    print_summary(
        f"students and baselines on {len(gold_pairs):,} gold {config.split} pairs{fitted}:\n{table.rstrip()}",
        paths,
        threads,
        device,
    )
    return paths


def _probabilities(
    config: EvaluateConfig, graded: list[dict], gold_pairs: list[dict], threads: int, placement: Placement
) -> tuple[dict[str, np.ndarray], float, dict[str, Path]]:
    """Grade probabilities on the gold pairs of the student, the students it is compared with and the
    baselines (fitted on the gold train pairs), by model name, every model on ``placement``; the seconds the
    student took; and the folder each fitted baseline is saved in (``out_dir/baselines/<name>``)."""
    started = time.perf_counter()
    student = load_student(config.model, config, threads, placement)
    probs = {STUDENT: predict(student, gold_pairs, config.batch_size, STUDENT)}
    seconds = time.perf_counter() - started
    for name, folder in config.compare_with.items():
        probs[name] = predict(load_student(folder, config, threads, placement), gold_pairs, config.batch_size, name)
    grades = probs[STUDENT].shape[1]
    folders = {}
    for name, baseline in fit_baselines(config.baselines, gold_train_rows(graded), grades, placement).items():
        probs[name] = predict(baseline, gold_pairs, config.batch_size, name)
        folders[name] = baseline.save(Path(config.out_dir) / "baselines" / name)
    return probs, seconds, folders


def _ranking_plot(config: EvaluateConfig, probs: dict[str, np.ndarray], gold: list[int], models: dict) -> Path:
    """``ranking_curves.png``: every model's ROC and precision-recall curves of "relevant" on the gold pairs."""
    curves = {
        title(name): relevance_curves(y_true=gold, probs=p, relevant_from=config.relevant_from)
        for name, p in probs.items()
    }
    aucs = {title(name): figures for name, figures in models.items()}
    return plot_ranking_curves(curves, aucs, Path(config.out_dir) / RANKING_PLOT)


def _write_outputs(config: EvaluateConfig, report: dict, table: str) -> dict[str, Path]:
    """metrics.json, comparison.md and the confusion, reliability and differences plots in ``out_dir``."""
    metrics, diffs, out = report, report["differences"], Path(config.out_dir)
    paths = {
        "metrics": write_json_atomic(out / "metrics.json", report),
        "comparison": write_atomic(out / "comparison.md", table),
        "confusion": plot_confusion(
            metrics["confusion_gold_by_predicted"], out / CONFUSION_PLOT, f"student on gold {config.split} pairs"
        ),
        "reliability": plot_reliability(
            metrics["reliability_bins"], metrics["ece"], out / RELIABILITY_PLOT, "student calibration"
        ),
    }
    if diffs:
        titled = {" - ".join(title(n) for n in pair.split(" - ")): values for pair, values in diffs.items()}
        paths["differences"] = plot_differences(titled, out / DIFFERENCES_PLOT, config.bootstrap.confidence)
    return paths
