"""The ``agpo`` command: one subcommand per pipeline stage.

Each stage is a module with a config dataclass and ``run(config) -> dict of written paths``. Every
subcommand takes ``--config FILE.yaml`` and repeatable ``--set key.sub=value`` overrides, prints the
resolved config with ``--print-config``, and lists every config key with its help in ``--help``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import yaml

from durable.checkpoint import CheckpointError
from pipelines.ads.contracts import ContractError
from pipelines.config import ConfigError, describe, load_config, to_dict
from pipelines.launch import die_with_parent, under_torchrun


@dataclass(frozen=True)
class Stage:
    module: str
    config_class: str
    summary: str

    def load(self) -> tuple[type, Callable[[object], dict]]:
        module = importlib.import_module(self.module)
        return getattr(module, self.config_class), module.run


STAGES: dict[str, Stage] = {
    "data": Stage("pipelines.ads.data", "DataConfig", "write the embedded synthetic query-ad pairs (Parquet)"),
    "teacher": Stage("pipelines.ads.teacher", "TeacherConfig", "build the tiny base teacher and warm it up with SFT"),
    "train": Stage("pipelines.ads.train", "TrainTeacherConfig", "train the teacher with RL (agpo, grpo, ...)"),
    "annotate": Stage(
        "pipelines.ads.annotate", "AnnotateConfig", "label query-ad pairs with the teacher, in resumable shards"
    ),
    "annotate-robustness": Stage(
        "pipelines.ads.annotate_robustness",
        "RobustnessConfig",
        "measure whether instructions inside ad text move the labels",
    ),
    "distil": Stage(
        "pipelines.ads.distil", "DistilConfig", "distil the student from the teacher's labels (checkpointed, ONNX)"
    ),
    "evaluate": Stage(
        "pipelines.ads.evaluate", "EvaluateConfig", "score a student on gold test pairs (relevance metrics, plots)"
    ),
    "compare-students": Stage(
        "pipelines.ads.compare_students",
        "StudentProtocolConfig",
        "train the same student on gold and on each teacher's labels; one table on gold test pairs",
    ),
    "pipeline": Stage(
        "pipelines.ads.pipeline",
        "AdsPipelineConfig",
        "the whole ads pipeline in this process (what the ads_relevance_agpo DAG runs), tracked in MLflow",
    ),
    "compare": Stage(
        "pipelines.experiments.compare", "CompareRunsConfig", "compare the pipeline runs of an MLflow experiment"
    ),
    "math-pipeline": Stage(
        "pipelines.math.pipeline", "MathPipelineConfig", "math RL then pass@k evaluation (what the math_rlvr DAG runs)"
    ),
    "math-train": Stage(
        "pipelines.math.train",
        "MathTrainConfig",
        "RL on verifiable math (synthetic arithmetic or GSM8K / MATH / CMATH)",
    ),
    "math-compare": Stage(
        "pipelines.math.compare", "MathCompareConfig", "algorithms x seeds from one base at equal token budget: pass@k"
    ),
    "math-eval": Stage(
        "pipelines.math.eval", "MathEvalConfig", "sample n solutions per math problem: pass@k, maj@k, per subject/level"
    ),
    "train-compare": Stage(
        "pipelines.experiments.train_compare",
        "CompareConfig",
        "train the teacher with several algorithms at equal budget",
    ),
    "toy": Stage(
        "pipelines.experiments.toy",
        "ToyCompareConfig",
        "compare the advantage estimators on a controlled toy policy at equal token budget",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agpo",
        description="Asymmetric AGPO: teacher RL, annotation and student distillation for ads relevance.",
    )
    subparsers = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    for name, stage in STAGES.items():
        config_class, _ = stage.load()
        sub = subparsers.add_parser(
            name,
            help=stage.summary,
            description=stage.summary,
            epilog="config keys (default): help\n" + "\n".join(describe(config_class)),
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
        sub.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        if name == "compare":
            sub.add_argument("--experiment", help="MLflow experiment to compare (same as --set experiment=NAME)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    if under_torchrun():
        die_with_parent()  # a rank never outlives its torchrun (pipelines.launch)
    # transformers imports DeepSpeed (when installed) to save models; on a machine without a GPU tell it so,
    # instead of letting it warn on every run
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    args = build_parser().parse_args(argv)
    config_class, run = STAGES[args.stage].load()
    try:
        overrides = args.overrides + ([f"experiment={args.experiment}"] if getattr(args, "experiment", None) else [])
        config = load_config(config_class, args.configs, overrides)
    except ConfigError as err:
        print(f"agpo {args.stage}: config error: {err}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(to_dict(config), sort_keys=False), end="")
        return 0
    try:
        run(config)
    except (ContractError, FileNotFoundError, CheckpointError, ImportError) as err:  # say what, not a traceback
        print(f"agpo {args.stage}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
