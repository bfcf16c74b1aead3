"""One page per run: ``report.html``, what the register step decided and everything it decided on.

A team lead opens one file instead of five: the decision and its reason in the first lines (which model won
and was registered, its margin over the next best model on the champion metric with the paired bootstrap
interval, promoted or kept as challenger), every model on the gold test pairs and every difference with its
interval (agpo evaluate's ``metrics.json``), the evaluation's plots (ranking curves, differences, the student's
confusion and reliability), the data (pairs per split, gold grades, annotation's quarantine by reason), the
teacher (its gate figures, or why it was skipped, and whether it was registered), and links, relative to the
run folder, to the files behind each figure.

Self-contained so it opens anywhere, from the run folder, an MLflow download or an e-mail: the CSS is inline
and every image a ``data:`` URI; the page fetches nothing. The pipeline's register step writes it at the run
folder's root (``write_report_page``) and logs it (``publish_report``) to its stage run and to the pipeline's
parent run, whose ``report_page`` tag (``pipelines.tracking.REPORT_TAG``, what ``agpo compare`` lists) holds
its location; each LoggedModel of the step gets the same tag. The page is not a file of the LoggedModel: a
model's files are bound by the digest its registered version carries, and the decision comes after it.
``summarise_parent`` puts the figures runs are compared by on that parent run as metrics and tags.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from evaluation.comparison import (
    CONFUSION_PLOT,
    DIFFERENCES_PLOT,
    GOLD_ONLY,
    RANKING_PLOT,
    RELIABILITY_PLOT,
    STUDENT,
    difference,
    interval,
    interval_figures,
    table_columns,
    the,
    title,
)
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.teacher.gate import GateFailed, judge_teacher
from pipelines.io import write_atomic
from pipelines.steps import read_json
from pipelines.tracking import REPORT_TAG, StageRun, Tracker, filter_literal

REPORT_PAGE = "report.html"
HEADLINE_METRICS = ("accuracy", "macro_f1", "roc_auc_relevant", "ndcg@10", "ece")  # on the parent run, per model
PLOTS = (  # evaluate's plots, in the page's order, with their captions
    (RANKING_PLOT, "ROC and precision-recall curves of relevant: every model on the gold test pairs"),
    (DIFFERENCES_PLOT, "every paired difference with its bootstrap interval"),
    (CONFUSION_PLOT, "the student's confusion matrix: gold grade by predicted grade"),
    (RELIABILITY_PLOT, "the student's reliability: confidence against accuracy"),
)
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #1d1d1f; padding: 0 1em }
h1 { font-size: 1.5em; margin-bottom: .2em } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd }
.decision { font-size: 1.15em; background: #eef6ee; border-left: 5px solid #2e7d32; padding: .5em .8em }
.decision.none { background: #fdf1e6; border-color: #e65100 } .reason { color: #444 }
table { border-collapse: collapse; margin: .6em 0 } td, th { border: 1px solid #ccc; padding: .25em .6em }
td.n { text-align: right; font-variant-numeric: tabular-nums } tr.chosen { font-weight: 600; background: #f3f8f3 }
figure { display: inline-block; margin: .5em 1em .5em 0; max-width: 100% } img { max-width: 100% }
figcaption { color: #555; font-size: .9em }
"""


@dataclass(frozen=True)
class RunFiles:
    """Where a run's page reads its facts (the pipeline's ``pipeline_config.report_files`` fills it in)."""

    root: Path  # the run folder: the page is written here and its links are relative to it
    eval_dir: Path  # agpo evaluate's metrics.json and plots
    pairs: str  # the run's pairs file: the data summary
    annotation: Path  # annotation's folder: its row accounting and quarantine
    teacher_summary: Path  # the RL teacher's summary.json: the gate figures
    gates: tuple  # the gate's thresholds as pipelines.ads.teacher.gate.judge_teacher takes them
    confidence: float  # of the bootstrap intervals
    links: Mapping[str, Path] = field(default_factory=dict)  # title -> a file of the run, linked when it exists


@dataclass(frozen=True)
class PageContent:
    """Everything on the page, as plain data (``render`` draws it)."""

    run: str
    decision: Mapping[str, Any]  # registration.json
    report: Mapping[str, Any]  # agpo evaluate's metrics.json
    confidence: float
    plots: Sequence[tuple[str, bytes]] = ()  # (caption, PNG bytes)
    data: Mapping[str, Any] = field(default_factory=dict)  # data_summary
    teacher: Mapping[str, Any] = field(default_factory=dict)  # teacher_summary
    links: Mapping[str, str] = field(default_factory=dict)  # title -> path relative to the page


def verdict(decision: Mapping[str, Any]) -> str:
    """What was registered, in words: "the lexical matcher registered as version 3, promoted to champion"."""
    if decision.get("version") is None:
        return "nothing registered"
    status = "promoted to champion" if decision["promoted"] else "kept as challenger"
    return f"{the(decision['candidate'])} registered as version {decision['version']}, {status}"


def champion_line(decision: Mapping[str, Any]) -> str:
    """One line on what the register step did: which model, which version, promoted or not, and why."""
    if not decision:
        return "registration not recorded (its MLflow run had finished before)"
    skipped = decision.get("teacher_skipped")
    prefix = f"teacher skipped at {skipped['step']} ({skipped['reason'].splitlines()[0]}); " if skipped else ""
    if decision["version"] is None:
        return f"{prefix}nothing registered: {decision['reason']}"
    return f"{prefix}{verdict(decision)} ({decision['reason']})"


def margin(report: Mapping[str, Any], candidate: str | None, metric: str, confidence: float) -> str:
    """By how much the candidate won: its ``metric`` and its paired difference (with the interval) from the
    strongest other model on the metric (negative when a simpler candidate kept its place: the champion rule)."""
    models, diffs = report.get("models") or {}, report.get("differences") or {}
    if candidate not in models:
        return "no model was chosen: see the reason below"
    others = sorted((n for n in models if n != candidate), key=lambda n: models[n][metric], reverse=True)
    said = f"{title(candidate)}: {metric} {models[candidate][metric]:.4f}"
    if not others:
        return f"{said}, the only model scored"
    runner = others[0]
    said += f"; against {the(runner)}, the strongest other model on it: "
    if difference(candidate, runner) in diffs:
        diff = diffs[difference(candidate, runner)][metric]
    elif difference(runner, candidate) in diffs:  # the report holds runner - candidate: the interval turned round
        flipped = diffs[difference(runner, candidate)][metric]
        diff = {"difference": -flipped["difference"], "low": -flipped["high"], "high": -flipped["low"]}
    else:
        return f"{said}{models[runner][metric]:.4f} (no interval in the report)"
    pairs = f"{models[candidate].get('pairs', '?')} gold {report.get('split', 'test')} pairs"
    return f"{said}{interval(diff)} ({confidence:.0%} paired bootstrap interval on {pairs})"


def data_summary(pairs: str, annotation: Path) -> dict[str, Any]:
    """Pairs and gold grades per split of the run's pairs file; annotation's row accounting (its summary.json:
    rows in, labels, quarantined, review queue) and its quarantine by reason, or None when it labelled nothing."""
    counted = read_pairs(pairs).group_by("split").aggregate([("pair_id", "count"), ("gold_grade", "count")])
    splits = {
        row["split"]: {"pairs": row["pair_id_count"], "gold": row["gold_grade_count"]} for row in counted.to_pylist()
    }
    if not (annotation / "summary.json").is_file():
        return {"splits": splits, "annotation": None}
    counts = read_json(annotation / "summary.json")
    reasons = Counter(
        reason
        for part in sorted((annotation / "quarantine").glob("*.parquet"))
        for reason in pq.read_table(part, columns=["reason"]).column("reason").to_pylist()
    )
    keys = ("rows_in", "labels", "quarantined", "skipped_other_splits", "review_queue")
    return {"splits": splits, "annotation": {k: counts[k] for k in keys if k in counts}, "quarantine": reasons}


def teacher_summary(decision: Mapping[str, Any], summary: Path, gates: tuple) -> dict[str, Any]:
    """Whether the teacher labelled this run's pairs: why it was skipped, or the gate's figures (judged again from
    the RL summary by the gate's own rule); and what its registration did."""
    registration = decision.get("teacher_registration") or {}
    registered = (
        f"registered as {registration['model']} version {registration['version']}"
        if registration.get("version") is not None
        else f"not registered: {registration.get('reason', 'no record')}"
    )
    skipped = decision.get("teacher_skipped")
    if skipped:
        return {
            "status": f"skipped at the {skipped['step']} step",
            "reason": skipped["reason"],
            "registered": registered,
        }
    if not summary.is_file():
        return {"status": "no RL teacher summary in this run", "registered": registered}
    try:
        figures, failure = judge_teacher(read_json(summary), summary, *gates)
    except GateFailed as unjudged:  # a summary the gate cannot read: say why rather than fail the register step
        figures, failure = {}, str(unjudged)
    status = "passed its gates" if failure is None else "below a gate now"
    return {"status": status, "reason": failure or "", "figures": figures, "registered": registered}


def render(content: PageContent) -> str:
    """The page's HTML: the decision first, then the comparison, the plots, the data, the teacher, the files."""
    decision, report = content.decision, content.report
    won = margin(report, decision.get("candidate"), decision.get("metric", "roc_auc_relevant"), content.confidence)
    none = "" if decision.get("version") is not None else " none"
    head = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>run {escape(content.run)}: {escape(verdict(decision))}</title><style>{STYLE}</style></head>",
        f"<body><h1>Run {escape(content.run)}: {escape(verdict(decision))}</h1>",
        f'<p class="decision{none}" id="decision">{escape(won)}</p>',
        f'<p class="reason"><b>Why:</b> {escape(decision.get("reason", "no reason recorded"))}</p>',
    ]
    return "\n".join(
        head
        + _comparison(report, decision.get("candidate"), content.confidence)
        + _plots(content.plots)
        + _data(content.data)
        + _teacher(content.teacher)
        + _links(content.links)
        + ["</body></html>", ""]
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], chosen: int | None = None) -> list[str]:
    """An HTML table; numbers right-aligned to 4 places, row ``chosen`` in bold."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f'<td class="n">{value:.4f}</td>'
        return f'<td class="n">{value:,}</td>' if isinstance(value, int) else f"<td>{escape(str(value))}</td>"

    lines = ["<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>"]
    for i, row in enumerate(rows):
        lines.append(("<tr class='chosen'>" if i == chosen else "<tr>") + "".join(cell(v) for v in row) + "</tr>")
    return [*lines, "</table>"]


def _comparison(report: Mapping[str, Any], candidate: str | None, confidence: float) -> list[str]:
    models, diffs = report.get("models") or {}, report.get("differences") or {}
    if not models:
        return ["<h2>Models</h2><p>no evaluation report</p>"]
    first = next(iter(models.values()))
    keys = table_columns(next((k for k in first if k.startswith("ndcg@")), "ndcg@10"))
    names = list(models)
    lines = [f"<h2 id='comparison'>Every model on {first.get('pairs', '?')} gold {report.get('split', '')} pairs</h2>"]
    chosen = names.index(candidate) if candidate in names else None
    lines += _table(["model", *keys], [[title(n), *(models[n].get(k, "n/a") for k in keys)] for n in names], chosen)
    if diffs:
        metrics = list(next(iter(diffs.values())))
        lines.append(f"<h3>Differences, with {confidence:.0%} paired bootstrap intervals (by query)</h3>")
        rows = [
            [" - ".join(title(n) for n in pair.split(" - ")), *(interval(v[m]) for m in metrics)]
            for pair, v in diffs.items()
        ]
        lines += _table(["difference", *metrics], rows)
    return lines


def _plots(plots: Sequence[tuple[str, bytes]]) -> list[str]:
    lines = ["<h2 id='plots'>Plots</h2>"]
    for caption, png in plots:
        data = base64.b64encode(png).decode("ascii")
        lines.append(
            f'<figure><img alt="{escape(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{escape(caption)}</figcaption></figure>"
        )
    return lines if plots else [*lines, "<p>no plots in the evaluation folder</p>"]


def _data(data: Mapping[str, Any]) -> list[str]:
    splits = data.get("splits") or {}
    lines = ["<h2 id='data'>Data</h2>"]
    lines += _table(["split", "pairs", "gold grades"], [[s, c["pairs"], c["gold"]] for s, c in splits.items()])
    annotation = data.get("annotation")
    if annotation is None:
        return [*lines, "<p>annotation: none in this run</p>"]
    lines += _table(["annotation", "rows"], [[key.replace("_", " "), n] for key, n in annotation.items()])
    reasons = data.get("quarantine") or {}
    rows = [[reason, n] for reason, n in reasons.items()]
    return lines + (_table(["quarantine reason", "rows"], rows) if rows else ["<p>nothing quarantined</p>"])


def _teacher(teacher: Mapping[str, Any]) -> list[str]:
    lines = ["<h2 id='teacher'>Teacher</h2>", f"<p><b>{escape(teacher.get('status', 'unknown'))}</b></p>"]
    if teacher.get("reason"):
        lines.append(f"<p>{escape(teacher['reason'])}</p>")
    figures = teacher.get("figures") or {}
    if figures:
        lines += _table(["gate figure", "value"], [[k, float(v)] for k, v in figures.items()])
    return [*lines, f"<p>{escape(teacher.get('registered', ''))}</p>"]


def _links(links: Mapping[str, str]) -> list[str]:
    items = [f'<li><a href="{escape(path)}">{escape(name)}</a> ({escape(path)})</li>' for name, path in links.items()]
    return ["<h2 id='files'>The run's files</h2>", "<p>relative to the run folder</p>", "<ul>", *items, "</ul>"]


def write_report_page(files: RunFiles, report: Mapping[str, Any], decision: Mapping[str, Any]) -> Path:
    """``<run folder>/report.html`` from the run's files, agpo evaluate's ``report`` and the registration
    ``decision``."""
    plots = [
        (caption, (files.eval_dir / name).read_bytes()) for name, caption in PLOTS if (files.eval_dir / name).is_file()
    ]
    links = {name: path.relative_to(files.root).as_posix() for name, path in files.links.items() if path.is_file()}
    content = PageContent(
        run=files.root.name,
        decision=decision,
        report=report,
        confidence=files.confidence,
        plots=plots,
        data=data_summary(files.pairs, files.annotation),
        teacher=teacher_summary(decision, files.teacher_summary, files.gates),
        links=links,
    )
    return write_atomic(files.root / REPORT_PAGE, render(content))


def publish_report(
    files: RunFiles, report: Mapping[str, Any], decision: Mapping[str, Any], tracker: Tracker, log: StageRun | None
) -> Path:
    """Write the page (``write_report_page``); with the register step's stage run (``log``; None when an earlier
    try finished it and logged the page), log it there and on the pipeline's parent run, and tag the parent run and
    every LoggedModel of the step with its location (``REPORT_TAG``)."""
    page = write_report_page(files, report, decision)
    if log is None:
        return page
    parent = StageRun(tracker.client, tracker.parent_id)
    for run in (log, parent):
        run.log_artifact(page)
    location = {REPORT_TAG: f"{tracker.client.get_run(tracker.parent_id).info.artifact_uri}/{REPORT_PAGE}"}
    parent.set_tags(location)
    experiments = [tracker.experiment_id] + ([tracker.registry_experiment_id()] if decision.get("version") else [])
    query = f"source_run_id = {filter_literal(log.run_id)}"
    for model in tracker.client.search_logged_models(experiments, filter_string=query):
        tracker.client.set_logged_model_tags(model.model_id, location)
    return page


def summarise_parent(files: RunFiles, report: Mapping[str, Any], decision: Mapping[str, Any], tracker: Tracker) -> None:
    """The figures people compare runs by, on the pipeline's parent run (what ``agpo compare`` and the MLflow UI
    show): every model's headline metrics in agpo evaluate's ``report``, the teacher's, the interval of what its
    labels added, the labels' agreement with gold, and tags for the teacher's use and the registration
    ``decision``."""
    figures = {f"student_{k}": report[k] for k in HEADLINE_METRICS}
    if files.teacher_summary.is_file():  # absent when the teacher failed the prior gate
        teacher = read_json(files.teacher_summary)
        figures["teacher_audit_accuracy"] = teacher["audit_accuracy_end"]
        figures["teacher_generated_tokens"] = teacher["generated_tokens"]
        figures["teacher_train_seconds"] = teacher["seconds"]
    for name, metrics in report["models"].items():
        if name != STUDENT:
            figures.update({f"{name}_{k}": metrics[k] for k in HEADLINE_METRICS})
    for metric, diff in report["differences"].get(difference(STUDENT, GOLD_ONLY), {}).items():
        figures.update(interval_figures(f"teacher_added_{metric}", diff))
    quality = files.annotation / "quality_report.json"
    agreement = read_json(quality).get("gold_agreement") if quality.is_file() else None
    if agreement:
        figures["label_gold_accuracy"] = agreement["accuracy"]
    parent = StageRun(tracker.client, tracker.parent_id)
    parent.log_metrics(figures)
    skipped = decision.get("teacher_skipped")
    tags = {"teacher": "skipped" if skipped else "used", "champion_candidate": decision["candidate"] or "none"}
    tags["promoted"] = str(decision["promoted"])
    if skipped:
        tags["teacher_skipped_reason"] = skipped["reason"][:5000]
    parent.set_tags(tags)
