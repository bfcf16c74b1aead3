"""A pretrained teacher's SFT: every layer against the top N, full fine-tuning against LoRA, on the same pairs.

Writes synthetic pairs at a real-world grade skew (``--grade-weights``, default 15/10/30/45 % for grades
0..3, the shape of real sets where the top grade holds about half the pairs), then runs the ``agpo teacher``
stage four times from the same base model (default: the packaged SmolLM2-135M-Instruct) with the same data,
prompt, format and balance: fine-tuning every weight (``full``), LoRA adapters on every layer merged
afterwards (``lora``), and the same two on the top ``--trainable-layers`` decoder layers only
(``full_top``, ``lora_top``: backward stops at the lowest trained layer). Reports per run the seconds per
SFT step, the audit accuracy before and after, balanced accuracy, per-grade recall and the predicted-grade
shares (a collapsed teacher predicts one grade), from the stage's own report, and each run's step time
over ``full``'s.
RL trains the merged model in every case, so its step time does not depend on how SFT was done
(benchmarks/bench_smollm2_step.py times it).
Run: ``.venv/bin/python benchmarks/bench_teacher_sft.py`` (writes benchmarks/results/teacher_sft.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import machine, write_results

from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as write_pairs
from pipelines.ads.intake.synthetic import SyntheticConfig
from pipelines.ads.teacher.warm_start import TeacherConfig
from pipelines.ads.teacher.warm_start import run as build_teacher
from pipelines.config import from_dict

KEPT = (
    "sft_seconds_per_step",
    "sft_steps",
    "sft_final_loss",
    "trainable_parameters",
    "audit_accuracy_base",
    "audit_accuracy_sft",
    "audit_sft_balanced_accuracy",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-model", default="smollm2-135m-instruct")
    parser.add_argument("--examples", type=int, default=64, help="SFT train pairs")
    parser.add_argument("--audit", type=int, default=40, help="audit pairs graded before and after")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--answer-format", default="answer", choices=("answer", "reason"))
    parser.add_argument("--grade-weights", type=float, nargs=4, default=(0.15, 0.10, 0.30, 0.45))
    parser.add_argument("--full-lr", type=float, default=5e-5)
    parser.add_argument("--lora-lr", type=float, default=5e-4)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--trainable-layers", type=int, default=8, help="top layers trained by *_top runs")
    parser.add_argument("--prompt-version", default="relevance-v1", help="as configs/pipeline/small-lm.yaml")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        synthetic = SyntheticConfig(
            train=args.examples, audit=args.audit, unlabeled=8, test=8, grade_weights=tuple(args.grade_weights)
        )
        pairs = write_pairs(DataConfig(out_dir=f"{tmp}/data", synthetic=synthetic))["pairs"]
        common = {
            "pairs": str(pairs),
            "base_model": args.base_model,
            "answer_format": args.answer_format,
            "sft_examples": args.examples,
            "audit_examples": args.audit,
            "max_new_tokens": 8 if args.answer_format == "answer" else 32,
            "prompt_version": args.prompt_version,
        }
        sft = {"epochs": args.epochs, "batch_size": args.batch_size, "warmup_steps": 1}
        full = {"sft": {**sft, "learning_rate": args.full_lr}}
        lora = {
            "sft": {**sft, "learning_rate": args.lora_lr},
            "lora": {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank},
        }
        top = {"trainable_layers": args.trainable_layers}
        runs = {"full": full, "lora": lora, "full_top": full | top, "lora_top": lora | top}
        results = {}
        for name, settings in runs.items():
            config = from_dict(TeacherConfig, {**common, **settings, "out_dir": f"{tmp}/{name}"})
            report = json.loads(Path(build_teacher(config)["report"]).read_text())
            results[name] = {k: report[k] for k in KEPT} | {
                k: v for k, v in report.items() if k.startswith(("audit_sft_recall", "audit_sft_predicted"))
            }
    full_step = results["full"]["sft_seconds_per_step"]
    summary = {
        "settings": vars(args) | {"grade_weights": list(args.grade_weights)},
        "machine": machine(),
        "runs": results,
        "step_time_over_full": {
            name: round(row["sft_seconds_per_step"] / full_step, 3) for name, row in results.items()
        },
    }
    for name, row in results.items():
        print(
            f"{name}: {row['sft_seconds_per_step']} s/step, audit {row['audit_accuracy_base']:.3f} -> "
            f"{row['audit_accuracy_sft']:.3f} (balanced {row['audit_sft_balanced_accuracy']:.3f})"
        )
    print(f"SFT step time over full: {summary['step_time_over_full']}")
    write_results("teacher_sft", summary)


if __name__ == "__main__":
    main()
