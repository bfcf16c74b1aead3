"""The student registry: which model of a pipeline run may become ``champion``, and registering it.

The rule that picks the candidate is the comparison vocabulary's (pipelines.ads.student.comparison,
``champion_candidate``), applied to ``tracking.champion_metric`` of the evaluation (agpo evaluate's
``metrics.json``: every model on the same gold test pairs, paired bootstrap intervals of the differences).

The candidate becomes a new version of ``tracking.registered_model`` (a servable pyfunc model with its card:
pipelines.ads.serving.student_model; a baseline is registered from the folder evaluate saved it in), and the
``champion`` alias moves to it when it beats the current champion's recorded test figure
(``promotion_decision``; a champion measured on other test pairs is compared all the same, and the reason says
so). The version's tags hold the SHA-256 digest of the logged files (``agpo score`` and ``agpo serve`` refuse a
download whose files differ: pipelines.ads.serving.student_model) and of the test pairs.

Atomic and retry-safe: every registration of a model runs under one fenced lease (``registration_lock``); a
version already created for a run is reused; the decision is tagged on the version before the alias moves, and
the move is a compare-and-swap, so a retry after a crash at any point ends as an uninterrupted run does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.ads.student.comparison import COMPARISON_PLOTS, STUDENT, baseline_figures, champion_candidate
from pipelines.errors import StageFailed
from pipelines.lease import Lease
from pipelines.tracking import (
    CHAMPION,
    StageRun,
    Tracker,
    TrackingConfig,
    global_tracking_uri,
    metric_name,
    tracking_uri,
)

TEST_PAIRS_TAG, CHAMPION_BEFORE_TAG = "test_pairs_sha256", "champion_before"
LOCK_SECONDS = 600.0  # a registration lock unchanged this long (its holder dead or hung on another host) is free
LOCK_POLL_SECONDS = 0.5
ALIAS_TRIES = 3


@dataclass(frozen=True)
class Evaluation:
    """What the evaluation says of one model, as registration records it: its gold test ``metrics``, the
    ``baselines``' figures beside them (name -> metrics), the digest of the gold ``test_pairs`` they were scored on
    (pipelines.ads.student.evidence), and the ``figures`` drawn of them (PNG files, attached to the LoggedModel)."""

    metrics: Mapping[str, float]
    baselines: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    test_pairs: str | None = None
    figures: Sequence[Path] = ()


def register_champion(
    tracker: Tracker,
    log: StageRun,
    report: Mapping[str, Any],
    model_dirs: Mapping[str, Path],
    test_pairs: str | None = None,
    lock_dir: Path | None = None,
    figures: Sequence[Path] = (),
) -> dict[str, Any]:
    """Apply ``champion_candidate`` to ``report`` and register its candidate's folder (``model_dirs`` by model
    name, the baselines' from the report's ``baseline_models``) with ``register_student``; the pipeline's student
    is logged as a LoggedModel of ``log``'s run either way (``student_model.log_student_model``), so every run's
    student is in MLflow once, registered or not. ``test_pairs``: the digest of the gold test pairs the report
    was scored on (pipelines.ads.student.evidence); ``lock_dir``: ``register_student``'s; ``figures``: the
    evaluation's PNG files, attached to the student's logged model (another candidate's gets the comparison
    plots, ``COMPARISON_PLOTS``: the rest are the student's). Returns the decision (registration.json)."""
    metric = tracker.config.champion_metric
    choice = champion_candidate(report, metric)
    base = {
        "model": tracker.config.registered_model,
        "metric": metric,
        "candidate": choice["candidate"],
        "strongest_baseline": choice["strongest_baseline"],
        "teacher_added": choice["teacher_added"],
    }
    models = report.get("models") or {}
    baselines = baseline_figures(report)
    folders = {**{name: Path(p) for name, p in (report.get("baseline_models") or {}).items()}, **model_dirs}
    candidate = choice["candidate"]
    if candidate is not None and candidate not in folders:
        raise StageFailed(
            f"the champion rule picked {candidate}, but the evaluation names no folder for it (metrics.json written "
            "before baselines were saved as models): rerun agpo evaluate, then register"
        )

    def evaluation(name: str) -> Evaluation:
        others = {other: theirs for other, theirs in baselines.items() if other != name}
        numbers = {k: v for k, v in models[name].items() if isinstance(v, int | float)}
        plots = figures if name == STUDENT else [f for f in figures if Path(f).name in COMPARISON_PLOTS]
        return Evaluation(numbers, others, test_pairs, plots)

    if candidate != STUDENT and STUDENT in models:  # in the run's experiment: it is not registered
        _log_model(tracker, log, folders[STUDENT], evaluation(STUDENT), STUDENT, tracker.experiment_id)
    if candidate is None:
        return {**base, "version": None, "promoted": False, "challenger": None, "reason": choice["reason"]}
    decision = register_student(tracker, log, folders[candidate], evaluation(candidate), candidate, lock_dir)
    return {**base, **decision, "reason": f"{choice['reason']}; {decision['reason']}"}


def _log_model(
    tracker: Tracker, log: StageRun, model_dir: Path, evaluation: Evaluation, name: str, experiment_id: str
) -> tuple[str, str]:
    """``model_dir`` as the LoggedModel ``name`` of ``log``'s run, in ``experiment_id``, with ``evaluation``'s
    figures; returns (model id, model card). A student folder with weights but no ONNX graph is exported first: the
    served model runs the graph."""
    from pipelines.ads.serving import student_model  # imports mlflow.pyfunc: only when registering
    from student.export import ensure_onnx  # imports torch: only when registering

    ensure_onnx(model_dir)

    card = student_model.model_card(Path(model_dir), evaluation.metrics, evaluation.baselines)
    with global_tracking_uri(tracking_uri(tracker.config)):  # save_model's checks use the global store
        model_id = student_model.log_student_model(
            log, Path(model_dir), card, name, evaluation.metrics, experiment_id, evaluation.figures
        )
        return model_id, card


def register_student(
    tracker: Tracker,
    log: StageRun,
    model_dir: Path,
    evaluation: Evaluation,
    name: str = STUDENT,
    lock_dir: Path | None = None,
) -> dict[str, Any]:
    """With ``tracker``'s registry, under the registration lock (``registration_lock`` in ``lock_dir``): log
    ``model_dir`` as the LoggedModel ``name`` of ``log``'s run (a pyfunc model with ``evaluation``'s gold test
    metrics linked and its figures attached: pipelines.ads.serving.student_model) and register that model as a new
    version, its model card (with the baselines' figures beside its own) as description, the SHA-256 digest of its
    files and the digest of the gold test pairs it was scored on as tags; move the champion alias to it when it
    beats the champion on ``champion_metric``.

    One version per run: a retry finds the version its run created. The decision is tagged on the version
    before the alias moves, and the move is a compare-and-swap under the lock, so a retry after a crash at any
    point ends as an uninterrupted run does, and of two registrations the alias ends on the better model."""
    registered, metric = tracker.config.registered_model, tracker.config.champion_metric
    with registration_lock(tracker.config, lock_dir) as lock:
        found = tracker.client.search_model_versions(f"name = '{registered}' and run_id = '{log.run_id}'")
        # a retry after the version was created: do not register twice
        version = found[0] if found else _create_version(tracker, log, model_dir, evaluation, name)
        challenger = float(evaluation.metrics[metric])
        decision = _recorded_promotion(tracker, version) or _promote(
            tracker, lock, version, challenger, evaluation.test_pairs
        )
    return {
        "model": registered,
        "version": int(version.version),
        "metric": metric,
        "challenger": challenger,
        **decision,
    }


@contextmanager
def registration_lock(config: TrackingConfig, folder: Path | None = None) -> Iterator[Lease]:
    """The fenced lease (pipelines.lease) on registering ``config.registered_model``, in ``config.lock_dir``, else
    ``folder`` (the pipeline's runs folder), else ``<store_dir>/locks``: two CLI runs, or an Airflow try and its
    zombie, take turns; a holder killed on this host frees it at once, one on another host after
    ``LOCK_SECONDS`` unchanged."""
    folder = Path(config.lock_dir) if config.lock_dir else folder or Path(config.store_dir) / "locks"
    lease = Lease(folder, "register-" + re.sub(r"[^A-Za-z0-9._-]", "_", config.registered_model), LOCK_SECONDS)
    lease.acquire(done=lambda: False, poll=LOCK_POLL_SECONDS)
    try:
        yield lease
    finally:
        lease.release()


def _create_version(tracker: Tracker, log: StageRun, model_dir: Path, evaluation: Evaluation, name: str) -> Any:
    """A new version of the registered model from ``model_dir`` logged as ``name``; its tags hold the test figures,
    the baselines' champion metric, the files' digest and the test pairs' digest."""
    from pipelines.ads.serving.student_model import FILES_TAG, MAX_DESCRIPTION, logged_files_digest

    registered, metric = tracker.config.registered_model, tracker.config.champion_metric
    if not tracker.client.search_registered_models(f"name = '{registered}'"):
        tracker.client.create_registered_model(registered, description="Distilled ads-relevance student")
    # in the registry experiment, apart from the runs: on a shared server only the registrar writes there
    experiment = tracker.registry_experiment_id()
    model_id, card = _log_model(tracker, log, model_dir, evaluation, name, experiment)
    tags = {f"test_{metric_name(k)}": str(v) for k, v in evaluation.metrics.items()}
    for baseline, figures in evaluation.baselines.items():
        if metric in figures:
            tags[f"test_{baseline}_{metric_name(metric)}"] = str(figures[metric])
    if evaluation.test_pairs is not None:
        tags[TEST_PAIRS_TAG] = evaluation.test_pairs
    with global_tracking_uri(tracking_uri(tracker.config)):  # a SQLite registry finds the model there
        # the files downloaded back and checked: what the tag vouches for is what was stored, not what was meant
        tags[FILES_TAG] = logged_files_digest(tracker.client, model_id)
        return tracker.client.create_model_version(
            registered,
            f"models:/{model_id}",
            run_id=log.run_id,
            tags=tags,
            description=card[:MAX_DESCRIPTION],
            model_id=model_id,
        )


def _champion_version(tracker: Tracker) -> str | None:
    """The version the champion alias points at now, read from the model's alias map, never from an exception: a
    registry that fails (a 5xx after retries, a timeout) fails the step, to be retried, instead of reading as "no
    champion yet" (fail closed)."""
    aliased = tracker.client.get_registered_model(tracker.config.registered_model).aliases.get(CHAMPION)
    return None if aliased is None else str(aliased)


def _recorded_promotion(tracker: Tracker, version: Any) -> dict[str, Any] | None:
    """The decision an earlier try recorded on ``version``, when it went through (the alias points at it)."""
    tags = version.tags
    if _champion_version(tracker) != str(version.version) or "promotion_reason" not in tags:
        return None
    before = tags.get(CHAMPION_BEFORE_TAG, "none")
    return {
        "promoted": True,
        "champion_before": None if before == "none" else float(before),
        "reason": tags["promotion_reason"],
    }


def _promote(tracker: Tracker, lock: Lease, version: Any, challenger: float, test_pairs: str | None) -> dict[str, Any]:
    """Compare ``version`` with the champion, tag the decision on it, then move the alias to it when it won, if the
    alias still points where it pointed when compared (else compare again: something outside the lock moved it)."""
    registered, metric, client = tracker.config.registered_model, tracker.config.champion_metric, tracker.client
    for _ in range(ALIAS_TRIES):
        aliased = _champion_version(tracker)
        champion = None if aliased is None else client.get_model_version(registered, aliased)
        score = None if champion is None else float(champion.tags.get(f"test_{metric_name(metric)}", "-inf"))
        decision = promotion_decision(metric, challenger, None if champion is None else (champion.version, score))
        decision["reason"] += _measured_on(champion, test_pairs)
        tags = {
            "promotion": "champion" if decision["promoted"] else "challenger",
            "promotion_reason": decision["reason"],
            CHAMPION_BEFORE_TAG: "none" if score is None else str(score),
        }
        for key, value in tags.items():
            client.set_model_version_tag(registered, version.version, key, value)
        result = {**decision, "champion_before": score}
        if not decision["promoted"]:
            return result
        lock.check()  # a try whose lock was taken over moves nothing
        if _champion_version(tracker) == aliased:
            client.set_registered_model_alias(registered, CHAMPION, version.version)
            return result
    raise StageFailed(
        f"the {CHAMPION} alias of {registered} moved {ALIAS_TRIES} times while this run compared against it: "
        "something moves it without the registration lock (a person in the MLflow UI, an older agpo); retry once "
        "it stays put"
    )


def _measured_on(champion: Any, test_pairs: str | None) -> str:
    """Words for a champion whose figures come from other test pairs than the candidate's ('' for the same)."""
    if champion is None or test_pairs is None or champion.tags.get(TEST_PAIRS_TAG) == test_pairs:
        return ""
    theirs = champion.tags.get(TEST_PAIRS_TAG)
    pairs = "unrecorded test pairs" if theirs is None else f"other test pairs ({theirs[:12]} vs {test_pairs[:12]})"
    return f"; note: champion version {champion.version} was measured on {pairs}, so the figures compare different sets"


def promotion_decision(metric: str, challenger: float, champion: tuple[str, float] | None) -> dict[str, Any]:
    """Whether a registered candidate becomes champion, and why: it must beat the current champion's
    recorded ``metric`` (any candidate does when there is none)."""
    if champion is not None and not challenger > champion[1]:
        reason = f"kept as challenger: {metric} {challenger:.4f} does not beat champion version {champion[0]}'s "
        return {"promoted": False, "reason": reason + f"{champion[1]:.4f}"}
    against = "first version" if champion is None else f"beats champion version {champion[0]}'s {champion[1]:.4f}"
    return {"promoted": True, "reason": f"promoted: {metric} {challenger:.4f}, {against}"}
