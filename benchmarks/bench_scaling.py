"""Annotation at growing input sizes: time should grow linearly and memory stay flat.

For each size in ``--sizes`` (default 10k, 40k, 160k synthetic unlabeled pairs) this process writes the
pairs to Parquet, then a fresh process runs ``agpo annotate`` on them (4 shards, 2,048-pair chunks, 1
vote, no retries) and reports its own seconds and peak RSS: the pipeline's memory alone, never the input
generator's or another size's. The
teacher is a smaller tiny teacher than the demo's (hidden 64, 1 layer, SFT'd the same way) so that 210k
pairs fit in a few minutes on 2 cores: the figure under test is how the pipeline scales, not how fast a
model generates (bench_annotate.py measures the pipeline's overhead over the raw engine).
Reported per size: pairs/s, seconds per 1,000 pairs, peak RSS (the child's own high-water mark, ``VmHWM``),
rows in = labeled + quarantined, and the ratios against the smallest size (time per pair, peak RSS); the
target is peak RSS at the largest size over the smallest (``rss_160k_over_10k`` for the default sizes) <= 1.1.
This process samples each child's RSS every ``--sample-every`` seconds and plots the timelines of all sizes in
one PNG (``scaling_rss.png`` beside the JSON).
Run: ``.venv/bin/python benchmarks/bench_scaling.py`` (writes benchmarks/results/scaling.json);
``--sizes 200,800`` for a quick run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import RESULTS_DIR, machine, memory_mb, saved_tiny_teacher, write_results

from agpo.models import TinyModelConfig

SMALL_TEACHER = TinyModelConfig(hidden_size=64, num_layers=1, intermediate_size=128)


def write_input(size: int, path: Path) -> float:
    """``size`` synthetic unlabeled pairs as Parquet (in the parent: its memory is not the pipeline's)."""
    from pipelines.ads.intake.contracts import pairs_table, write_table
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs

    started = time.perf_counter()
    write_table(pairs_table(generate_pairs(SyntheticConfig(train=0, audit=0, unlabeled=size, test=0))), path)
    return time.perf_counter() - started


def annotate_once(input_path: Path, teacher: str, work: Path) -> dict[str, float]:
    """``agpo annotate`` on one input, in this (fresh) process: its peak RSS is the pipeline's alone."""
    import pyarrow.parquet as pq

    from pipelines.ads.annotation.annotate import AnnotateConfig
    from pipelines.ads.annotation.annotate import run as annotate
    from pipelines.ads.intake.ingest import InputConfig
    from pipelines.ads.teacher.labeling import VotingConfig

    config = AnnotateConfig(
        input=InputConfig(path=str(input_path)),
        teacher=teacher,
        out_dir=str(work / "run"),
        num_shards=4,
        chunk_pairs=2048,
        gold=None,
        voting=VotingConfig(votes=1, max_retries=0, batch_pairs=256),
    )
    started = time.perf_counter()
    paths = annotate(config)
    seconds = time.perf_counter() - started
    report = json.loads(Path(paths["report"]).read_text())
    size = report["counts"]["rows_in"]
    labeled = sum(pq.ParquetFile(f).metadata.num_rows for f in (work / "run" / "labels").glob("*.parquet"))
    return {
        "pairs": size,
        "annotate_s": round(seconds, 1),
        "pairs_per_s": round(size / seconds, 1),
        "s_per_1k_pairs": round(1000 * seconds / size, 3),
        "peak_rss_mib": memory_mb("VmHWM"),  # the child's own: not ru_maxrss, which it inherits
        "labeled_rows": labeled,
        "counts": report["counts"],  # rows_in = labels + quarantined
    }


def sampled_run(command: list[str], every: float) -> tuple[subprocess.CompletedProcess, list[tuple[float, float]]]:
    """Run ``command``, sampling its RSS (MiB) every ``every`` seconds: (the finished process, [(s, MiB)])."""
    started = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        watched, timeline = psutil.Process(child.pid), []
        while child.poll() is None:
            try:
                timeline.append((time.perf_counter() - started, watched.memory_info().rss / 2**20))
            except psutil.NoSuchProcess:  # it ended between the poll and the sample
                break
            time.sleep(every)
        stdout, stderr = child.communicate()
    return subprocess.CompletedProcess(command, child.returncode, stdout, stderr), timeline


def plot_timelines(timelines: dict[int, list[tuple[float, float]]], path: Path) -> Path:
    """One line per input size: RSS (MiB) against seconds since its process started."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for size, timeline in timelines.items():
        axes.plot([t for t, _ in timeline], [rss for _, rss in timeline], label=f"{size:,} pairs")
    axes.set(xlabel="seconds since the annotation process started", ylabel="RSS (MiB)", ylim=(0, None))
    axes.set_title("agpo annotate: resident memory over time, by input size")
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def short(size: int) -> str:
    return f"{size // 1000}k" if size % 1000 == 0 else str(size)


def main() -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,40000,160000", help="comma-separated input sizes in pairs")
    parser.add_argument("--sample-every", type=float, default=0.5, help="seconds between RSS samples")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: annotate this input in this process
    parser.add_argument("--teacher", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(annotate_once(Path(args.one), args.teacher, Path(args.work))))
        return {}
    work = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    try:
        teacher = saved_tiny_teacher(work / "teacher", SMALL_TEACHER)
        rows, timelines = [], {}
        for size in map(int, args.sizes.split(",")):
            run_dir = work / f"n{size}"
            run_dir.mkdir()
            write_seconds = write_input(size, run_dir / "pairs.parquet")
            done, timelines[size] = sampled_run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    str(run_dir / "pairs.parquet"),
                    "--teacher",
                    teacher,
                    "--work",
                    str(run_dir),
                ],
                args.sample_every,
            )
            if done.returncode:
                raise SystemExit(f"size {size} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            sampled = max((rss for _, rss in timelines[size]), default=0.0)
            rows.append({**row, "input_write_s": round(write_seconds, 1), "sampled_max_rss_mib": round(sampled, 1)})
            print(rows[-1], flush=True)
            shutil.rmtree(run_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    smallest, largest = rows[0], rows[-1]
    for row in rows:
        row["time_per_pair_over_smallest"] = round(row["s_per_1k_pairs"] / smallest["s_per_1k_pairs"], 2)
        row["peak_rss_over_smallest"] = round(row["peak_rss_mib"] / smallest["peak_rss_mib"], 2)
    ratio = round(largest["peak_rss_mib"] / smallest["peak_rss_mib"], 2)
    target = f"rss_{short(largest['pairs'])}_over_{short(smallest['pairs'])}"
    results = {
        "machine": machine(),
        "teacher": "tiny Qwen2, hidden 64, 1 layer, 1 vote per pair",
        "sizes": rows,
        "targets": {target: {"ratio": ratio, "target": 1.1}},
        "rss_timeline": plot_timelines(timelines, RESULTS_DIR / "scaling_rss.png").name,
    }
    write_results("scaling", results)
    return results


if __name__ == "__main__":
    main()
