"""Stage ``agpo train-compare``: train the same SFT teacher with several algorithms at an equal
generated-token budget and print one comparison table (ALGORITHMS.md section 5: compare at equal budget).

Each algorithm runs the ``agpo train`` stage into ``out_dir/<algorithm>``; ``comparison.json`` and
``comparison.md`` gather audit accuracy (sampled pass@1, maj@n, greedy) before and after, tokens and time.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from agpo.adaptive import algorithm_names
from pipelines.ads.train import TrainTeacherConfig
from pipelines.ads.train import run as train_teacher
from pipelines.io import print_summary, write_atomic, write_json_atomic


@dataclass(frozen=True)
class CompareConfig:
    """The shared training run and the algorithms to compare."""

    out_dir: str = field(default="work/compare", metadata={"help": "one sub-folder per algorithm, plus the table"})
    algorithms: tuple[str, ...] = field(default=("grpo", "agpo", "adaptive_agpo"), metadata={"help": "algorithms"})
    token_budget: int = field(default=40_000, metadata={"help": "generated tokens per algorithm (probes count)"})
    advantage_params: dict[str, dict[str, object]] = field(
        default_factory=dict, metadata={"help": "per-algorithm estimator parameters, e.g. {agpo: {lambda_neg: 1.0}}"}
    )
    train: TrainTeacherConfig = field(default_factory=TrainTeacherConfig, metadata={"help": "the shared run"})

    def __post_init__(self) -> None:
        unknown = [a for a in self.algorithms if a not in algorithm_names()]
        if unknown or not self.algorithms:
            raise ValueError(f"algorithms must name known algorithms ({', '.join(algorithm_names())}), got {unknown}")
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be >= 1, got {self.token_budget}")


def run(config: CompareConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    rows = []
    for algorithm in config.algorithms:
        # Everything but the algorithm is shared, so the comparison isolates the advantage rule.
        trainer = dataclasses.replace(
            config.train.trainer,
            algorithm=algorithm,
            advantage_params=config.advantage_params.get(algorithm, {}),
            token_budget=config.token_budget,
            max_steps=max(config.train.trainer.max_steps, 10_000),
        )
        run_config = dataclasses.replace(config.train, trainer=trainer, out_dir=str(out / algorithm))
        paths = train_teacher(run_config)
        rows.append(json.loads(paths["summary"].read_text()))
    samples = config.train.audit_samples
    header = (
        f"| algorithm | audit acc (sampled) | audit maj@{samples} | audit acc (greedy) | steps | generated tokens | s |"
    )
    lines = [
        f"Teacher RL at an equal budget of {config.token_budget:,} generated tokens, same SFT start "
        f"({config.train.base_model}); start -> end on {config.train.audit_examples} audit pairs.",
        "",
        header,
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['audit_accuracy_start']:.3f} -> {r['audit_accuracy_end']:.3f} "
            f"| {r[f'audit_maj@{samples}_start']:.3f} -> {r[f'audit_maj@{samples}_end']:.3f} "
            f"| {r['audit_greedy_accuracy_start']:.3f} -> {r['audit_greedy_accuracy_end']:.3f} "
            f"| {r['steps']} | {r['generated_tokens']:,} | {r['seconds']} |"
        )
    table = "\n".join(lines) + "\n"
    paths = {
        "table": write_atomic(out / "comparison.md", table),
        "results": write_json_atomic(out / "comparison.json", rows),
    }
    print_summary(table, paths)
    return paths
