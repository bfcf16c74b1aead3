"""The teacher registry: a teacher that passed its gates, registered with what it learnt from, and reused.

Register (the register step, as its MLflow user, the one that may move aliases: ``register_teacher``): when this
run trained a teacher and its gate step passed (not skipped: ``teacher_skipped.json``; not reused), under the
registration lock of the teacher's registered model (``teacher_reuse.registered_model``, else
``<tracking.registered_model>-teacher``; pipelines.ads.serving.registry.registration_lock, in the student's lock
folder), the teacher the train step logged (its LoggedModel ``teacher``) becomes a new version. Its tags: the
digest of its files as the store holds them (downloaded back and compared with the run's folder;
durable.fileio.files_digest), the digest of the gold train pairs (pipelines.ads.distillation.evidence.gold_pairs_digest)
and their count, the prompt version and the gate's figures; one key per gold train pair (``gold_keys``) is logged
with the register step's run. Then the ``current`` alias moves to it. A teacher below a gate never gets
there: its gate step raised, and the register step reads its record. A retry of the register step finds the
version its run created. What happened goes to ``registration.json`` (``teacher_registration``). No task but the
register step writes to the registry: the gate step only checks a reused teacher's files once more
(``check_reused``).

Reuse (the teacher step, before any SFT, when ``teacher_reuse.source`` is set: ``reuse_step``): the rule is
pipelines.ads.teacher.gate's ``reuse_verdict``. The gold change is read first (the registered digest, then the
registered keys against this run's); a teacher worth a look is downloaded into a private folder
(pipelines.ads.serving.private_folder), its files' digest compared with the registered one (a difference stops
the run: nothing is loaded), loaded from there and graded on this run's audit pairs as the train step grades
(pipelines.ads.teacher.train's evaluation). Reused, it is copied into the run's RL folder (``model/`` and a
``summary.json`` of those audit figures): the gate step judges it there and checks its digest once more, and
annotation reads it there; the SFT and RL steps are skipped, each saying so. The decision and its reason go to
``teacher_reuse.json`` at the run's root and to the step's MLflow tags.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from durable.fileio import files_digest, folder_files
from pipelines.ads.distillation.evidence import TEST_COLUMNS, gold_pairs_digest
from pipelines.ads.intake.contracts import read_pairs
from pipelines.ads.serving.private_folder import private_folder
from pipelines.ads.serving.registry import registration_lock
from pipelines.ads.teacher.gate import gold_change, judge_teacher, reuse_verdict
from pipelines.config import to_dict
from pipelines.errors import StageFailed
from pipelines.io import print_summary, write_json_atomic
from pipelines.steps import SUCCESS, PipelineRun, read_json
from pipelines.tracking import (
    REGISTERED_MODEL_NAME,
    RUN_KEY,
    STAGE,
    StageRun,
    filter_literal,
    global_tracking_uri,
    import_mlflow,
    metric_name,
    tracking_uri,
)

CURRENT = "current"
FILES_TAG, GOLD_TAG, GOLD_PAIRS_TAG = "teacher_files_sha256", "gold_train_sha256", "gold_train_pairs"
KEYS_RUN_TAG, KEYS_FILE = "gold_train_keys_run", "gold_train_keys.json"  # the register run's artifact teacher/KEYS_FILE
RECORD = "teacher_reuse.json"


def teacher_model_name(config: Any) -> str:
    """The teacher's registered model: ``teacher_reuse.registered_model``, else
    ``<tracking.registered_model>-teacher``."""
    name = config.teacher_reuse.registered_model or f"{config.tracking.registered_model}-teacher"
    if not REGISTERED_MODEL_NAME.fullmatch(name):
        raise StageFailed(f"{name!r} is not a registered model name: set teacher_reuse.registered_model (1-128 chars)")
    return name


def teacher_digest(folder: Path) -> str:
    """The digest of every file of a teacher folder (durable.fileio.files_digest)."""
    return files_digest(folder_files(folder))


def gold_train(pairs: str) -> list[dict[str, Any]]:
    """The gold train pairs' ``TEST_COLUMNS`` (pair id, texts, grade): what the teacher learnt from."""
    rows = read_pairs(pairs, split="train").select(list(TEST_COLUMNS)).to_pylist()
    return [row for row in rows if row["gold_grade"] is not None]


def gold_keys(rows: list[dict[str, Any]]) -> set[str]:
    """One key per gold train pair (its ``gold_pairs_digest``): a changed grade or text is a new key."""
    return {gold_pairs_digest([row])[:32] for row in rows}


def gate_settings(config: Any) -> tuple:
    """The gate's thresholds as ``judge_teacher`` takes them (after the summary and its path)."""
    return config.gate_metric, config.min_audit_accuracy, config.max_predicted_share, config.min_balanced_margin


def _client(config: Any):
    uri = tracking_uri(config.tracking)
    return import_mlflow().MlflowClient(tracking_uri=uri, registry_uri=uri)


def recorded_decision(root: Path) -> dict[str, Any] | None:
    """This run's reuse decision (``teacher_reuse.json``), or None when the run trains its teacher unasked."""
    path = root / RECORD
    return read_json(path) if path.is_file() else None


def reuse_step(config: Any, run: PipelineRun, place: Any, pairs: str) -> dict[str, str] | None:
    """The step ``teacher-reuse`` (when ``teacher_reuse.source`` is set): decide, and when the teacher is reused,
    install it in ``place.rl`` and return the teacher step's outputs (SFT skipped, said so); None: train."""
    settings = config.teacher_reuse
    if settings.source is None:
        return None
    gates = gate_settings(config)

    def work(log: StageRun | None) -> dict[str, Any]:
        decision = _decide(config, place, pairs, gates)
        if log is not None:
            log.set_tags({"teacher_reuse": "reused" if decision["reuse"] else "retrain"})
            log.set_tags({"teacher_reuse_reason": decision["reason"][:5000], "teacher_source": decision["teacher"]})
            if decision["gold_change"] is not None:
                log.log_metrics({"gold_change": decision["gold_change"]})
        return {"decision": write_json_atomic(place.root / RECORD, decision)}

    run.once("teacher-reuse", {**to_dict(settings), "gates": list(gates)}, work)
    decision = recorded_decision(place.root)
    if not decision["reuse"]:
        print(f"teacher: training a new teacher (SFT, then RL), not {decision['teacher']}: {decision['reason']}")
        return None
    print_summary(
        f"teacher: SFT skipped: reusing teacher {decision['teacher']} ({decision['reason']})",
        {"teacher": place.rl / "model", "decision": place.root / RECORD},
    )
    return {"model": str(place.rl / "model")}


def reused_outputs(place: Any) -> dict[str, str] | None:
    """The train step's outputs when this run reuses a teacher (RL skipped, said so), else None."""
    decision = recorded_decision(place.root)
    if not decision or not decision["reuse"]:
        return None
    print_summary(
        f"train: RL skipped: reusing teacher {decision['teacher']} ({decision['reason']})",
        {"model": place.rl / "model", "summary (its audit figures on this run's pairs)": place.rl / "summary.json"},
    )
    return {"model": str(place.rl / "model"), "summary": str(place.rl / "summary.json")}


def source_of(config: Any) -> str:
    """``teacher_reuse.source``, its shorthand ``current`` spelt out: ``models:/<teacher model>@current``."""
    source = config.teacher_reuse.source
    return f"models:/{teacher_model_name(config)}@{CURRENT}" if source == CURRENT else source


def _decide(config: Any, place: Any, pairs: str, gates: tuple) -> dict[str, Any]:
    """The reuse rule applied (module docstring); when reused, the teacher installed in ``place.rl``."""
    settings, client, source = config.teacher_reuse, _client(config), source_of(config)
    version = _source_version(client, source) if source.startswith("models:/") else None
    name = source if version is None else f"{version.name}/{version.version}"
    base = {"source": source, "teacher": name, "mode": settings.mode, "gold_change": None}
    if source.startswith("models:/") and version is None:
        if settings.mode == "always":
            raise StageFailed(f"{source} names no registered teacher: run once without teacher_reuse.source")
        return {**base, "reuse": False, "reason": f"no teacher registered at {source} yet"}
    change = None if version is None else _gold_change(client, version, pairs)
    reuse, reason = reuse_verdict(settings, change)
    if not reuse:
        return {**base, "gold_change": change, "reuse": False, "reason": reason}
    with private_folder("agpo-teacher-") as tmp:
        local = _fetch(config, client, version, source, tmp)
        digest = teacher_digest(local)
        if version is not None and digest != version.tags.get(FILES_TAG):
            raise StageFailed(
                f"{name}: its files are not the ones registered (digest {digest[:12]}, registered "
                f"{str(version.tags.get(FILES_TAG))[:12]}): nothing was loaded; register the teacher again"
            )
        summary = audit_summary(config, local, pairs)  # the verified bytes, loaded from the private folder
        _, failure = judge_teacher(summary, place.rl / "summary.json", *gates)
        reuse, reason = reuse_verdict(settings, change, failure)
        if reuse:
            _install(local, summary, place.rl)
    return {**base, "gold_change": change, "reuse": reuse, "reason": reason, "files_sha256": digest}


def _source_version(client: Any, source: str) -> Any | None:
    """The model version ``source`` names (``models:/<name>@<alias>`` or ``models:/<name>/<N>``), or None when
    the model or the alias does not exist yet; read from the registry's listings, so a failing registry fails
    the step instead of reading as "none yet"."""
    name, at, alias = source.removeprefix("models:/").partition("@")
    if not at:
        name, _, number = name.rpartition("/")
        if not name or not number.isdigit():
            raise StageFailed(f"teacher_reuse.source {source}: give models:/<name>@<alias> or models:/<name>/<N>")
        return client.get_model_version(name, number)
    if not client.search_registered_models(f"name = {filter_literal(name)}"):
        return None
    aliased = client.get_registered_model(name).aliases.get(alias)
    return None if aliased is None else client.get_model_version(name, str(aliased))


def _gold_change(client: Any, version: Any, pairs: str) -> float | None:
    """``gold_change`` from the registered teacher's gold train pairs to this run's (None: not recorded)."""
    rows = gold_train(pairs)
    if version.tags.get(GOLD_TAG) == gold_pairs_digest(rows):
        return 0.0
    if KEYS_RUN_TAG not in version.tags:
        return None
    with private_folder("agpo-teacher-keys-") as tmp:
        path = client.download_artifacts(version.tags[KEYS_RUN_TAG], f"teacher/{KEYS_FILE}", str(tmp))
        return gold_change(set(read_json(Path(path))["keys"]), gold_keys(rows))


def _fetch(config: Any, client: Any, version: Any | None, source: str, tmp: Path) -> Path:
    """The teacher's files in ``tmp/model``: the registered version downloaded, or the folder copied."""
    if version is None:
        return Path(shutil.copytree(source, tmp / "model"))
    mlflow, uri = import_mlflow(), tracking_uri(config.tracking)
    with global_tracking_uri(uri):
        where = client.get_model_version_download_uri(version.name, version.version)
        local = mlflow.artifacts.download_artifacts(artifact_uri=where, dst_path=str(tmp / "model"), tracking_uri=uri)
        return Path(local)


def audit_summary(config: Any, model_dir: Path, pairs: str) -> dict[str, Any]:
    """The teacher in ``model_dir`` graded on this run's audit pairs as the train step grades (sampled and greedy),
    as an RL summary of zero steps: what the gate reads."""
    from pipelines.ads.intake.contracts import read_gold_pairs
    from pipelines.ads.teacher.train import relevance_task
    from pipelines.devices import teacher_on_device, use_device
    from pipelines.threads import use_threads

    train = replace(config.train, pairs=pairs, base_model=str(model_dir), rl_share=config.teacher.rl_share)
    started = time.perf_counter()
    use_threads(train.threads)
    _, tokenizer, engine = teacher_on_device(model_dir, train.engine, train.engine_options, use_device(train))
    task = relevance_task(train, read_gold_pairs(pairs), model_dir)
    figures = task.evaluation(engine, tokenizer)()
    summary = {f"{k}_{edge}": v for k, v in figures.items() for edge in ("start", "end")}
    seconds = round(time.perf_counter() - started, 1)
    extra = {"algorithm": "reused", "steps": 0, "generated_tokens": 0, "seconds": seconds, "base_model": "reused"}
    return {**summary, **extra, **task.summary}


def _install(local: Path, summary: dict[str, Any], rl: Path) -> None:
    """The reused teacher as the train step leaves one: ``rl/model`` (copied whole, then renamed) and its summary."""
    rl.mkdir(parents=True, exist_ok=True)
    partial = rl / "model.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(local, partial)
    shutil.rmtree(rl / "model", ignore_errors=True)  # a try killed after its copy, before its record
    partial.rename(rl / "model")
    write_json_atomic(rl / "summary.json", summary)


def check_reused(log: StageRun | None, place: Any) -> None:
    """The gate step, once a reused teacher passed: its folder checked against its digest once more (annotation
    loads it next). A trained teacher is registered by the register step (``register_teacher``)."""
    decision = recorded_decision(place.root)
    if decision is None or not decision["reuse"]:
        return
    if teacher_digest(place.rl / "model") != decision["files_sha256"]:
        raise StageFailed(f"{place.rl / 'model'} changed after it was verified and audited: start the run again")
    if log is not None:
        log.set_tags({"teacher_reused": decision["teacher"]})


def register_teacher(
    config: Any, log: StageRun, place: Any, pairs: str, skipped: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """The register step: the teacher this run trained, registered and made ``current`` when its gate step passed
    (module docstring); ``place``: the run's folders, ``pairs``: its pairs, ``skipped``: its ``teacher_skipped.json``.
    Returns the registration record's part ``teacher_registration``: the model, the version (None: none registered)
    and why."""
    name = teacher_model_name(config)
    gate_marker = place.steps / f"gate{SUCCESS}"  # the gate step's record (pipelines.ads.pipeline.gate), once passed
    decision = recorded_decision(place.root)
    if skipped is not None:
        reason = f"the teacher was skipped at the {skipped['step']} step"
    elif decision is not None and decision["reuse"]:
        reason = f"this run reused teacher {decision['teacher']}"
    elif not config.teacher_reuse.register:
        reason = "teacher_reuse.register is false"
    elif not gate_marker.is_file():
        reason = "the gate step has not passed"
    else:
        version = _register(config, log, name, place, pairs, Path(read_json(gate_marker)["outputs"]["summary"]))
        log.set_tags({"teacher_registered": f"{name}/{version}"})
        print(f"register: teacher registered as {name} version {version}, alias {CURRENT}")
        return {"teacher_registration": {"model": name, "version": int(version), "alias": CURRENT}}
    print(f"register: no teacher registered: {reason}")
    return {"teacher_registration": {"model": name, "version": None, "reason": reason}}


def _register(config: Any, log: StageRun, name: str, place: Any, pairs: str, summary: Path) -> str:
    """A new version of ``name`` from ``place.rl/model`` (one this stage run created, on a retry), made
    ``current``; returns its number."""
    figures, failure = judge_teacher(read_json(summary), summary, *gate_settings(config))
    if failure:
        raise StageFailed(f"{summary} changed after the gate passed ({failure}): no teacher registered")
    client, gold = log.client, gold_train(pairs)
    keys = write_json_atomic(place.root / "teacher" / KEYS_FILE, {"keys": sorted(gold_keys(gold))})
    log.log_artifact(keys, "teacher")
    with registration_lock(replace(config.tracking, registered_model=name)) as lock:
        if not client.search_registered_models(f"name = {filter_literal(name)}"):
            client.create_registered_model(name, description="Ads-relevance LLM teacher that passed its gates")
        found = client.search_model_versions(f"name = {filter_literal(name)} and run_id = {filter_literal(log.run_id)}")
        version = found[0] if found else _create_version(config, log, name, place.rl / "model", gold, figures)
        lock.check()  # a try whose lock was taken over moves nothing
        client.set_registered_model_alias(name, CURRENT, version.version)
    return str(version.version)


def _create_version(
    config: Any, log: StageRun, name: str, model_dir: Path, gold: list[dict[str, Any]], figures: dict[str, float]
) -> Any:
    """The train step's LoggedModel ``teacher`` (logged now when it has none) as a new version of ``name``, after
    its stored files are downloaded back and matched with ``model_dir``'s."""
    client, uri, mlflow = log.client, tracking_uri(config.tracking), import_mlflow()
    model_id = _trained_model_id(client, log.run_id) or log.log_model(model_dir, "teacher")
    digest = teacher_digest(model_dir)
    with private_folder("agpo-teacher-") as tmp, global_tracking_uri(uri):
        location = client.get_logged_model(model_id).artifact_location
        stored = mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(tmp), tracking_uri=uri)
        if teacher_digest(Path(stored)) != digest:
            raise StageFailed(f"the stored copy of teacher {model_id} differs from {model_dir}: nothing registered")
        tags = {
            FILES_TAG: digest,
            GOLD_TAG: gold_pairs_digest(gold),
            GOLD_PAIRS_TAG: str(len(gold)),
            KEYS_RUN_TAG: log.run_id,
            "prompt_version": str(read_json(model_dir.parent / "summary.json").get("prompt_version")),
            "pipeline_run": config.run_id,
            **{f"gate_{metric_name(k).removeprefix('gate_')}": str(v) for k, v in figures.items()},
        }
        return client.create_model_version(name, f"models:/{model_id}", run_id=log.run_id, tags=tags, model_id=model_id)


def _trained_model_id(client: Any, stage_run: str) -> str | None:
    """The LoggedModel ``teacher`` the train step of the register run's pipeline run logged, if any."""
    run = client.get_run(stage_run)
    experiment, key = run.info.experiment_id, filter_literal(run.data.tags[RUN_KEY])
    trains = client.search_runs([experiment], f"tags.`{RUN_KEY}` = {key} and tags.`{STAGE}` = 'train'", max_results=1)
    if not trains:
        return None
    query = f"name = 'teacher' AND source_run_id = {filter_literal(trains[0].info.run_id)}"
    ready = [m for m in client.search_logged_models([experiment], filter_string=query) if m.status == "READY"]
    return ready[0].model_id if ready else None
