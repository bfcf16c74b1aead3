"""Stage ``agpo study rl-split``: does the teacher's RL learn more on pairs SFT has not fitted?

For each ``rl_shares`` value s and each seed, the pipeline's teacher steps run on the same pairs: SFT on the
gold train queries outside the RL part (s = 0: all of them), then RL on the RL part (s = 0: all of them
again, the pairs SFT just fitted). Both are graded on the same audit pairs, greedy (what score-mode
annotation labels with): accuracy, balanced accuracy and per-grade recall after SFT (the RL stage's start)
and after RL (its end), and per step the share of RL groups with no signal (all samples right, all wrong).
The prior gate is recorded, not enforced: the study is about what RL does to the teacher either way.

Writes ``results.json`` (every run) and ``rl_split.md`` (mean ± sd over seeds per share) into ``out_dir``,
beside one pipeline run folder per (share, seed); finished steps are not run again.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.pipeline_config import layout, study_run
from pipelines.ads.teacher.relevance_reward import ESCI_GRADES
from pipelines.errors import StepSkipped
from pipelines.experiments.rl_split_config import RLSplitConfig
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.steps import Caller

FIGURES = {
    "audit_greedy_accuracy": "accuracy",
    "audit_balanced_accuracy": "balanced accuracy",
    **{f"audit_recall/g{g}": f"recall {g}" for g in ESCI_GRADES},
}


def run_one(config: RLSplitConfig, share: float, seed: int) -> dict[str, Any]:
    """SFT then RL of one (share, seed): the RL summary's start and end figures and the group shares."""
    base = replace(config.pipeline, teacher=replace(config.pipeline.teacher, rl_share=share))
    pipeline = study_run(base, f"share-{share:g}-s{seed}", Path(config.out_dir) / "runs", seed, config.experiment)
    caller = Caller(dag_run_id=pipeline.run_id)
    ads_pipeline.validate(pipeline, caller)
    try:
        ads_pipeline.build_teacher(pipeline, caller)
        gate = "passed"
    except StepSkipped as failure:  # a teacher below a gate: the pipeline skips it
        gate = str(failure)
    ads_pipeline.train(pipeline, caller)
    summary = json.loads((layout(pipeline).rl / "summary.json").read_text())
    report = json.loads((layout(pipeline).sft / "teacher_report.json").read_text())
    row = {"rl_share": share, "seed": seed, "sft_gate": gate, "sft_examples": report["sft_examples"]}
    for key in FIGURES:
        row.update({f"{key}_{edge}": summary.get(f"{key}_{edge}") for edge in ("start", "end")})
    row.update({k: summary.get(k) for k in ("all_correct_frac_mean", "all_wrong_frac_mean", "seconds")})
    return row


def table(rows: list[dict[str, Any]], shares: tuple[float, ...]) -> str:
    """Mean ± sample sd over seeds, per share: every figure after SFT and after RL, and the group shares."""
    keys = [
        (f"{k}_{edge}", f"{t} after {'SFT' if edge == 'start' else 'RL'}")
        for edge in ("start", "end")
        for k, t in FIGURES.items()
    ]
    keys += [("all_correct_frac_mean", "RL groups all right"), ("all_wrong_frac_mean", "RL groups all wrong")]
    header = "| figure | " + " | ".join(f"rl_share {s:g}" for s in shares) + " |"
    lines = [header, "|---|" + "---:|" * len(shares)]
    for key, title in keys:
        cells = []
        for share in shares:
            values = np.array([r[key] for r in rows if r["rl_share"] == share and r[key] is not None], dtype=float)
            sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
            cells.append(f"{values.mean():.3f} ± {sd:.3f}" if len(values) else "n/a")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(config: RLSplitConfig) -> dict[str, Path]:
    out = Path(config.out_dir)
    rows = [run_one(config, share, seed) for share in config.rl_shares for seed in config.seeds]
    markdown = table(rows, config.rl_shares)
    paths = {
        "results": write_json_atomic(out / "results.json", {"runs": rows}),
        "table": write_atomic(out / "rl_split.md", markdown),
    }
    print(markdown, end="")
    print_summary(f"rl-split study: shares {list(config.rl_shares)}, seeds {list(config.seeds)}", paths)
    return paths
