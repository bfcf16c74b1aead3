"""The math RLVR pipeline as steps: what each task of the ``math_rlvr`` DAG runs.

    train (agpo math-train: RL on a math set with the chosen algorithm) -> evaluate (agpo math-eval:
    n samples per held-out or benchmark problem, pass@k and maj@k)

Outputs go under ``<out_dir>/<run_id>/`` (``train/``, ``eval/``); each step is idempotent and recorded as
a child run of the pipeline's MLflow parent run (pipelines.steps), with the trainer's step metrics, the
pass@k figures and the pass@k curve. ``run`` runs both in one process (``agpo math-pipeline``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pipelines import steps
from pipelines.config import to_dict
from pipelines.io import print_summary
from pipelines.math import math_eval as math_eval
from pipelines.math import math_train as math_train
from pipelines.math.math_pipeline_config import MathPipelineConfig
from pipelines.steps import CLI, Caller, PipelineRun, live_metrics, log_training, read_json
from pipelines.tracking import StageRun


def root(config: MathPipelineConfig) -> Path:
    return Path(config.out_dir) / config.run_id


AIRFLOW_PARAMS = {"dataset": "train.dataset", "path": "train.path", "samples": "evaluate.samples"}


def from_airflow(
    params: dict[str, Any], dag_id: str, dag_run_id: str, try_number: int
) -> tuple[MathPipelineConfig, Caller]:
    """The config of a DAG run from its params (presets, algorithm, dataset, samples, overrides)."""
    return steps.from_airflow(MathPipelineConfig, params, dag_id, dag_run_id, try_number, AIRFLOW_PARAMS)


def pipeline_run(config: MathPipelineConfig, caller: Caller) -> PipelineRun:
    tags = {"algorithm": config.train.trainer.algorithm, "dataset": config.train.dataset}
    return PipelineRun(root(config), config.run_id, config.tracking, caller, tags, to_dict(config))


def train(config: MathPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    train_config = replace(config.train, out_dir=str(root(config) / "train"))

    def work(log: StageRun | None) -> dict[str, Any]:
        with live_metrics(log, Path(train_config.out_dir) / "metrics.jsonl", config.tracking.live_every):
            paths = math_train.run(train_config)
        if log is not None:
            log_training(log, paths)
        return paths

    return pipeline_run(config, caller).once("train", train_config, work)


def evaluate(config: MathPipelineConfig, caller: Caller = CLI) -> dict[str, str]:
    eval_config = replace(
        config.evaluate, model=str(root(config) / "train" / "model"), out_dir=str(root(config) / "eval")
    )
    # the training task's held-out problems, or the benchmark file named by evaluate.dataset / evaluate.path
    held_out = math_train.problems_of(config.train)[1] if config.evaluate_heldout else None
    name = f"{config.train.dataset} (held out)" if config.evaluate_heldout else None

    def work(log: StageRun | None) -> dict[str, Any]:
        paths = math_eval.run(eval_config, problems=held_out, name=name)
        if log is not None:
            results = read_json(paths["results"])
            log.log_metrics({f"pass_at_{k}": v for k, v in results["pass_at_k"].items()})
            log.log_metrics({f"maj_at_{k}": v for k, v in results["maj_at_k"].items()})
            log.log_metrics({"mean_at_n": results["mean_at_n"], "unparseable": results["unparseable"]})
            log.log_artifact(paths["results"])
            log.log_artifact(paths["plot"])
        return paths

    outputs = pipeline_run(config, caller).once("evaluate", eval_config, work)
    pipeline_run(config, caller).tracker().finish()
    return outputs


def run(config: MathPipelineConfig, caller: Caller | None = None) -> dict[str, str]:
    caller = caller or Caller(dag_id="cli", dag_run_id=config.run_id)
    train(config, caller)
    outputs = evaluate(config, caller)
    results = read_json(outputs["results"])
    print_summary(f"math run {config.run_id}: pass@k {results['pass_at_k']}", {"run folder": root(config)})
    return outputs
