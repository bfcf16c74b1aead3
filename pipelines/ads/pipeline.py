"""The ads-relevance pipeline as steps: what each task of the ``ads_relevance_agpo`` DAG runs.

    validate -> teacher (base model + SFT) -> train (RL) -> gate -> partition -> annotate shard k (mapped)
      -> merge -> distil -> evaluate (+ the gold-only student, the baselines) -> register (the champion rule)

Each step is ``step(config, who) -> dict of output paths (strings)``: it runs one stage module on configs
whose folders are rewritten under ``<out_dir>/<run_id>/`` (so runs never collide), and records it in
MLflow (pipelines.tracking: one child run per step under the pipeline's parent run). Steps are
idempotent: a finished step leaves ``_SUCCESS.json`` in its folder and a rerun or an Airflow retry returns
the recorded paths without redoing the work or logging again; an interrupted step resumes (the trainer,
the annotator and the distiller checkpoint). ``run`` runs every step in one process (``agpo
pipeline``).

A teacher that fails the prior gate (after SFT) or the gate (after RL: pipelines.ads.teacher.gate) labels
nothing: the step records why in ``teacher_skipped.json`` and raises ``StepSkipped`` (the DAG marks the teacher
path skipped, not failed). The student then learns from the gold train pairs alone and the champion rule
registers the best model there is, so every run hands back a model and says why the teacher was skipped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from evaluation.comparison import (
    GOLD_ONLY,
    STUDENT,
    baseline_figures,
    evaluation_figures,
)
from pipelines import steps
from pipelines.ads.annotation import annotate as annotate_stage
from pipelines.ads.annotation.merge import merge as merge_annotation
from pipelines.ads.annotation.shards import read_manifest, shard_name
from pipelines.ads.distillation import distil as distil_stage
from pipelines.ads.distillation import evaluate as evaluate_stage
from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.distillation.evidence import bind_evidence, verified_evidence
from pipelines.ads.distillation.report_page import champion_line, publish_report, summarise_parent
from pipelines.ads.intake import data as data_stage
from pipelines.ads.intake import window
from pipelines.ads.intake.contracts import ContractError, read_pairs
from pipelines.ads.pipeline_config import (
    AdsPipelineConfig,
    annotate_config,
    distil_config,
    layout,
    pairs_path,
    report_files,
    teacher_dir,
)
from pipelines.ads.serving import teacher_registry
from pipelines.ads.serving.registry import log_decision, register_champion, registration_lock
from pipelines.ads.teacher import train as train_stage
from pipelines.ads.teacher import warm_start as teacher_stage
from pipelines.ads.teacher.gate import GateFailed, judge_sft_teacher, judge_teacher, skip_teacher, skipped_record
from pipelines.config import to_dict
from pipelines.errors import StageFailed, StepSkipped
from pipelines.io import print_summary, require_file, write_json_atomic
from pipelines.progress import progress_bar
from pipelines.steps import CLI, Caller, PipelineRun, live_metrics, log_training, read_json
from pipelines.tracking import StageRun

# DAG param -> config key; a DAG run's other keys come from its presets and overrides (AdsPipelineConfig.run_choices)
AIRFLOW_PARAMS = {
    "pairs": "pairs",
    "pairs_window": "pairs_window",  # made from the partitions param and the run's interval (intake.window.dag_params)
    "base_teacher": "base_teacher",
    "min_audit_accuracy": "min_audit_accuracy",
    "registered_model": "tracking.registered_model",
    "teacher_from": "teacher_reuse.source",  # a scheduled run's default: current (weekly_params)
}


def from_airflow(
    params: dict[str, Any], dag_id: str, dag_run_id: str, try_number: int
) -> tuple[AdsPipelineConfig, Caller]:
    """The config of a DAG run from its params (presets, algorithm, data, model, gate, overrides)."""
    return steps.from_airflow(AdsPipelineConfig, params, dag_id, dag_run_id, try_number, AIRFLOW_PARAMS)


def weekly_params(context: Mapping[str, Any]) -> dict[str, Any]:
    """A DAG run's params with its week (``pairs_window``: intake.window.dag_params) and, for a scheduled run that
    names no ``teacher_from``, the registered teacher's ``current`` version to start from (the weekly loop)."""
    params = window.dag_params(context)
    if params.get("teacher_from") is None and getattr(context.get("dag_run"), "run_type", None) == "scheduled":
        params["teacher_from"] = teacher_registry.CURRENT
    return params


def pipeline_run(config: AdsPipelineConfig, caller: Caller) -> PipelineRun:
    tags = {"algorithm": config.train.trainer.algorithm}
    return PipelineRun(layout(config).root, config.run_id, config.tracking, caller, tags, to_dict(config))


def validate(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """The embedded synthetic set, the given pairs file, or the rows of ``pairs_window`` of the given dataset
    (pipelines.ads.intake.window: the window's unlabeled pairs, the gold ones up to its end), checked against
    the pairs contract; the window and the partitions read go to ``pairs_window.json`` and MLflow."""

    def work(log: StageRun | None) -> dict[str, Any]:
        if config.pairs:
            chosen = window.select_pairs(config.pairs, config.pairs_window, layout(config).data) if windowed else {}
            table = read_pairs(pairs_path(config))  # raises ContractError naming the field
            splits = table.group_by("split").aggregate([("pair_id", "count")]).to_pylist()
            counts = {row["split"]: row["pair_id_count"] for row in splits}
            paths = {"pairs": pairs_path(config), **chosen}
        else:
            paths = data_stage.run(replace(config.data, out_dir=str(layout(config).data)))
            counts = read_json(paths["summary"])["per_split"]
            table = None
        for split in ("train", "audit", "test"):
            if not counts.get(split):
                raise ContractError(f"{paths['pairs']} has no {split!r} rows; the pipeline needs train, audit and test")
        if log is not None:
            log.log_metrics({f"pairs_{split}": n for split, n in counts.items()})
            log.log_dataset(read_pairs(paths["pairs"]) if table is None else table, paths["pairs"], "pairs", "training")
            if windowed:
                window.log_window(log, paths["window"])
        return paths

    windowed = config.pairs_window is not None  # the step's params name the dataset and the window too
    params = (
        {"data": config.data, "pairs": config.pairs, "pairs_window": config.pairs_window} if windowed else config.data
    )
    return pipeline_run(config, caller).once("validate", params, work)


def build_teacher(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """The base teacher warmed up with SFT (or the given base_teacher as is); then the prior gate on it
    (pipelines.ads.teacher.gate), checked on every call so a rerun with another threshold needs no new SFT."""
    report = layout(config).sft / "teacher_report.json"
    reused = teacher_registry.reuse_step(config, pipeline_run(config, caller), layout(config), pairs_path(config))
    if reused is not None:  # a registered teacher (teacher_reuse.source) passed the reuse rule: no SFT
        return reused

    def work(log: StageRun | None) -> dict[str, Any]:
        if config.base_teacher:
            return {"model": Path(config.base_teacher)}
        paths = teacher_stage.run(
            replace(config.teacher, pairs=str(pairs_path(config)), out_dir=str(layout(config).sft))
        )
        if log is not None:
            figures = read_json(report)
            curve = [{f"sft/{k}": v for k, v in row.items()} for row in figures.pop("sft_curve")]
            log.log_step_metrics(curve, step_key="sft/step")
            log.log_metrics(figures)
            log.log_artifact(report)
            log.log_artifact(paths["curve"])
        return paths

    paths = pipeline_run(config, caller).once("teacher", config.teacher, work)
    if not config.base_teacher:
        figures = read_json(report)
        failure = judge_sft_teacher(figures, report, config.min_balanced_margin)
        if failure:
            skip_teacher(
                layout(config).teacher_skipped,
                "teacher",
                f"SFT teacher: {failure} ({teacher_stage.ranking_note(figures)})",
            )
    layout(config).teacher_skipped.unlink(missing_ok=True)  # passed: a record of an earlier verdict is stale
    return paths


def teacher_skipped(config: AdsPipelineConfig) -> dict[str, Any] | None:
    """{step, reason} when this run's teacher failed a gate (its record), else None."""
    return skipped_record(layout(config).teacher_skipped)


def train(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """Teacher RL with the configured algorithm; step metrics go to MLflow as it trains (every
    ``tracking.live_every`` steps) and the trained teacher becomes the run's LoggedModel ``teacher``."""
    if (reused := teacher_registry.reused_outputs(layout(config))) is not None:
        return reused  # the reused teacher: no RL
    train_config = replace(
        config.train,
        pairs=str(pairs_path(config)),
        base_model=str(teacher_dir(config)),
        out_dir=str(layout(config).rl),
        rl_share=config.teacher.rl_share,
    )

    def work(log: StageRun | None) -> dict[str, Any]:
        with live_metrics(log, Path(train_config.out_dir) / "metrics.jsonl", config.tracking.live_every):
            paths = train_stage.run(train_config)
        if log is not None:
            summary = read_json(paths["summary"])
            keys = ("algorithm", "steps", "base_model", "prompt_version", "answer_format")
            params = {k: summary.get(k) for k in keys}
            # the teacher as a LoggedModel of this run; the summary's audit figures become its metrics
            log_training(log, paths, model_id=log.log_model(paths["model"], "teacher", params))
        return paths

    return pipeline_run(config, caller).once("train", train_config, work)


def gate(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """Skip the teacher when the trained one may not label (pipelines.ads.teacher.gate: accuracy, one grade, the
    class prior): the run goes on without annotation (teacher.gate's ``skip_teacher``)."""

    def work(log: StageRun | None) -> dict[str, Any]:
        summary_path = layout(config).rl / "summary.json"
        gates = teacher_registry.gate_settings(config)
        figures, failure = judge_teacher(read_json(summary_path), summary_path, *gates)
        if log is not None:
            log.log_metrics(figures)
            log.set_tags({"gate": "failed" if failure else "passed"})
        if failure:  # the step stays unfinished: a rerun with another threshold judges again
            raise GateFailed(failure)
        teacher_registry.check_reused(log, layout(config))  # a trained teacher is registered by the register step
        return {"summary": summary_path}

    params = {
        "gate_metric": config.gate_metric,
        "min_audit_accuracy": config.min_audit_accuracy,
        "max_predicted_share": config.max_predicted_share,
        "min_balanced_margin": config.min_balanced_margin,
    }
    try:
        outputs = pipeline_run(config, caller).once("gate", params, work)
    except GateFailed as failed:
        skip_teacher(layout(config).teacher_skipped, "gate", str(failed))
    layout(config).teacher_skipped.unlink(missing_ok=True)  # passed: a record of an earlier verdict is stale
    return outputs


def partition_shards(config: AdsPipelineConfig, caller: Caller = CLI) -> list[int]:
    """Validate and split the pairs to annotate; returns the shard numbers (the DAG maps over them)."""
    split_config = annotate_config(config)

    def work(log: StageRun | None) -> dict[str, Any]:
        manifest = annotate_stage.partition_input(split_config, caller.try_number)
        if log is not None:
            log.log_metrics({"rows_in": manifest["rows_in"], "quarantined": manifest["quarantined"]})
        return {"partition": Path(split_config.out_dir) / "partition"}

    pipeline_run(config, caller).once("partition", split_config.input, work)
    return list(range(split_config.num_shards))


def annotate_shard(config: AdsPipelineConfig, shard: int, caller: Caller = CLI) -> dict[str, str]:
    """Label one shard (resumes at its first uncommitted chunk after a kill)."""
    shard_config = replace(annotate_config(config), shards=(shard,))

    def work(log: StageRun | None) -> dict[str, Any]:
        started = time.perf_counter()
        rows = read_manifest(Path(shard_config.out_dir) / "partition")["shard_rows"][shard]
        with progress_bar(total=rows, desc=f"annotate shard {shard}", unit="pair", mininterval=1.0) as bar:
            manifest = annotate_stage.ShardLabeler(shard_config, caller.try_number).label_shard(shard, bar)
        if log is not None:
            seconds = time.perf_counter() - started
            log.log_metrics(
                {"labels": manifest["labels"]["rows"], "review": manifest["review"]["rows"], "seconds": seconds}
            )
        return {"shard_manifest": Path(shard_config.out_dir) / "shards" / f"{shard_name(shard)}.json"}

    return pipeline_run(config, caller).once(f"annotate-shard-{shard}", shard_config, work)


def merge(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """Row accounting over all shards, the quality report, the labels dataset."""
    merge_config = annotate_config(config)

    def work(log: StageRun | None) -> dict[str, Any]:
        paths = merge_annotation(merge_config, attempt=caller.try_number)
        if log is not None:
            report = read_json(paths["report"])
            agreement = report.get("gold_agreement") or {}
            gold = {f"gold_{k}": v for k, v in agreement.items() if k in ("accuracy", "macro_f1")}
            log.log_metrics(
                {
                    **report["counts"],
                    "review_rate": report["review_rate"],
                    "mean_confidence": report["mean_confidence"],
                    **gold,
                }
            )
            for name in ("report", "plot", "summary"):
                if name in paths:
                    log.log_artifact(paths[name])
            log.log_dataset(pq.read_table(paths["labels"]), paths["labels"], "teacher_labels", "training")
        return paths

    return pipeline_run(config, caller).once("merge", merge_config, work)


def student_config(config: AdsPipelineConfig) -> DistilConfig:
    """The run's distil config (``distil_config``); with the teacher skipped, on the gold train pairs alone."""
    stage_config = distil_config(config)
    if teacher_skipped(config) is None:
        return stage_config
    return replace(stage_config, label_source="train-gold", review_gold=None)


def distil(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """The student from the gold train pairs and the teacher's labels (checkpointed every epoch); from the
    gold train pairs alone when the teacher was skipped."""
    stage_config = student_config(config)

    def work(log: StageRun | None) -> dict[str, Any]:
        paths = distil_stage.run(stage_config)
        if log is not None:
            summary = read_json(paths["summary"])
            log.log_step_metrics(summary["history"], step_key="epoch")
            by_source = {f"training_pairs_{k}": v for k, v in summary["training_pairs_by_source"].items()}
            log.log_metrics({"best_epoch": summary["best_epoch"], "best_val": summary["best_val"], **by_source})
            log.set_tags({"student_kind": summary["kind"], "shipped": summary["shipped"]})
            log.log_artifact(paths["summary"])
        return paths

    return pipeline_run(config, caller).once("distil", stage_config, work)


def builds_gold_only_student(config: AdsPipelineConfig) -> bool:
    """Whether the evaluate step trains the gold-only student: asked for, the run's student learns from
    teacher labels (else it is the gold-only student already), and the pairs have gold train grades."""
    if not config.gold_student or student_config(config).label_source in ("train-gold", "gold"):
        return False
    train = read_pairs(pairs_path(config), split="train")
    return train.num_rows > train["gold_grade"].null_count


def evaluate(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """The gold-only student (the same recipe on the gold train pairs alone: the team's no-teacher option),
    then the run's student, it and the baselines on the gold test split, with bootstrap intervals of every
    difference (pipelines.ads.distillation.evaluate)."""
    root = layout(config)
    gold_only = builds_gold_only_student(config)
    evaluate_config = replace(
        config.evaluate,
        model=str(root.student / "model"),
        pairs=str(pairs_path(config)),
        out_dir=str(root.student / "eval"),
        compare_with={GOLD_ONLY: str(root.gold_only / "model")} if gold_only else {},
    )

    def work(log: StageRun | None) -> dict[str, Any]:
        if gold_only:
            distil_stage.run(
                replace(distil_config(config), label_source="train-gold", review_gold=None, out_dir=str(root.gold_only))
            )
        paths = evaluate_stage.run(evaluate_config)
        report = read_json(paths["metrics"])
        write_model_cards(report, {STUDENT: root.student / "model", GOLD_ONLY: root.gold_only / "model"})
        students = {STUDENT: root.student / "model"} | ({GOLD_ONLY: root.gold_only / "model"} if gold_only else {})
        paths["evidence"] = bind_evidence(evaluate_config, report, students)
        if log is not None:
            log.log_metrics(report)
            log.log_metrics(evaluation_figures(report))
            for name in ("metrics", "comparison", "differences", "confusion", "reliability", "ranking"):
                if name in paths:
                    log.log_artifact(paths[name])
        return paths

    params = {**to_dict(evaluate_config), "gold_student": config.gold_student}
    return pipeline_run(config, caller).once("evaluate", params, work)


def write_model_cards(report: dict[str, Any], model_dirs: dict[str, Path]) -> None:
    """A Hugging Face model card (``README.md``) in each scored student's folder, with its gold test metrics
    beside the baselines' (pipelines.ads.serving.student_model.write_model_readme)."""
    from pipelines.ads.serving.student_model import write_model_readme  # imports mlflow: only once a run evaluates

    models, baselines = report.get("models") or {}, baseline_figures(report)
    for name, folder in model_dirs.items():
        if name in models and (folder / "config.json").is_file():
            figures = {k: v for k, v in models[name].items() if isinstance(v, int | float)}
            write_model_readme(folder, figures, baselines)


def register(config: AdsPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    """Under the registration lock (pipelines.ads.serving.registry: one for every registering host, never in
    ``out_dir``), check the evaluation's evidence, apply the champion rule (evaluation.comparison) to
    it, log the student (and the candidate) as an MLflow LoggedModel with its card and test metrics
    (pipelines.ads.serving.student_model), register the candidate, check the stored copy against the evidence and
    promote it if it beats the champion on the same test rows (a champion measured on other pairs is scored on
    this run's), then register the teacher that passed the gate (pipelines.ads.serving.teacher_registry); the
    decision, its reason and, when the teacher was skipped, why, go to ``registration.json``, to tags of the stage
    run and the model version, and to the run's page (``report.html``: pipelines.ads.distillation.report_page)."""
    root = layout(config)
    metrics_path = root.student / "eval" / "metrics.json"
    run_tracker = pipeline_run(config, caller).tracker()

    def work(log: StageRun | None) -> dict[str, Any]:
        record = root.student / "registration.json"
        if log is None:  # an earlier try finished the stage run, which it ends after writing the record: keep it
            fix = "an earlier try registered this run; start a new run to register again"
            decision = read_json(require_file(record, "registration record", fix, StageFailed))
            report = read_json(metrics_path)  # what the page and the parent run show again
        else:
            model_dirs = {STUDENT: root.student / "model", GOLD_ONLY: root.gold_only / "model"}
            # how evaluate scored the models: a champion measured on other test pairs is scored on these
            scored_on = replace(config.evaluate, pairs=str(pairs_path(config)), out_dir=str(metrics_path.parent))
            # one lock for every registering host and run, whatever its out_dir (registry.lock_folder)
            with registration_lock(run_tracker.config) as lock:
                # under the lock: what is copied and registered next is what evaluate left (the copy is checked too)
                evidence = verified_evidence(metrics_path.parent)
                report = evidence["report"]  # parsed from the bytes just checked
                pairs = evidence["test_pairs_sha256"]
                decision = {"teacher_skipped": teacher_skipped(config), "test_pairs_sha256": pairs}
                plots = [metrics_path.parent / name for name in evidence.get("plots", {})]  # verified: evaluate's own
                decision |= register_champion(
                    run_tracker, log, report, model_dirs, pairs, plots, evidence, scored_on, lock
                )
            skipped = decision["teacher_skipped"]  # a trained teacher that passed the gate: registered
            decision |= teacher_registry.register_teacher(config, log, root, pairs_path(config), skipped)
            log_decision(log, decision)
        path = write_json_atomic(record, decision)
        files = report_files(config, teacher_registry.gate_settings(config))
        summarise_parent(files, report, decision, run_tracker)
        paths = {"registration": path, "report": publish_report(files, report, decision, run_tracker, log)}
        print_summary(f"register: {champion_line(decision)}", paths)
        return paths

    params = {"registered_model": config.tracking.registered_model, "champion_metric": config.tracking.champion_metric}
    outputs = pipeline_run(config, caller).once("register", params, work)
    run_tracker.finish()
    return outputs


def run(config: AdsPipelineConfig, caller: Caller | None = None) -> dict[str, str]:
    """Every step in order, in this process (what the DAG does across tasks); a teacher below a gate skips
    the rest of the teacher path (RL, annotation, merge) and the run goes on with the gold-only student."""
    caller = caller or Caller(dag_run_id=config.run_id)
    started = time.perf_counter()
    validate(config, caller)
    try:
        build_teacher(config, caller)
        train(config, caller)
        gate(config, caller)
        for shard in partition_shards(config, caller):
            annotate_shard(config, shard, caller)
        merge(config, caller)
    except StepSkipped as skipped:
        print_summary(f"teacher skipped: {skipped}", {"record": layout(config).teacher_skipped})
    distil(config, caller)
    evaluate(config, caller)
    outputs = register(config, caller)
    decision = read_json(outputs["registration"])
    print_summary(
        f"pipeline run {config.run_id}: done in {time.perf_counter() - started:.0f} s; {champion_line(decision)}",
        {"run folder": layout(config).root, **{name: Path(path) for name, path in outputs.items()}},
    )
    return outputs
