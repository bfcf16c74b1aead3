"""Annotation throughput: end-to-end ``agpo annotate`` against the raw engine on the same prompts.

Writes ``--pairs`` synthetic unlabeled pairs, then in this process
1. *raw*: the teacher loaded, the prompts rendered and tokenized, and the ``hf`` engine generating the same
   votes for them in the same batches with the same per-pair seeds, and nothing else (no validation,
   parsing, sharding or Parquet);
2. *end to end*: the annotate stage (partition, shards, chunks, parsing, majority, review queue,
   manifests, report) with retries and deduplication off, so both do the same generation work.
The two run ``--repeats`` (5) times in turns, which one goes first alternating (the second of a pair ran on a
heap the first left behind); reports their median pairs/s, generated tokens/s, peak RSS, the pipeline overhead
1 - raw time / end-to-end time (target < 5%; one run each varied by +-5% here) and each one's seconds inside the
engine's ``generate`` calls, which tell the engine's time from the work around it.
``--profile`` runs the end-to-end stage under cProfile and reports the functions outside the engine
(torch, transformers, agpo.rollout) that take the most own time: where the overhead goes.
The teacher is the tiny one built here (benchmarks.common) unless ``--teacher`` names a model directory
(the demo's: work/runs/demo/teacher/rl/model).
Run: ``.venv/bin/python benchmarks/bench_annotate.py`` (writes benchmarks/results/annotate.json).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import machine, saved_tiny_teacher, write_results

from agpo.models import load_model
from agpo.rollout import HFRolloutEngine, encode_prompts
from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.teacher.labeling import VotingConfig, pair_seed
from pipelines.ads.teacher.prompts import teacher_prompt
from pipelines.ads.teacher.relevance_reward import ESCI_GRADES


def raw_engine_seconds(teacher: str, pairs: list[dict], voting: VotingConfig) -> tuple[float, int, float]:
    """The engine alone on the same prompts (the teacher's saved prompt, as the labeler renders them), answer
    grammar, batches (sorted by length) and seeds as the labeler, with what any caller of an engine does too: load the
    teacher, render and tokenize the prompts. Returns the seconds, the generated tokens and the seconds inside
    ``generate``."""
    started, tokens, generating = time.perf_counter(), 0, 0.0
    model, tokenizer = load_model(teacher)
    engine = HFRolloutEngine(model, tokenizer)
    prompt = teacher_prompt(teacher, tokenizer)  # as the labeler renders them: the saved prompt, its BOS
    ids = encode_prompts(tokenizer, [prompt.render_pair(p) for p in pairs])
    grammar = prompt.grammar(ESCI_GRADES) if voting.constrained else None  # the labeler's answer grammar
    order = sorted(range(len(pairs)), key=lambda i: len(ids[i]))
    for start in range(0, len(order), voting.batch_pairs):
        batch = order[start : start + voting.batch_pairs]
        calling = time.perf_counter()
        rollout = engine.generate(
            [ids[i] for i in batch],
            n=voting.votes,
            temperatures=voting.temperature,
            max_new_tokens=voting.max_new_tokens,
            seed=[pair_seed(voting.seed, pairs[i]["pair_id"], 0) for i in batch],
            constraint=grammar,
        )
        generating += time.perf_counter() - calling
        tokens += rollout.num_tokens
    return time.perf_counter() - started, tokens, generating


def end_to_end_seconds(
    teacher: str, input_path: Path, out_dir: Path, voting: VotingConfig, profile: cProfile.Profile | None
) -> tuple[float, int, float]:
    """The annotate stage on the same pairs and votes, retries and deduplication off: the seconds, the generated
    tokens and the seconds inside ``generate`` (its report's ``generation_seconds``)."""
    config = AnnotateConfig(
        input=InputConfig(path=str(input_path)),
        teacher=teacher,
        out_dir=str(out_dir),
        num_shards=4,
        chunk_pairs=2048,
        gold=None,
        voting=voting,
        dedup=False,
    )
    started = time.perf_counter()
    paths = annotate(config) if profile is None else profile.runcall(annotate, config)
    seconds = time.perf_counter() - started
    throughput = json.loads(paths["report"].read_text())["throughput"]
    return seconds, throughput["generated_tokens"], throughput["generation_seconds"]


ENGINE_CODE = ("/torch/", "/transformers/", "/agpo/rollout/", "torch._C", "method 'item'", "method 'tolist'")


def pipeline_hotspots(profile: cProfile.Profile, top: int = 15) -> list[dict]:
    """The ``top`` functions by own time outside the engine's code (``ENGINE_CODE``), with their cumulative time."""
    stats = pstats.Stats(profile).stats
    rows = [
        (own, total, f"{Path(file).name}:{line}({name})" if file != "~" else name)
        for (file, line, name), (_, _, own, total, _) in stats.items()
        if not any(marker in f"{file}{name}" for marker in ENGINE_CODE)
    ]
    return [{"function": f, "own_s": round(o, 3), "cumulative_s": round(c, 3)} for o, c, f in sorted(rows)[::-1][:top]]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--votes", type=int, default=1)
    parser.add_argument("--teacher", default=None, help="model directory; default: build the tiny teacher")
    parser.add_argument("--repeats", type=int, default=5, help="raw and end-to-end runs, in turns (medians)")
    parser.add_argument("--profile", action="store_true", help="profile the end-to-end runs (slows them down)")
    args = parser.parse_args()
    voting = VotingConfig(votes=args.votes, max_retries=0, batch_pairs=256)
    pairs = [
        r
        for r in generate_pairs(SyntheticConfig(train=0, audit=0, unlabeled=args.pairs, test=0))
        if r["split"] == "unlabeled"
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-annotate-"))
    try:
        teacher = args.teacher or saved_tiny_teacher(work / "teacher")
        input_path = write_table(pairs_table(pairs), work / "pairs.parquet")
        profile = cProfile.Profile() if args.profile else None
        runs: dict[str, list[tuple[float, int, float]]] = {"raw_engine": [], "end_to_end": []}
        for repeat in range(args.repeats):  # in turns, so the machine's load drifts over both alike
            for kind in ("raw_engine", "end_to_end") if repeat % 2 == 0 else ("end_to_end", "raw_engine"):
                if kind == "raw_engine":
                    runs[kind].append(raw_engine_seconds(teacher, pairs, voting))
                else:
                    runs[kind].append(end_to_end_seconds(teacher, input_path, work / f"run-{repeat}", voting, profile))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    raw_times, e2e_times = [run[0] for run in runs["raw_engine"]], [run[0] for run in runs["end_to_end"]]
    raw_seconds, e2e_seconds = statistics.median(raw_times), statistics.median(e2e_times)
    raw_tokens, tokens = runs["raw_engine"][-1][1], runs["end_to_end"][-1][1]
    results = {
        "machine": machine(),
        "teacher": args.teacher or "tiny teacher built here (hidden 256, 2 layers)",
        "pairs": args.pairs,
        "votes": args.votes,
        "repeats": args.repeats,
        "order": "raw first in even repeats (0, 2, ...), end to end first in odd ones",
        "seconds_each": {
            "raw_engine": [round(t, 2) for t in raw_times],
            "end_to_end": [round(t, 2) for t in e2e_times],
        },
        "generate_seconds_each": {kind: [round(run[2], 2) for run in kind_runs] for kind, kind_runs in runs.items()},
        "outside_generate_seconds": {  # median of each run's time outside the engine's generate calls
            kind: round(statistics.median(run[0] - run[2] for run in kind_runs), 2) for kind, kind_runs in runs.items()
        },
        "raw_engine": {
            "seconds": round(raw_seconds, 1),
            "tokens": raw_tokens,
            "pairs_per_s": args.pairs / raw_seconds,
            "tokens_per_s": raw_tokens / raw_seconds,
        },
        "end_to_end": {
            "seconds": round(e2e_seconds, 1),
            "tokens": tokens,
            "pairs_per_s": args.pairs / e2e_seconds,
            "tokens_per_s": tokens / e2e_seconds,
        },
        "pipeline_overhead": 1 - raw_seconds / e2e_seconds,
        "same_generated_tokens": raw_tokens == tokens,  # both did the same generation work
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "targets": {"pipeline_overhead": {"value": 1 - raw_seconds / e2e_seconds, "target": 0.05}},
    }
    if profile is not None:
        results["profile_outside_engine"] = pipeline_hotspots(profile)
    print(json.dumps(results, indent=2))
    write_results("annotate", results)
    return results


if __name__ == "__main__":
    main()
