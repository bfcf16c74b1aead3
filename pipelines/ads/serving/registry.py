"""The student registry: which model of a pipeline run may become ``champion``, and registering it.

The rule that picks the candidate is the comparison vocabulary's (evaluation.comparison,
``champion_candidate``), applied to ``tracking.champion_metric`` of the evaluation (agpo evaluate's
``metrics.json``: every model on the same gold test pairs, paired bootstrap intervals of the differences).

The candidate becomes a new version of ``tracking.registered_model`` (a servable pyfunc model with its card:
pipelines.ads.serving.student_model; a baseline is registered from the folder evaluate saved it in). Its copy in
the store is downloaded back and compared, file by file, with what the evaluation hashed (evidence.json). The
``champion`` alias moves to it when it beats the champion on the same test rows (``promotion_decision``): the
champion's recorded figure when both were measured on the same gold test pairs, else the champion scored again
on the candidate's pairs (pipelines.ads.serving.rescore, with the paired bootstrap interval evaluate uses).
The version's tags hold the SHA-256 digest of the logged files (``agpo score`` and ``agpo serve`` refuse a
download whose files differ: pipelines.ads.serving.student_model), of the test pairs, and the comparison.

Atomic and retry-safe: every registration of a model runs under one fenced lease (``registration_lock``) in a
folder every registering host sees, never one derived from a run's ``out_dir`` (``lock_folder``); a version
already created for a run is reused; the decision is tagged on the version before the alias moves, and the move
is a compare-and-swap (a re-read, then the set: MLflow has no conditional alias update, so only a writer that
bypasses the lock can slip between the two), so a retry after a crash at any point ends as an uninterrupted run
does.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable.fileio import changed_files, folder_files, sha256_file
from evaluation.comparison import (
    COMPARISON_PLOTS,
    STUDENT,
    baseline_figures,
    champion_candidate,
    interval_figures,
)
from pipelines.ads.distillation.evaluate_config import EvaluateConfig
from pipelines.ads.serving.private_folder import private_folder
from pipelines.ads.serving.rescore import champion_on_same_rows, on_same_rows
from pipelines.errors import StageFailed
from pipelines.lease import Lease
from pipelines.tracking import (
    CHAMPION,
    StageRun,
    Tracker,
    TrackingConfig,
    filter_literal,
    global_tracking_uri,
    metric_name,
    tracking_uri,
)

TEST_PAIRS_TAG, CHAMPION_BEFORE_TAG, COMPARISON_TAG = "test_pairs_sha256", "champion_before", "promotion_comparison"
LOCK_DIR_ENV = "AGPO_REGISTRY_LOCK_DIR"  # the register worker's lock folder (the distributed stack sets it)
LOCK_SECONDS = 600.0  # a registration lock unchanged this long (its holder dead or hung on another host) is free
LOCK_POLL_SECONDS = 0.5
ALIAS_TRIES = 3


@dataclass(frozen=True)
class Evaluation:
    """What the evaluation says of one model, as registration records it: its gold test ``metrics``, the
    ``baselines``' figures beside them (name -> metrics), the digest of the gold ``test_pairs`` they were scored on
    (pipelines.ads.distillation.evidence), and the ``figures`` drawn of them (PNG files, attached to the LoggedModel).
    From evidence.json, when the evaluation bound them: ``files`` (the SHA-256 of every file of the model folder as
    it was scored) and ``plots`` (each figure's, by file name), which the registered copy must match; and
    ``scored_on``, how the model was scored (pairs file, split, backend, bootstrap), so that a champion measured on
    other test pairs can be scored on these."""

    metrics: Mapping[str, float]
    baselines: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    test_pairs: str | None = None
    figures: Sequence[Path] = ()
    files: Mapping[str, str] | None = None
    plots: Mapping[str, str] = field(default_factory=dict)
    scored_on: EvaluateConfig | None = None


def register_champion(
    tracker: Tracker,
    log: StageRun,
    report: Mapping[str, Any],
    model_dirs: Mapping[str, Path],
    test_pairs: str | None = None,
    figures: Sequence[Path] = (),
    evidence: Mapping[str, Any] | None = None,
    scored_on: EvaluateConfig | None = None,
    lock: Lease | None = None,
) -> dict[str, Any]:
    """Apply ``champion_candidate`` to ``report`` and register its candidate's folder (``model_dirs`` by model
    name, the baselines' from the report's ``baseline_models``) with ``register_student``; the pipeline's student
    is logged as a LoggedModel of ``log``'s run either way (``student_model.log_student_model``), so every run's
    student is in MLflow once, registered or not. ``test_pairs``: the digest of the gold test pairs the report
    was scored on; ``figures``: the evaluation's PNG files, attached to the student's logged model (another
    candidate's gets the comparison plots, ``COMPARISON_PLOTS``: the rest are the student's); ``evidence``: the
    verified evidence.json record (pipelines.ads.distillation.evidence), whose listings the registered copy must match;
    ``scored_on``: how the report scored its models (``Evaluation.scored_on``); ``lock``: the registration lock
    when the caller holds it already (the pipeline checks the evidence under it). Returns the decision
    (registration.json)."""
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
        if evidence is None:
            return Evaluation(numbers, others, test_pairs, plots, scored_on=scored_on)
        if name not in evidence["models"]:
            raise StageFailed(f"evidence.json lists no files for {name}: rerun the evaluate step, then register")
        digests = {Path(f).name: evidence["plots"][Path(f).name] for f in plots}
        files = evidence["models"][name]["files"]
        return Evaluation(numbers, others, test_pairs, plots, files, digests, scored_on)

    if candidate != STUDENT and STUDENT in models:  # in the run's experiment: it is not registered
        _log_model(tracker, log, folders[STUDENT], evaluation(STUDENT), STUDENT, tracker.experiment_id)
    if candidate is None:
        return {**base, "version": None, "promoted": False, "challenger": None, "reason": choice["reason"]}
    decision = register_student(tracker, log, folders[candidate], evaluation(candidate), candidate, lock=lock)
    return {**base, **decision, "reason": f"{choice['reason']}; {decision['reason']}"}


def _log_model(
    tracker: Tracker, log: StageRun, model_dir: Path, evaluation: Evaluation, name: str, experiment_id: str
) -> tuple[str, str]:
    """``model_dir`` as the LoggedModel ``name`` of ``log``'s run, in ``experiment_id``, with ``evaluation``'s
    figures; returns (model id, model card). A student folder with weights but no ONNX graph is exported first: the
    served model runs the graph (a folder evaluate bound by evidence has its graph already: an export here would
    change it, and the registered copy would be refused)."""
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
    lock: Lease | None = None,
) -> dict[str, Any]:
    """With ``tracker``'s registry, under the registration lock (``lock``, held by the caller, else
    ``registration_lock``'s): log ``model_dir`` as the LoggedModel
    ``name`` of ``log``'s run (a pyfunc model with ``evaluation``'s gold test metrics linked and its figures
    attached: pipelines.ads.serving.student_model) and register that model as a new version, its model card (with
    the baselines' figures beside its own) as description, the SHA-256 digest of its files and the digest of the
    gold test pairs it was scored on as tags; check the stored copy against ``evaluation``'s listings
    (``verified_copy``); move the champion alias to it when it beats the champion on ``champion_metric`` on the
    same test rows (``_promote``).

    One version per run: a retry finds the version its run created (and checks its copy again). The decision is
    tagged on the version before the alias moves, and the move is a compare-and-swap under the lock, so a retry
    after a crash at any point ends as an uninterrupted run does, and of two registrations the alias ends on the
    better model."""
    registered, metric = tracker.config.registered_model, tracker.config.champion_metric
    with _held(tracker.config, lock) as held:
        found = tracker.client.search_model_versions(
            f"name = {filter_literal(registered)} and run_id = {filter_literal(log.run_id)}"
        )
        # a retry after the version was created: do not register twice
        version = found[0] if found else _create_version(tracker, log, model_dir, evaluation, name)
        challenger = float(evaluation.metrics[metric])
        with private_folder("agpo-register-") as tmp:  # what is checked there is what scores: no other user's
            stored = verified_copy(tracker, version, evaluation, tmp)
            decision = _recorded_promotion(tracker, version) or _promote(
                tracker, held, version, challenger, evaluation, stored, tmp
            )
    return {
        "model": registered,
        "version": int(version.version),
        "metric": metric,
        "challenger": challenger,
        **decision,
    }


def lock_folder(config: TrackingConfig) -> Path:
    """Where registrations of ``config.registered_model`` take turns: ``config.lock_dir`` (set by a CLI user, a
    preset or a library caller), else the register worker's ``$AGPO_REGISTRY_LOCK_DIR`` (the distributed stack sets
    it for its registrar), else ``<store_dir>/locks`` (the embedded store every local run shares). Never a run's
    ``out_dir``: runs with other out_dirs (the CLI, the stack, another output root) must share it, and a folder a
    laptop run created must not lie on another user's register path."""
    if config.lock_dir:
        return Path(config.lock_dir)
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(config.store_dir) / "locks")


@contextmanager
def registration_lock(config: TrackingConfig) -> Iterator[Lease]:
    """The fenced lease (pipelines.lease) on registering ``config.registered_model``, in ``lock_folder``: two CLI
    runs, an Airflow try and its zombie, runs with other out_dirs take turns; a holder killed on this host frees it
    at once, one on another host after ``LOCK_SECONDS`` unchanged."""
    name = "register-" + re.sub(r"[^A-Za-z0-9._-]", "_", config.registered_model)
    lease = Lease(lock_folder(config), name, LOCK_SECONDS)
    lease.acquire(done=lambda: False, poll=LOCK_POLL_SECONDS)
    try:
        yield lease
    finally:
        lease.release()


@contextmanager
def _held(config: TrackingConfig, lock: Lease | None) -> Iterator[Lease]:
    """``lock`` when the caller holds it (checked: still its own), else a new ``registration_lock``."""
    if lock is not None:
        lock.check()
        yield lock
        return
    with registration_lock(config) as lease:
        yield lease


def _create_version(tracker: Tracker, log: StageRun, model_dir: Path, evaluation: Evaluation, name: str) -> Any:
    """A new version of the registered model from ``model_dir`` logged as ``name``; its tags hold the test figures,
    the baselines' champion metric, the files' digest and the test pairs' digest."""
    from pipelines.ads.serving.student_model import FILES_TAG, MAX_DESCRIPTION, logged_files_digest

    registered, metric = tracker.config.registered_model, tracker.config.champion_metric
    if not tracker.client.search_registered_models(f"name = {filter_literal(registered)}"):
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


def verified_copy(tracker: Tracker, version: Any, evaluation: Evaluation, tmp: Path) -> Path | None:
    """The model folder of ``version`` as the store holds it, downloaded into ``tmp`` (checked against the
    version's files digest by student_model) and compared with ``evaluation.files`` and ``evaluation.plots``, the
    evaluation's hashes: a folder or figure changed after the evaluation's check (before or while it was copied)
    is refused, the version tagged ``promotion: refused`` and the alias left alone. None when there is nothing to
    compare and no champion to score on the same rows (no evidence, no ``scored_on``)."""
    from pipelines.ads.serving.student_model import FIGURES, load_registered_student

    if evaluation.files is None and evaluation.scored_on is None:
        return None
    registered, client = tracker.config.registered_model, tracker.client
    with global_tracking_uri(tracking_uri(tracker.config)):
        folder = load_registered_student(
            f"models:/{registered}/{version.version}", tracking_uri(tracker.config), tmp / "challenger"
        )
    if evaluation.files is None:
        return folder
    root = next(parent for parent in folder.parents if (parent / "MLmodel").is_file())
    figures = root / FIGURES
    stored = {name: sha256_file(figures / name) for name in evaluation.plots if (figures / name).is_file()}
    changes = changed_files(dict(evaluation.files), folder_files(folder))
    changes += [f"{FIGURES}/{change}" for change in changed_files(dict(evaluation.plots), stored)]
    if changes:
        reason = (
            f"refused: the copy registered as version {version.version} is not what the evaluation scored "
            f"({', '.join(changes[:5])}{' and more' if len(changes) > 5 else ''}): the folder changed after "
            "evaluate (or while it was copied); the alias was not moved. Rerun the evaluate step to score what is "
            "there now, then register"
        )
        client.set_model_version_tag(registered, version.version, "promotion", "refused")
        client.set_model_version_tag(registered, version.version, "promotion_reason", reason)
        raise StageFailed(reason)
    return folder


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
    comparison = tags.get(COMPARISON_TAG, "none")
    return {
        "promoted": True,
        "champion_before": None if before == "none" else float(before),
        "comparison": None if comparison == "none" else json.loads(comparison),
        "reason": tags["promotion_reason"],
    }


def _promote(
    tracker: Tracker,
    lock: Lease,
    version: Any,
    challenger: float,
    evaluation: Evaluation,
    stored: Path | None,
    tmp: Path,
) -> dict[str, Any]:
    """Compare ``version`` with the champion on the same test rows (the champion's recorded figure, or the champion
    scored again on the candidate's test pairs: ``champion_on_same_rows``), tag the decision on it, then move the
    alias to it when it won, if the alias still points where it pointed when compared (else compare again:
    something outside the lock moved it)."""
    registered, metric, client = tracker.config.registered_model, tracker.config.champion_metric, tracker.client
    for _ in range(ALIAS_TRIES):
        aliased = _champion_version(tracker)
        champion = None if aliased is None else client.get_model_version(registered, aliased)
        recorded = None if champion is None else float(champion.tags.get(f"test_{metric_name(metric)}", "-inf"))
        comparison = None
        other_pairs = champion is not None and evaluation.test_pairs not in (None, champion.tags.get(TEST_PAIRS_TAG))
        # measured on other test pairs: score the champion on the candidate's (pipelines.ads.serving.rescore); a
        # library call that names no pairs (no scored_on) compares the recorded figures, and the reason says so
        if other_pairs and evaluation.scored_on is not None and stored is not None:
            theirs = (champion.version, champion.tags.get(TEST_PAIRS_TAG), recorded)
            comparison = champion_on_same_rows(
                tracker.config, theirs, evaluation.test_pairs, evaluation.scored_on, stored, tmp
            )
        if comparison is not None and "champion" in comparison:  # both scored on this evaluation's rows
            score = comparison["champion"]
            decision = promotion_decision(metric, comparison["challenger"], (champion.version, score))
            decision["reason"] += f"; {on_same_rows(comparison)}"
        else:
            score = recorded
            decision = promotion_decision(metric, challenger, None if champion is None else (champion.version, score))
            decision["reason"] += _measured_on(champion, evaluation.test_pairs, comparison)
        tags = {
            "promotion": "champion" if decision["promoted"] else "challenger",
            "promotion_reason": decision["reason"],
            CHAMPION_BEFORE_TAG: "none" if score is None else str(score),
            COMPARISON_TAG: "none" if comparison is None else json.dumps(comparison),
        }
        for key, value in tags.items():
            client.set_model_version_tag(registered, version.version, key, value)
        result = {**decision, "champion_before": score, "comparison": comparison}
        if not decision["promoted"]:
            return result
        lock.check()  # a try whose lock was taken over moves nothing
        if _champion_version(tracker) == aliased:  # the swap's compare: MLflow sets aliases unconditionally
            client.set_registered_model_alias(registered, CHAMPION, version.version)
            return result
    raise StageFailed(
        f"the {CHAMPION} alias of {registered} moved {ALIAS_TRIES} times while this run compared against it: "
        "something moves it without the registration lock (a person in the MLflow UI, an older agpo); retry once "
        "it stays put"
    )


def _measured_on(champion: Any, test_pairs: str | None, comparison: Mapping[str, Any] | None = None) -> str:
    """Words for a champion whose recorded figures come from other test pairs than the candidate's ('' for the
    same), and why it was not scored on the candidate's."""
    if champion is None or test_pairs is None or champion.tags.get(TEST_PAIRS_TAG) == test_pairs:
        return ""
    theirs = champion.tags.get(TEST_PAIRS_TAG)
    pairs = "unrecorded test pairs" if theirs is None else f"other test pairs ({theirs[:12]} vs {test_pairs[:12]})"
    why = "" if comparison is None else f"; it was not scored on this evaluation's pairs: {comparison['not_scored']}"
    return f"; note: champion version {champion.version} was measured on {pairs}, so the figures compare different " + (
        f"sets{why}"
    )


def promotion_decision(metric: str, challenger: float, champion: tuple[str, float] | None) -> dict[str, Any]:
    """Whether a registered candidate becomes champion, and why: it must beat the current champion's ``metric`` on
    the same rows (any candidate does when there is none); docs/tracking.md says why the point figure decides."""
    if champion is not None and not challenger > champion[1]:
        reason = f"kept as challenger: {metric} {challenger:.4f} does not beat champion version {champion[0]}'s "
        return {"promoted": False, "reason": reason + f"{champion[1]:.4f}"}
    against = "first version" if champion is None else f"beats champion version {champion[0]}'s {champion[1]:.4f}"
    return {"promoted": True, "reason": f"promoted: {metric} {challenger:.4f}, {against}"}


def log_decision(log: StageRun, decision: Mapping[str, Any]) -> None:
    """The register step's ``decision`` on its stage run: promoted, the version registered, the champion and the
    challenger on this run's test rows with their difference's interval (metrics), promotion, reason, candidate
    (tags)."""
    figures = {"promoted": int(decision["promoted"])}
    if decision["version"] is not None:
        figures["registered_version"] = decision["version"]
    same_rows = decision.get("comparison") or {}
    if "champion" in same_rows:  # the champion scored on this run's test pairs, beside the candidate
        figures |= {"champion_same_rows": same_rows["champion"], "challenger_same_rows": same_rows["challenger"]}
        figures |= interval_figures("challenger_minus_champion", same_rows["difference"])
    log.log_metrics(figures)
    log.set_tags(
        {
            "promotion": "champion" if decision["promoted"] else "challenger",
            "promotion_reason": decision["reason"][:5000],
            "candidate": decision["candidate"] or "none",
        }
    )
