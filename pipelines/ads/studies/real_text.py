"""Stage ``agpo study real-text``: on a team's own real query-product text, which model should it ship?

For each query sample s in ``samples`` (a seed) and each gold size N in ``sizes``:

    export   = whole queries of ``source`` (casefolded search terms, shuffled with s): the first queries that
               hold >= ``test_pairs`` pairs are the test split, the next >= ``audit_pairs`` the audit split, the
               next the train split until it holds >= N pairs (a larger N extends a smaller one's train
               queries; test and audit are the same for every N of a sample); a CSV of the source's own
               columns plus ``split``
    import   = ``agpo data import`` of that CSV with the README's Home Depot recipe (latin-1, grade_bins
               [1.5, 2.0, 2.5]) and ``split_map`` honouring its split column
    students = one gold-only student per kind in ``kinds`` (as trained: no zero-shot floor) and the
               pipeline's default (``auto``, with the floor), the one the pipeline ships
    scored   = agpo evaluate of the default student beside the other kinds and the baselines (zero-shot
               encoder, lexical matcher) on the test pairs, with paired query-level bootstrap intervals
    shipped  = the champion rule (evaluation.comparison) among the lexical matcher, the zero-shot
               encoder and the default student: what a pipeline run whose teacher was skipped registers
               (judged again from the saved evaluation on every run, so a finished export follows the rule as
               it is now)

Outputs in ``out_dir``: one folder per export (``s<sample>-n<N>/``: the CSV, the imported pairs, the students
and the evaluation), ``results.json`` (every export: each model's test figures, the default student's
intervals against both baselines, what shipped), ``real_text.md`` (mean ± sd over the samples per size and
model, and the default student against the goals) and ``real_text.png`` (test ROC-AUC and macro-F1 against N,
one line per model, the baselines' included). A finished export is read back from its ``result.json``; an
unfinished one resumes (every student checkpoints).
"""

from __future__ import annotations

import csv
import random
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.baselines_config import LEXICAL, ZERO_SHOT
from evaluation.comparison import STUDENT, champion_candidate
from pipelines.ads.distillation import distil as distil_stage
from pipelines.ads.distillation import evaluate as evaluate_stage
from pipelines.ads.intake import data_import
from pipelines.ads.intake.data_import import DataImportConfig
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.studies.real_text_config import RealTextConfig
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_mean_sd_panels
from pipelines.steps import read_json
from student.kinds import AUTO, resolved_kind

COLUMNS = {"pair_id": "id", "query": "search_term", "ad_title": "product_title", "gold_grade": "relevance"}
GRADE_BINS = (1.5, 2.0, 2.5)  # the README's Home Depot recipe: rater mean -> 0..3
ENCODING = "latin-1"
METRICS = {"roc_auc_relevant": "test ROC-AUC (relevant)", "macro_f1": "test macro-F1", "ndcg@10": "test NDCG@10"}
GOAL = 0.03  # the default student against the zero-shot encoder (ROC-AUC) and the lexical matcher (macro-F1)


def read_source(path: str | Path) -> tuple[list[str], dict[str, list[dict[str, str]]]]:
    """The source CSV's columns and its rows by casefolded search term (a query is carved whole)."""
    with open(path, encoding=ENCODING, newline="") as handle:
        reader = csv.DictReader(handle)
        by_query: dict[str, list[dict[str, str]]] = defaultdict(list)
        for row in reader:
            by_query[row["search_term"].casefold()].append(row)
        return list(reader.fieldnames or []), dict(by_query)


def carve(
    by_query: dict[str, list[dict[str, str]]], sample: int, sizes: tuple[int, ...], test_pairs: int, audit_pairs: int
) -> dict[int, list[dict[str, str]]]:
    """Size N -> the rows of its export, each with its ``split`` (module docstring: nested train queries, the
    same test and audit queries for every N of the sample)."""
    queries = sorted(by_query)
    random.Random(sample).shuffle(queries)
    taken = iter(queries)

    def take(split: str, pairs: int) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        while len(rows) < pairs:
            query = next(taken, None)
            if query is None:
                raise ValueError(f"the source has too few queries for {split} split of {pairs} pairs")
            rows += [{**row, "split": split} for row in by_query[query]]
        return rows

    held = take("test", test_pairs) + take("audit", audit_pairs)
    train: list[dict[str, str]] = []
    exports = {}
    for size in sorted(sizes):
        train += take("train", size - len(train)) if size > len(train) else []
        exports[size] = held + train
    return exports


def import_export(rows: list[dict[str, str]], columns: list[str], folder: Path) -> Path:
    """Write ``rows`` as the export CSV (the source's encoding and columns, plus split) and import it with the
    README's Home Depot recipe; returns the pairs file."""
    folder.mkdir(parents=True, exist_ok=True)
    export = folder / "export.csv"
    with open(export, "w", encoding=ENCODING, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*columns, "split"])
        writer.writeheader()
        writer.writerows(rows)
    config = DataImportConfig(
        input=InputConfig(
            path=str(export), encoding=ENCODING, columns={**COLUMNS, "split": "split"}, grade_bins=GRADE_BINS
        ),
        split_map={split: split for split in ("train", "audit", "test")},
        fractions={"train": 1.0},
        out_dir=str(folder / "data"),
    )
    return data_import.run(config)["pairs"]


def study_export(config: RealTextConfig, pairs: Path, folder: Path) -> dict[str, Any]:
    """Every student kind and the default student on ``pairs``' gold train pairs, scored beside the baselines
    on its test pairs; the figures, the default student's intervals and what the champion rule ships."""
    started = time.perf_counter()
    recipe = replace(config.distil, pairs=str(pairs), label_source="train-gold", review_gold=None)
    default = resolved_kind(AUTO, recipe.student.backbone)
    folders = {}
    for kind in dict.fromkeys((default, *config.kinds)):
        shipped_recipe = kind == default  # the pipeline's own student: auto's kind, floor on
        student = replace(recipe.student, kind=kind)
        trained = distil_stage.run(
            replace(
                recipe,
                student=student,
                zero_shot_floor=shipped_recipe and recipe.zero_shot_floor,
                out_dir=str(folder / kind),
            )
        )
        folders[kind] = trained["model"]
    others = {kind: str(path) for kind, path in folders.items() if kind != default}
    scored = evaluate_stage.run(
        replace(
            config.evaluate,
            model=str(folders[default]),
            pairs=str(pairs),
            compare_with=others,
            out_dir=str(folder / "eval"),
        )
    )
    report = read_json(scored["metrics"])
    distilled = read_json(folder / default / "distil.json")
    models = {
        (f"{default} (default)" if name == STUDENT else name): {k: figures[k] for k in METRICS}
        for name, figures in report["models"].items()
    }
    diffs = report["differences"]
    return {
        "default_kind": default,
        "default_shipped": distilled["shipped"],
        "default_best_epoch": distilled["best_epoch"],
        "train_pairs": report["baselines_fitted_on"],
        "test_pairs": report["pairs"],
        "models": models,
        "default_vs_zero_shot": diffs[f"{STUDENT} - {ZERO_SHOT}"],
        "default_vs_lexical": diffs[f"{STUDENT} - {LEXICAL}"],
        "seconds": round(time.perf_counter() - started, 1),
    }


def shipped(report: dict[str, Any], metric: str = "roc_auc_relevant") -> dict[str, Any]:
    """What the champion rule picks from an export's evaluation (read again on every run, so a finished
    export is judged by the rule as it is now), with the reason and the pick's test figures."""
    choice = champion_candidate(report, metric)
    figures = report["models"][choice["candidate"]]
    return {
        "shipped": choice["candidate"],
        "shipped_reason": choice["reason"],
        "shipped_test": {k: figures[k] for k in METRICS},
    }


def aggregate(results: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, tuple[float, float]]]]:
    """Model -> size -> metric -> (mean, sample sd) over the samples; the shipped model as ``shipped``."""
    values: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for result in results:
        rows = {**result["models"], "shipped": result["shipped_test"]}
        for model, figures in rows.items():
            for key in METRICS:
                values[model][result["size"]][key].append(figures[key])
    return {
        model: {
            size: {k: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0) for k, v in metrics.items()}
            for size, metrics in sorted(by_size.items())
        }
        for model, by_size in values.items()
    }


def goal_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per size: the default student against the zero-shot encoder (ROC-AUC) and the lexical matcher
    (macro-F1), mean difference and how many samples' intervals lie wholly above 0; what shipped."""
    lines = []
    for size in sorted({r["size"] for r in results}):
        at = [r for r in results if r["size"] == size]
        for key, metric, against in (
            ("default_vs_zero_shot", "roc_auc_relevant", "zero-shot encoder"),
            ("default_vs_lexical", "macro_f1", "lexical matcher"),
        ):
            diffs = [r[key][metric] for r in at]
            mean = float(np.mean([d["difference"] for d in diffs]))
            beyond = sum(d["low"] > 0 for d in diffs)
            verdict = "met" if mean >= GOAL and beyond == len(diffs) else "missed"
            lines.append(
                f"- N={size}: default student - {against} on {metric}: {mean:+.3f} (mean of {len(diffs)}; interval "
                f"above 0 in {beyond} of {len(diffs)}); goal >= +{GOAL:.2f} beyond its interval: {verdict}"
            )
        shipped = ", ".join(f"s{r['sample']}: {r['shipped']}" for r in at)
        lines.append(f"- N={size}: the champion rule (ROC-AUC) ships {shipped}")
    return lines


def markdown(table: dict[str, dict[int, dict[str, tuple[float, float]]]], results: list[dict[str, Any]]) -> str:
    samples = len({r["sample"] for r in results})
    header = ["model", "gold train pairs", *METRICS.values()]
    lines = ["| " + " | ".join(header) + " |", "|---|---:|" + "---:|" * len(METRICS)]
    for model, by_size in table.items():
        for size, figures in by_size.items():
            cells = [f"{figures[k][0]:.3f} ± {figures[k][1]:.3f}" for k in METRICS]
            lines.append(f"| {model} | {size:,} | " + " | ".join(cells) + " |")
    note = f"Mean ± sd over {samples} query samples; every model of a sample on the same test pairs.\n\n"
    return note + "\n".join(lines) + "\n\n" + "\n".join(goal_lines(results)) + "\n"


def run(config: RealTextConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    columns, by_query = read_source(config.source)
    results = []
    for sample in config.samples:
        exports = carve(by_query, sample, config.sizes, config.test_pairs, config.audit_pairs)
        for size, rows in exports.items():
            folder = out / f"s{sample}-n{size}"
            done = folder / "result.json"
            if not done.is_file():
                pairs = import_export(rows, columns, folder)
                result = {"sample": sample, "size": size, **study_export(config, pairs, folder)}
                write_json_atomic(done, result)
            results.append({**read_json(done), **shipped(read_json(folder / "eval" / "metrics.json"))})
    table = aggregate(results)
    panels = {
        label: {
            model: (list(by), [by[n][key][0] for n in by], [by[n][key][1] for n in by]) for model, by in table.items()
        }
        for key, label in METRICS.items()
        if key != "ndcg@10"
    }
    text = markdown(table, results)
    paths = {
        "results": write_json_atomic(out / "results.json", {"source": config.source, "exports": results}),
        "table": write_atomic(out / "real_text.md", text),
        "plot": plot_mean_sd_panels(
            panels, out / "real_text.png", "real text: models against gold size", "gold train pairs"
        ),
    }
    print(text, end="")
    print_summary(f"real-text study: {len(results)} exports of {config.source}", paths)
    return paths
