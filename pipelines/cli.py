"""The ``agpo`` command: one subcommand per pipeline stage.

Each stage is a module with a config dataclass and ``run(config) -> dict of written paths``. Every
subcommand takes ``--config FILE.yaml`` and repeatable ``--set key.sub=value`` overrides, prints the
resolved config with ``--print-config`` (secrets masked as MLflow's params leave them out:
pipelines.config.public_params), and lists every config key with its help in ``--help``.

Help is fast: printing it imports no stage module (they import torch, seconds of start-up). The config keys
that ``agpo STAGE --help`` lists come from ``pipelines/stage_help.json``, written from the config classes by
``python -m pipelines.cli --write-help`` and checked against them by the tests. ``--print-config`` and config
errors are fast too: a stage's config class lives in a light module (``Stage.config_module``, e.g.
pipelines/ads/annotation/annotate_config.py) that imports no torch, transformers, scikit-learn or mlflow; the stage
module, and torch, are imported only when the stage runs.

``agpo data import ...`` is an alias of ``agpo data-import ...``, ``agpo review export|import ...`` of
``agpo review-export|review-import ...`` (``main`` rewrites the argv).

Exit codes: 0 success; 2 a usage or config error (unknown key, bad value, a value that is not plain YAML
such as a tag: nothing ran); 1 the stage ran and failed. An expected failure (pipelines.errors.StageFailed
such as a file that breaks its contract, a missing input, a checkpoint that cannot be resumed, an optional
package that is not installed) prints its message without a traceback; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from pipelines.config import ConfigError, describe, load_config, public_params, to_dict
from pipelines.devices import DeviceUnavailable, check_devices
from pipelines.errors import StageFailed
from pipelines.launch import die_with_parent, under_torchrun
from pipelines.logs import configure_logging
from pipelines.runs import RUN_ENV, check_run_agrees
from pipelines.steps import check_path_name
from pipelines.threads import prepare_openmp

HELP_CATALOGUE = Path(__file__).with_name("stage_help.json")
USAGE_ERROR, STAGE_FAILED = 2, 1
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)  # the volume, not the code, failed


@dataclass(frozen=True)
class Stage:
    """A subcommand: ``module`` defines ``run(config)``; ``config_module`` defines ``config_class`` and imports
    no torch, so resolving and printing the config never waits for the stage's imports."""

    module: str
    config_module: str
    config_class: str
    summary: str

    def config(self) -> type:
        return getattr(importlib.import_module(self.config_module), self.config_class)

    def runner(self) -> Callable[[object], dict]:
        return importlib.import_module(self.module).run


STAGES: dict[str, Stage] = {
    "data": Stage(
        "pipelines.ads.intake.data",
        "pipelines.ads.intake.data",
        "DataConfig",
        "write the embedded synthetic query-ad pairs (Parquet)",
    ),
    "data-import": Stage(
        "pipelines.ads.intake.data_import",
        "pipelines.ads.intake.data_import_config",
        "DataImportConfig",
        "import your own labeled pairs (CSV/TSV/Parquet/JSONL, ESCI, Home Depot), split by query; "
        "also `agpo data import`",
    ),
    "teacher": Stage(
        "pipelines.ads.teacher.warm_start",
        "pipelines.ads.teacher.warm_start_config",
        "TeacherConfig",
        "build the tiny base teacher and warm it up with SFT",
    ),
    "train": Stage(
        "pipelines.ads.teacher.train",
        "pipelines.ads.teacher.train_config",
        "TrainTeacherConfig",
        "train the teacher with RL (agpo, grpo, ...)",
    ),
    "annotate": Stage(
        "pipelines.ads.annotation.annotate",
        "pipelines.ads.annotation.annotate_config",
        "AnnotateConfig",
        "label query-ad pairs with the teacher, in resumable shards",
    ),
    "review-export": Stage(
        "pipelines.ads.annotation.review_export",
        "pipelines.ads.annotation.review_export",
        "ReviewExportConfig",
        "write the review queue as Label Studio tasks and labeling config; also `agpo review export`",
    ),
    "review-import": Stage(
        "pipelines.ads.annotation.review_import",
        "pipelines.ads.annotation.review_import_config",
        "ReviewImportConfig",
        "read a Label Studio JSON export back: human gold labels, teacher agreement; also `agpo review import`",
    ),
    "annotate-robustness": Stage(
        "pipelines.ads.studies.annotate_robustness",
        "pipelines.ads.studies.annotate_robustness_config",
        "RobustnessConfig",
        "measure whether instructions inside ad text move the labels",
    ),
    "distil": Stage(
        "pipelines.ads.distillation.distil",
        "pipelines.ads.distillation.distil_config",
        "DistilConfig",
        "distil the student from the teacher's labels (checkpointed, ONNX)",
    ),
    "evaluate": Stage(
        "pipelines.ads.distillation.evaluate",
        "pipelines.ads.distillation.evaluate_config",
        "EvaluateConfig",
        "score a student on gold test pairs (relevance metrics, plots)",
    ),
    "score": Stage(
        "pipelines.ads.serving.score",
        "pipelines.ads.serving.score_config",
        "ScoreConfig",
        "grade a file of query-ad pairs with a student, in resumable shards",
    ),
    "serve": Stage(
        "pipelines.ads.serving.serve",
        "pipelines.ads.serving.serve_config",
        "ServeConfig",
        "serve the champion (or a student folder) over REST on 127.0.0.1 with MLflow's scoring server",
    ),
    "compare-students": Stage(
        "pipelines.ads.studies.compare_students",
        "pipelines.ads.studies.compare_students_config",
        "StudentProtocolConfig",
        "train the same student on gold and on each teacher's labels; one table on gold test pairs",
    ),
    "pipeline": Stage(
        "pipelines.ads.pipeline",
        "pipelines.ads.pipeline_config",
        "AdsPipelineConfig",
        "the whole ads pipeline in this process (what the ads_relevance_agpo DAG runs), tracked in MLflow",
    ),
    "scarce-gold": Stage(
        "pipelines.ads.studies.scarce_gold",
        "pipelines.ads.studies.scarce_gold_config",
        "ScarceGoldConfig",
        "students from gold only, teacher labels and both against the gold budget N; also `agpo study scarce-gold`",
    ),
    "real-text": Stage(
        "pipelines.ads.studies.real_text",
        "pipelines.ads.studies.real_text_config",
        "RealTextConfig",
        "every student kind and the baselines on team-sized exports of real query-product text, against gold "
        "size; also `agpo study real-text`",
    ),
    "rl-split": Stage(
        "pipelines.experiments.rl_split",
        "pipelines.experiments.rl_split_config",
        "RLSplitConfig",
        "the teacher's audit figures after SFT and after RL, with RL on held-out queries or on all; "
        "also `agpo study rl-split`",
    ),
    "compare": Stage(
        "pipelines.experiments.compare",
        "pipelines.experiments.compare",
        "CompareRunsConfig",
        "compare the pipeline runs of an MLflow experiment",
    ),
    "math-pipeline": Stage(
        "pipelines.math.math_pipeline",
        "pipelines.math.math_pipeline_config",
        "MathPipelineConfig",
        "math RL then pass@k evaluation (what the math_rlvr DAG runs)",
    ),
    "math-train": Stage(
        "pipelines.math.math_train",
        "pipelines.math.math_train_config",
        "MathTrainConfig",
        "RL on verifiable math (synthetic arithmetic or GSM8K / MATH / CMATH)",
    ),
    "math-compare": Stage(
        "pipelines.math.math_compare",
        "pipelines.math.math_compare_config",
        "MathCompareConfig",
        "algorithms x seeds from one base at equal token budget: pass@k",
    ),
    "math-eval": Stage(
        "pipelines.math.math_eval",
        "pipelines.math.math_eval_config",
        "MathEvalConfig",
        "sample n solutions per math problem: pass@k, maj@k, per subject/level",
    ),
    "train-compare": Stage(
        "pipelines.experiments.train_compare",
        "pipelines.experiments.train_compare_config",
        "CompareConfig",
        "train the teacher with several algorithms at equal budget",
    ),
    "toy": Stage(
        "pipelines.experiments.toy",
        "pipelines.experiments.toy_config",
        "ToyCompareConfig",
        "compare the advantage estimators on a controlled toy policy at equal token budget",
    ),
}


def help_catalogue() -> dict[str, list[str]]:
    """Every stage's config keys, ``key (default): help``, read from its config class (imports every stage's
    config module, none of the stages)."""
    return {name: describe(stage.config()) for name, stage in STAGES.items()}


def write_help_catalogue() -> Path:
    HELP_CATALOGUE.write_text(json.dumps(help_catalogue(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return HELP_CATALOGUE


def package_version() -> str:
    try:
        return version("agpo-relevance")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agpo",
        description="Asymmetric AGPO: teacher RL, annotation and student distillation for ads relevance.",
        epilog="exit codes: 0 done, 1 the stage failed (its message says why), 2 usage or config error",
    )
    parser.add_argument("--version", action="version", version=f"agpo {package_version()}")
    subparsers = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    keys = json.loads(HELP_CATALOGUE.read_text(encoding="utf-8")) if HELP_CATALOGUE.is_file() else {}
    for name, stage in STAGES.items():
        sub = subparsers.add_parser(
            name,
            help=stage.summary,
            description=stage.summary,
            epilog="config keys (default): help\n" + "\n".join(keys.get(name, ["  (see --print-config)"])),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.add_argument(
            "--config",
            dest="configs",
            action="append",
            default=[],
            metavar="[SECTION=]FILE.yaml",
            help="YAML file with config keys (see below); repeatable, later files override earlier ones; "
            "SECTION=FILE.yaml mounts the file under a nested key",
        )
        sub.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one config key, dotted for nested keys (YAML value syntax); repeatable",
        )
        sub.add_argument(
            "--run",
            metavar="NAME",
            help="the run whose folders the default paths name: work/runs/NAME/... (default: $AGPO_RUN, else demo, "
            "what `make demo` writes); a pipeline's run_id (default: $AGPO_RUN, else local)",
        )
        sub.add_argument(
            "--print-config",
            action="store_true",
            help="print the resolved config and exit (secret-named keys and passwords in URLs as ***)",
        )
        if name == "compare":
            sub.add_argument("--experiment", help="MLflow experiment to compare (same as --set experiment=NAME)")
    return parser


def expected_failures() -> tuple[type[BaseException], ...]:
    """Failures whose message says what to do: printed without a traceback."""
    from durable.checkpoint import CheckpointError  # imports torch: only once a stage runs

    return StageFailed, CheckpointError, FileNotFoundError, ImportError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["data", "import"]:  # the spelled-out alias of the data-import stage
        argv = ["data-import", *argv[2:]]
    if argv[:2] in (["review", "export"], ["review", "import"]):  # likewise review-export, review-import
        argv = [f"review-{argv[1]}", *argv[2:]]
    if argv[:2] in (
        ["study", "scarce-gold"],
        ["study", "rl-split"],
        ["study", "real-text"],
    ):  # the studies, spelled out
        argv = argv[1:]
    if argv == ["--write-help"]:  # for developers: refresh pipelines/stage_help.json after a config change
        print(f"wrote {write_help_catalogue()}")
        return 0
    if under_torchrun():
        die_with_parent()  # a rank never outlives its torchrun (pipelines.launch)
    args = build_parser().parse_args(argv)
    stage = STAGES[args.stage]
    try:
        if args.run is not None:  # before the config is made: its default paths are the run's (pipelines.runs)
            check_path_name("--run", args.run)
            os.environ[RUN_ENV] = args.run
        overrides = args.overrides + ([f"experiment={args.experiment}"] if getattr(args, "experiment", None) else [])
        config = load_config(stage.config(), args.configs, overrides)
        check_run_agrees(args.run, config)  # a pipeline's run_id follows --run; an explicit other one is refused
    except (ConfigError, ValueError) as err:
        print(f"agpo {args.stage}: config error: {err}", file=sys.stderr)
        return USAGE_ERROR
    if args.print_config:
        print(yaml.safe_dump(public_params(to_dict(config), masked=True), sort_keys=False), end="")
        return 0
    configure_logging(args.stage)
    prepare_openmp()  # before torch loads libgomp: idle OpenMP threads sleep instead of spinning (pipelines.threads)
    import torch  # only once a stage runs: help, config printing and config errors never wait for it

    from agpo.distributed import end_process_group

    # transformers imports DeepSpeed (when installed) to save models; on a machine without a GPU tell it so,
    # instead of letting it warn on every run
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        check_devices(config)  # a GPU the machine lacks is a config error, before anything loads
    except DeviceUnavailable as err:
        print(f"agpo {args.stage}: config error: {err}", file=sys.stderr)
        return USAGE_ERROR
    run = stage.runner()
    try:
        run(config)
        end_process_group()  # a torchrun rank (pipelines.launch): its group's threads stopped before it exits
    except expected_failures() as err:
        print(f"agpo {args.stage}: error: {err}", file=sys.stderr)
        return STAGE_FAILED
    except OSError as err:
        if err.errno not in DISK_ERRORS:
            raise
        print(
            f"agpo {args.stage}: disk error: {err}; free space or fix the volume, then rerun the same command "
            "(committed work is kept, nothing half-written is read)",
            file=sys.stderr,
        )
        return STAGE_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
