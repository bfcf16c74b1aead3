"""The champion and a challenger scored on the same rows: the challenger's gold test pairs.

A champion's recorded figures come from the test pairs of the run that registered it. When a challenger was
measured on other pairs (another team's data, a new test split), those figures say nothing about which model is
better on the challenger's pairs. Both are servable model folders, so the register step scores both here on the
challenger's gold test pairs (``same_rows``), as agpo evaluate scores its models (pipelines.ads.distillation.evaluate:
the same loading, the same metrics and the same paired query-level bootstrap of the difference), and decides on
those rows (pipelines.ads.serving.registry). The rows are checked against the digest the challenger's
evaluation recorded (pipelines.ads.distillation.evidence), so they are the rows its figures came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.comparison import difference, interval
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.ads.distillation.evidence import gold_pairs_digest
from pipelines.ads.intake.contracts import read_gold_pairs
from pipelines.devices import use_device
from pipelines.errors import StageFailed
from pipelines.threads import use_threads
from pipelines.tracking import TrackingConfig, global_tracking_uri, tracking_uri

CHALLENGER, CHAMPION = "challenger", "champion"


class ChampionCannotScore(StageFailed):
    """The champion's folder does not load or does not score (a kind this code no longer knows, a broken graph)."""


def same_rows(challenger: Path, champion: Path, config: EvaluateConfig, test_pairs: str, metric: str) -> dict[str, Any]:
    """Both model folders scored on the gold pairs of ``config.split`` in ``config.pairs`` (which must digest to
    ``test_pairs``) with ``config``'s backend, device and bootstrap: {pairs, test_pairs_sha256, metric, challenger,
    champion (their ``metric`` on those rows), difference (challenger - champion: {difference, low, high,
    samples_used}, the paired bootstrap interval)}. ``ChampionCannotScore`` when the champion does not load or
    score; anything else (the challenger failing, changed pairs) fails the step."""
    from pipelines.ads.distillation import evaluate  # imports torch: only when a champion is scored again

    rows = [row for row in read_gold_pairs(config.pairs) if row["split"] == config.split]
    found = gold_pairs_digest(rows)
    if found != test_pairs:
        raise StageFailed(
            f"the gold {config.split} pairs in {config.pairs} (digest {found[:12]}) are not the ones the challenger "
            f"was scored on ({test_pairs[:12]}): the file changed after evaluate. Rerun the evaluate step, then "
            "register"
        )
    threads, device = use_threads(config.threads), use_device(config)

    def scored(name: str, folder: Path) -> np.ndarray:
        model = evaluate.load_student(folder, config, threads.threads, device.placement())
        return evaluate.predict(model, rows, config.batch_size, name)

    probs = {CHALLENGER: scored(CHALLENGER, challenger)}
    try:
        probs[CHAMPION] = scored(CHAMPION, champion)
    except (ValueError, KeyError, OSError, ImportError, RuntimeError) as error:
        first = str(error).splitlines()[0] if str(error) else ""
        raise ChampionCannotScore(f"{type(error).__name__}: {first}") from error
    gold, queries = [row["gold_grade"] for row in rows], [row["query"] for row in rows]
    figures = {
        name: evaluate.relevance_metrics(p, gold, queries, config.relevant_from, config.ndcg_k)[metric]
        for name, p in probs.items()
    }
    paired = evaluate.differences(probs, rows, config)[difference(CHALLENGER, CHAMPION)][metric]
    return {
        "pairs": len(rows),
        "test_pairs_sha256": test_pairs,
        "metric": metric,
        CHALLENGER: float(figures[CHALLENGER]),
        CHAMPION: float(figures[CHAMPION]),
        "difference": paired,
    }


def champion_on_same_rows(
    config: TrackingConfig,
    champion: tuple[str, str | None, float | None],
    test_pairs: str,
    scored_on: EvaluateConfig,
    challenger: Path,
    tmp: Path,
) -> dict[str, Any]:
    """``champion`` (version, the digest of its test pairs, its recorded figure) of ``config.registered_model``,
    downloaded verified into ``tmp`` and scored beside the ``challenger`` folder on the challenger's gold test pairs
    (``same_rows``, by ``scored_on``): {champion_version, champion_test_pairs_sha256, champion_recorded, and
    ``same_rows``' figures}; or, when that cannot be done, the first three and ``not_scored``: why (the champion
    has no files digest, changed files or no student; it does not load or score). A registry or
    download failure is not a reason: it fails the step, to be retried."""
    from pipelines.ads.serving.student_model import ModelFilesChanged, load_registered_student

    version, theirs, recorded = champion
    record = {"champion_version": int(version), "champion_test_pairs_sha256": theirs, "champion_recorded": recorded}
    uri, where = f"models:/{config.registered_model}/{version}", tmp / f"champion-{version}"
    try:
        with global_tracking_uri(tracking_uri(config)):
            folder = load_registered_student(uri, tracking_uri(config), where)
    except (ModelFilesChanged, ValueError) as error:  # no digest, changed files, not a student model
        return {**record, "not_scored": f"it cannot be loaded verified: {str(error).splitlines()[0]}"}
    try:
        return {**record, **same_rows(challenger, folder, scored_on, test_pairs, config.champion_metric)}
    except ChampionCannotScore as error:
        return {**record, "not_scored": f"it cannot score these pairs: {error}"}


def on_same_rows(comparison: Mapping[str, Any]) -> str:
    """The reason's words for a champion scored again on the candidate's test pairs."""
    theirs = comparison["champion_test_pairs_sha256"]
    return (
        f"champion version {comparison['champion_version']} was measured on "
        + ("unrecorded test pairs" if theirs is None else f"other test pairs ({theirs[:12]})")
        + f", so both were scored on this evaluation's {comparison['pairs']} gold test pairs "
        f"({comparison['test_pairs_sha256'][:12]}): {comparison['metric']} {comparison['challenger']:.4f} against "
        f"the champion's {comparison['champion']:.4f} (recorded on its own pairs: "
        f"{comparison['champion_recorded']:.4f}), difference {interval(comparison['difference'])}"
    )
