"""The student registry: each distilled student becomes a version of ``tracking.registered_model`` (logged
as a servable pyfunc model with its card, pipelines.student_model), and the ``champion`` alias moves to it
only when it beats the champion and, with ``tracking.require_beat_lexical``, the lexical baseline on the
gold test metric (``promotion_decision``). Retry-safe: a version already created for a run is reused, and a
version already promoted stays the champion."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipelines.tracking import CHAMPION, Tracker, _mlflow, global_tracking_uri, metric_name, tracking_uri


def register_student(
    tracker: Tracker,
    model_dir: Path,
    metrics: Mapping[str, float],
    run_id: str,
    lexical_baseline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """With ``tracker``'s registry: log ``model_dir`` as the pyfunc model ``student_model`` of ``run_id``
    (pipelines.student_model) and register it as a new version, its model card as description; move the
    champion alias to it when it beats the champion on ``champion_metric`` and, with
    ``require_beat_lexical``, the ``lexical_baseline`` metrics (agpo evaluate's) on the same metric."""
    from pipelines import student_model  # imports mlflow.pyfunc: only when registering

    name, metric = tracker.config.registered_model, tracker.config.champion_metric
    baseline = None if lexical_baseline is None or metric not in lexical_baseline else lexical_baseline[metric]
    existing = tracker.client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    if existing:  # a retry after the version was created: do not register twice
        version = existing[0]
    else:
        if not tracker.client.search_registered_models(f"name = '{name}'"):
            tracker.client.create_registered_model(name, description="Distilled ads-relevance student")
        card = student_model.model_card(Path(model_dir), metrics, lexical_baseline)
        with global_tracking_uri(tracking_uri(tracker.config)):  # save_model's checks use the global store
            source = student_model.log_student_model(tracker.client, run_id, Path(model_dir), card)
        tags = {f"test_{metric_name(k)}": str(v) for k, v in metrics.items()}
        if baseline is not None:
            tags[f"test_lexical_{metric_name(metric)}"] = str(baseline)
        version = tracker.client.create_model_version(
            name, source, run_id=run_id, tags=tags, description=card[: student_model.MAX_DESCRIPTION]
        )
    challenger = float(metrics[metric])
    try:
        champion = tracker.client.get_model_version_by_alias(name, CHAMPION)
    except _mlflow().exceptions.MlflowException:
        champion = None
    champion_score = None if champion is None else float(champion.tags.get(f"test_{metric_name(metric)}", "-inf"))
    decision = promotion_decision(
        metric,
        challenger,
        None if champion is None else (champion.version, champion_score),
        None if baseline is None else float(baseline),
        tracker.config.require_beat_lexical,
    )
    already = champion is not None and champion.version == version.version  # a retry after promotion
    if already:
        decision.update(promoted=True, reason=f"promoted: already the champion (version {version.version})")
    elif decision["promoted"]:
        tracker.client.set_registered_model_alias(name, CHAMPION, version.version)
    tracker.client.set_model_version_tag(
        name, version.version, "promotion", "champion" if decision["promoted"] else "challenger"
    )
    tracker.client.set_model_version_tag(name, version.version, "promotion_reason", decision["reason"])
    return {
        "model": name,
        "version": int(version.version),
        "promoted": decision["promoted"],
        "metric": metric,
        "challenger": challenger,
        "champion_before": champion_score,
        "lexical_baseline": decision["lexical_baseline"],
        "beats_lexical": decision["beats_lexical"],
        "require_beat_lexical": tracker.config.require_beat_lexical,
        "reason": decision["reason"],
    }


def promotion_decision(
    metric: str,
    challenger: float,
    champion: tuple[str, float] | None,
    lexical: float | None,
    require_beat_lexical: bool,
) -> dict[str, Any]:
    """Whether a new student becomes champion, and why: it must beat the champion's ``metric`` (if there is
    one) and, when ``require_beat_lexical``, the lexical baseline's (a missing baseline fails that check)."""
    beats_lexical = None if lexical is None else challenger > lexical
    failures = []
    if require_beat_lexical and lexical is None:
        failures.append(
            "no lexical baseline to compare with (evaluate.lexical_baseline.enabled is false?) and "
            "tracking.require_beat_lexical is on"
        )
    elif require_beat_lexical and not beats_lexical:
        failures.append(
            f"{metric} {challenger:.4f} does not beat the lexical baseline's {lexical:.4f} "
            "(tracking.require_beat_lexical)"
        )
    if champion is not None and not challenger > champion[1]:
        failures.append(f"{metric} {challenger:.4f} does not beat champion version {champion[0]}'s {champion[1]:.4f}")
    if failures:
        reason = "kept as challenger: " + "; ".join(failures)
    else:
        against = "first version" if champion is None else f"beats champion version {champion[0]}'s {champion[1]:.4f}"
        reason = f"promoted: {metric} {challenger:.4f}, {against}"
        if beats_lexical is not None:
            relation = "beats" if beats_lexical else "does not beat (tracking.require_beat_lexical is off)"
            reason += f"; {relation} the lexical baseline's {lexical:.4f}"
    return {"promoted": not failures, "beats_lexical": beats_lexical, "lexical_baseline": lexical, "reason": reason}
