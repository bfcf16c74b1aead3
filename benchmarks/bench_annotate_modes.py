"""Annotation modes: ``sample`` (majority of sampled votes) against ``score`` (the exact grade distribution).

Draws a synthetic set with the data stage (``--train`` labeled pairs, ``--pairs`` unlabeled pairs whose gold
stays hidden from the teacher), builds one base teacher per ``--answer-formats`` with the teacher stage (the
tiny Qwen2 SFT'd on ``--sft-examples`` train pairs for ``--sft-epochs`` epochs; ``reason``: it writes a
reason before ``<answer>k</answer>``, ``answer``: the tag alone) unless ``--teacher`` names a model
directory, then runs the annotate stage end to end on the unlabeled pairs in each ``voting.mode``: sample
with ``--votes`` votes (constrained, so no retries happen), score (one greedy reason per pair, none for an
answer-only teacher, then the grade endings teacher-forced). The modes alternate ``--repeats`` times, so a
shared machine's load skews both alike; times are medians. Reports per mode: pairs/s, label accuracy and
macro-F1 against the hidden gold (the stage's quality report), mean confidence, review rate and the gold
log-loss of the soft labels the student learns from (sample: vote shares with the distil stage's default
smoothing 0.1; score: the exact probabilities); and the throughput ratio score / sample.
Run: ``.venv/bin/python benchmarks/bench_annotate_modes.py`` (writes benchmarks/results/annotate_modes.json).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from common import machine, write_results

from agpo.models import TinyModelConfig
from agpo.sft import SFTConfig
from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as prepare
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.intake.synthetic import SyntheticConfig
from pipelines.ads.teacher.labeling import VotingConfig
from pipelines.ads.teacher.warm_start import TeacherConfig
from pipelines.ads.teacher.warm_start import run as build_teacher

VOTE_SMOOTHING = 0.1  # student.training.DistilTrainingConfig's default


def soft_label_log_loss(labels_dir: Path, gold: dict[str, int]) -> float:
    """Mean -log q(gold) of the soft labels: exact probabilities where given, else smoothed vote shares."""
    losses = []
    for path in sorted(labels_dir.glob("*.parquet")):
        for row in pq.read_table(path).to_pylist():
            if row["grade_probs"] is not None:
                q = row["grade_probs"]
            else:
                smoothed = [v + VOTE_SMOOTHING for v in row["votes"]]
                q = [v / sum(smoothed) for v in smoothed]
            losses.append(-math.log(max(q[gold[row["pair_id"]]], 1e-12)))
    return sum(losses) / len(losses)


def run_mode(mode: str, teacher: str, data: dict[str, Path], out: Path, votes: int) -> dict:
    config = AnnotateConfig(
        input=InputConfig(path=str(data["pairs"]), split="unlabeled"),
        teacher=teacher,
        out_dir=str(out),
        num_shards=1,
        chunk_pairs=4096,
        gold=str(data["unlabeled_gold"]),
        voting=VotingConfig(mode=mode, votes=votes),
    )
    started = time.perf_counter()
    paths = annotate(config)
    seconds = time.perf_counter() - started
    report = json.loads(paths["report"].read_text())
    throughput = report["throughput"]
    table = pq.read_table(data["unlabeled_gold"]).to_pydict()
    gold = dict(zip(table["pair_id"], table["gold_grade"], strict=True))
    return {
        "pairs": throughput["pairs"],
        "seconds": round(seconds, 2),
        "teacher_seconds": round(throughput["generation_seconds"] + throughput["scoring_seconds"], 2),
        "generated_tokens": throughput["generated_tokens"],
        "accuracy": report["gold_agreement"]["accuracy"],
        "macro_f1": report["gold_agreement"]["macro_f1"],
        "mean_confidence": report["mean_confidence"],
        "review_rate": report["review_rate"],
        "soft_label_gold_log_loss": soft_label_log_loss(out / "labels", gold),
        "label_distribution": report["label_distribution"],
    }


def compare(teacher: str, data: dict[str, Path], work: Path, votes: int, repeats: int) -> dict:
    """Both modes on one teacher, alternating ``repeats`` times: the median time, and the quality figures (the
    same in every repeat: both modes are deterministic)."""
    runs: dict[str, list[dict]] = {"sample": [], "score": []}
    for repeat in range(repeats):
        for mode, done in runs.items():
            done.append(run_mode(mode, teacher, data, work / f"{mode}-{repeat}", votes))
    modes = {}
    for mode, done in runs.items():
        seconds = statistics.median(r["seconds"] for r in done)
        teacher_seconds = statistics.median(r["teacher_seconds"] for r in done)
        modes[mode] = {**done[0], "seconds": seconds, "teacher_seconds": teacher_seconds}
        modes[mode]["pairs_per_s"] = done[0]["pairs"] / seconds
        modes[mode]["seconds_per_repeat"] = [r["seconds"] for r in done]
        quality = ("accuracy", "soft_label_gold_log_loss", "label_distribution")
        modes[mode]["same_labels_every_repeat"] = all(r[k] == done[0][k] for r in done for k in quality)
    return {**modes, "score_over_sample_pairs_per_s": modes["score"]["pairs_per_s"] / modes["sample"]["pairs_per_s"]}


def tiny_teacher_stage(
    pairs: Path, out: Path, answer_format: str, sft_examples: int, sft_epochs: int
) -> tuple[str, dict]:
    """The teacher stage's tiny Qwen2 SFT'd on ``sft_examples`` train pairs of ``pairs``: (model directory,
    {teacher: its description, teacher_audit: its audit accuracies})."""
    built = build_teacher(
        TeacherConfig(
            pairs=str(pairs),
            out_dir=str(out),
            answer_format=answer_format,
            sft_examples=sft_examples,
            audit_examples=50,
            model=TinyModelConfig(),
            sft=SFTConfig(epochs=sft_epochs),
        )
    )
    report = json.loads(built["report"].read_text())
    return str(built["model"]), {
        "teacher": f"tiny teacher built here (teacher stage: hidden 256, 2 layers, answer_format {answer_format}, "
        f"SFT {sft_epochs} epochs on {sft_examples} pairs)",
        "teacher_audit": {k: v for k, v in report.items() if "accuracy" in k},
    }


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=500, help="unlabeled pairs annotated in each mode")
    parser.add_argument("--votes", type=int, default=5, help="sample mode's votes per pair")
    parser.add_argument("--train", type=int, default=2000, help="labeled train pairs drawn")
    parser.add_argument("--sft-examples", type=int, default=2000, help="train pairs the teacher is SFT'd on")
    parser.add_argument("--sft-epochs", type=int, default=SFTConfig().epochs)
    parser.add_argument(
        "--answer-formats", nargs="+", default=["reason", "answer"], help="a tiny teacher per answer format"
    )
    parser.add_argument("--teacher", default=None, help="model directory; default: build the tiny teachers")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (median)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-annotate-modes-"))
    teachers: dict[str, dict] = {}
    try:
        synthetic = SyntheticConfig(train=args.train, audit=50, unlabeled=args.pairs, test=0)
        data = prepare(DataConfig(out_dir=str(work / "data"), synthetic=synthetic))
        if args.teacher is not None:
            compared = compare(args.teacher, data, work / "given", args.votes, args.repeats)
            teachers["given"] = {"teacher": args.teacher, **compared}
        for answer_format in [] if args.teacher else args.answer_formats:
            teacher, teachers[answer_format] = tiny_teacher_stage(
                data["pairs"], work / answer_format / "teacher", answer_format, args.sft_examples, args.sft_epochs
            )
            teachers[answer_format].update(compare(teacher, data, work / answer_format, args.votes, args.repeats))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {
        "machine": machine(),
        "pairs": args.pairs,
        "sample_votes": args.votes,
        "repeats": args.repeats,
        "teachers": teachers,
    }
    print(json.dumps(results, indent=2))
    write_results("annotate_modes", results)
    return results


if __name__ == "__main__":
    main()
