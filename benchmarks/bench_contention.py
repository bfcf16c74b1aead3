"""Speed on a shared machine: each workload alone, beside 1 and 2 busy single-threaded processes and beside a
second copy of itself, against the slowdown a fair share of the cores predicts.

Workloads (the tiny teacher of benchmarks.common and the MiniLM student; each in a process of its own):

- ``sft``: seconds per SFT step (agpo.sft.supervised_finetune, batch 8);
- ``rl``: seconds per AGPO step (8 prompts x G 4, at most 24 new tokens);
- ``annotate``: pairs/s of the annotation labeler (pipelines.ads.teacher.labeling.PairLabeler, 1 vote,
  the answer grammar, batches of 32);
- ``serving``: pairs/s of the student's ``predict_proba`` (MiniLM cross-encoder, torch, batches of 32).

Scenarios: ``alone``; ``busy1`` and ``busy2`` (1 or 2 ``while True: pass`` processes); ``copy`` (two copies of
the workload, started together, as two mapped Airflow tasks on one worker: each told ``AGPO_TASK_SLOTS=2``).
Every worker sets up untimed, waits for the others, then works for ``--seconds``; its figure is the median
time per unit (step or batch) over that window.

Settings: ``product`` (what the stages do: pipelines.threads.prepare_openmp's wait policy and use_threads'
thread count); ``before`` (torch's defaults: libgomp's default wait policy, one thread per core, slots ignored)
and ``passive`` (``OMP_WAIT_POLICY=PASSIVE`` always, one thread per core): the last two alone and beside one busy
process only, to show what the wait policy and the thread count each do.

Fair share: a workload that ran T threads alone on min(T, C) of the C CPUs is owed C * T / R of them among R
runnable threads, counted as if it kept its T threads (R = T + busy processes, or 2T for two copies): choosing
fewer threads under load must earn its figure, not lower the bar. Its expected slowdown is
min(T, C) / min(T, C, C * T / R); the goal is a measured slowdown at most 1.15x that.
Run: ``.venv/bin/python benchmarks/bench_contention.py`` (writes benchmarks/results/contention.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_results

from pipelines.threads import TASK_SLOTS_ENV, prepare_openmp

WORKLOADS = ("sft", "rl", "annotate", "serving")
SCENARIOS = ("alone", "busy1", "busy2", "copy")
SETTINGS = ("product", "before", "passive")
COMPARED = ("alone", "busy1")  # the scenarios of the settings other than product
GOAL = 1.15
BUSY = "while True: pass"


def worker_setup(workload: str, models: Path):
    """The workload's untimed set-up; returns a function doing one unit of work and the units it does."""
    from pipelines.threads import use_threads

    if os.environ.get("BENCH_SETTING") == "product":
        use_threads(None)
    from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs

    rows = generate_pairs(SyntheticConfig(train=256, audit=0, unlabeled=0, test=0, seed=1))
    if workload == "serving":
        from student.model import RelevanceStudent

        student = RelevanceStudent.load(models / "student")
        queries, ads = [r["query"] for r in rows[:32]], [r["ad_title"] for r in rows[:32]]
        return lambda: student.predict_proba(queries, ads, batch_size=32), 32
    from agpo.models import load_model
    from pipelines.ads.teacher.prompts import RELEVANCE_V1

    model, tokenizer = load_model(models / "teacher")
    prompts = [RELEVANCE_V1.render_pair(r) for r in rows]
    if workload == "sft":
        from agpo.sft import SFTConfig, supervised_finetune

        examples = [
            (p, RELEVANCE_V1.target(r["gold_grade"], r["rationale"]))
            for p, r in zip(prompts[:8], rows[:8], strict=True)
        ]
        config = SFTConfig(epochs=1, batch_size=8, max_steps=1)
        return lambda: supervised_finetune(model, tokenizer, examples, config), 1
    if workload == "rl":
        from agpo.rollout import HFRolloutEngine
        from agpo.trainer import RLTrainer, TrainerConfig
        from agpo.trainer_config import RolloutConfig
        from pipelines.ads.teacher.relevance_reward import parse_grade, relevance_reward

        config = TrainerConfig(
            max_steps=10**6, rollout=RolloutConfig(group_size=4, prompts_per_step=8, max_new_tokens=24)
        )
        gold = {"gold_grade": [r["gold_grade"] for r in rows]}
        engine = HFRolloutEngine(model, tokenizer)
        trainer = RLTrainer(
            model, tokenizer, engine, relevance_reward, prompts, gold, config, answer_fn=parse_grade, progress=False
        )
        return trainer.step, 1
    from agpo.rollout import HFRolloutEngine
    from pipelines.ads.teacher.labeling import PairLabeler, VotingConfig
    from pipelines.ads.teacher.prompts import teacher_prompt

    prompt = teacher_prompt(str(models / "teacher"), tokenizer)
    labeler = PairLabeler(HFRolloutEngine(model, tokenizer), tokenizer, prompt, VotingConfig(batch_pairs=32), "bench")
    batches = [rows[i : i + 32] for i in range(0, len(rows), 32)]
    turn = iter(range(10**9))
    return lambda: labeler.label(batches[next(turn) % len(batches)]), 32


def worker(workload: str, models: Path, seconds: float) -> None:
    """One measured process: set up, say ready, wait for go, work ``seconds``, print the result as JSON."""
    import torch

    unit, size = worker_setup(workload, models)
    unit()  # warm-up
    print("ready", flush=True)
    sys.stdin.readline()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        started = time.perf_counter()
        unit()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    result = {"units": len(times), "seconds_per_unit": median, "per_s": size / median}
    print(json.dumps(result | {"threads": torch.get_num_threads()}), flush=True)


def environment(setting: str, slots: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "AGPO_TASK_SLOTS")}
    env |= {"BENCH_SETTING": setting, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if setting == "product":  # what an entry point does before torch loads (here after the busy processes start)
        env[TASK_SLOTS_ENV] = str(slots)
        prepare_openmp(env)
    if setting == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def measure(workload: str, scenario: str, setting: str, models: Path, seconds: float) -> list[dict]:
    """Run ``scenario`` once: busy processes first, then the workers together; their results."""
    copies = 2 if scenario == "copy" else 1
    busy = [
        subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(int(scenario[-1]) if "busy" in scenario else 0)
    ]
    command = [sys.executable, __file__, "--worker", workload, "--models", str(models), "--seconds", str(seconds)]
    env = environment(setting, copies)
    try:
        workers = [
            subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(copies)
        ]
        for process in workers:
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{workload} worker failed during set-up (exit {process.wait()})")
        for process in workers:
            process.stdin.write("go\n")
            process.stdin.flush()
        return [json.loads(process.communicate()[0].strip().splitlines()[-1]) for process in workers]
    finally:
        for process in busy:
            process.kill()
            process.wait()


def fair_slowdown(threads: int, runnable: int, cpus: int) -> float:
    """The slowdown a fair share of ``cpus`` among ``runnable`` threads predicts for a workload that ran
    ``threads`` alone (this module's docstring)."""
    return min(threads, cpus) / min(threads, cpus, cpus * threads / max(runnable, 1))


def build_models(folder: Path, workloads: list[str]) -> None:
    """The tiny teacher and an (untrained) MiniLM student, saved once for every worker (each when needed)."""
    from common import saved_tiny_teacher

    from student.model import RelevanceStudent, StudentConfig

    if set(workloads) - {"serving"}:
        saved_tiny_teacher(folder / "teacher")
    if "serving" in workloads:
        student = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", kind="cross", max_length=96))
        student.save(folder / "student")


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=8.0, help="timed window of every measurement")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--scenarios", nargs="+", choices=SCENARIOS, default=list(SCENARIOS), help="alone first")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.models, args.seconds)
        return {}
    from pipelines.threads import cpu_budget

    cpus = cpu_budget().usable
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-contention-") as folder:
        build_models(Path(folder), args.workloads)
        for setting in args.settings:
            for workload in args.workloads:
                rows = {}
                wanted = args.scenarios if setting == "product" else [s for s in args.scenarios if s in COMPARED]
                for scenario in dict.fromkeys(["alone", *wanted]):
                    measured = measure(workload, scenario, setting, Path(folder), args.seconds)
                    seconds = statistics.mean(m["seconds_per_unit"] for m in measured)
                    threads = measured[0]["threads"]
                    rows[scenario] = {"seconds_per_unit": round(seconds, 4), "threads": threads}
                    alone = rows["alone"]
                    busy = int(scenario[-1]) if "busy" in scenario else 0
                    fair = fair_slowdown(alone["threads"], alone["threads"] * len(measured) + busy, cpus)
                    slowdown = seconds / alone["seconds_per_unit"]
                    rows[scenario] |= {
                        "slowdown": round(slowdown, 3),
                        "fair_slowdown": round(fair, 3),
                        "vs_fair": round(slowdown / fair, 3),
                        "meets_goal": slowdown / fair <= GOAL,
                    }
                    print(
                        f"{setting:8s} {workload:9s} {scenario:6s} threads={threads} {seconds * 1000:8.1f} ms/unit "
                        f"slowdown {slowdown:5.2f}x (fair {fair:4.2f}x) -> {slowdown / fair:4.2f}x fair",
                        flush=True,
                    )
                results[f"{setting}/{workload}"] = rows
    product = [row["vs_fair"] for key, rows in results.items() if key.startswith("product/") for row in rows.values()]
    targets = {"worst_over_fair": {"value": max(product), "target": GOAL}} if product else {}
    return write_results(
        "contention",
        {"usable_cpus": cpus, "seconds_per_measurement": args.seconds, "results": results, "targets": targets},
    )


if __name__ == "__main__":
    main()
