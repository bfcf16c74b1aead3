"""Stage ``agpo toy``: compare the advantage estimators on the controlled toy policy
(:mod:`pipelines.experiments.toy_policy`).

Every algorithm trains from the same base policy at the same generated-token budget over several seeds;
the stage writes ``results.json`` (per-seed and aggregated pass@k, learning curves, last-step metrics),
``results.md`` (the summary table), ``pass_at_k.png`` and ``learning_curves.png`` into ``out_dir``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict
from pathlib import Path

from pipelines.config import to_dict
from pipelines.experiments.toy_config import ToyCompareConfig
from pipelines.experiments.toy_policy import ToyConfig, ToyProblems, ToyRun, train_toy
from pipelines.io import print_summary, write_atomic, write_json_atomic
from pipelines.plots import plot_learning_curves, plot_pass_at_k
from pipelines.progress import progress_bar
from pipelines.threads import use_threads

TABLE_KS = (1, 8, 64, 256)


def run(config: ToyCompareConfig) -> dict[str, Path]:
    """Train every algorithm x seed, then write results, table and plots. Returns the written paths."""
    threads = use_threads(config.threads)
    toy = config.toy
    out = Path(config.out_dir)
    problems = ToyProblems.generate(toy)
    total_steps = sum(toy.token_budget // toy.samples_per_step(a) for a in toy.algorithms) * len(toy.seeds)
    started = time.perf_counter()
    runs: list[ToyRun] = []
    with progress_bar(total=total_steps, desc="toy comparison", unit="step", mininterval=1.0) as bar:
        for algorithm in toy.algorithms:
            for seed in toy.seeds:
                bar.set_postfix(algorithm=algorithm, seed=seed, refresh=False)
                runs.append(train_toy(toy, problems, algorithm, seed, on_step=lambda _: bar.update()))
    ks = sorted(runs[0].pass_at_k)
    base = problems.base_pass_at_k(ks)
    summary = _summarise(runs, ks)
    results = {
        "config": to_dict(toy),
        "seconds": round(time.perf_counter() - started, 2),
        "base": {str(k): v for k, v in base.items()},
        "summary": summary,
        "runs": [_run_record(r) for r in runs],
    }
    table = _markdown_table(summary, base, toy)
    paths = {
        "results": write_json_atomic(out / "results.json", results),
        "table": write_atomic(out / "results.md", table),
        "pass_at_k_plot": plot_pass_at_k(
            {name: (ks, *_mean_std(entry, ks)) for name, entry in summary.items()},
            out / "pass_at_k.png",
            title=f"Toy policy: pass@k at {toy.token_budget:,} generated answers ({len(toy.seeds)} seeds)",
            baseline=("base policy", ks, [base[k] for k in ks]),
        ),
        "learning_curve_plot": plot_learning_curves(
            _mean_learning_curves(runs),
            out / "learning_curves.png",
            title=f"Toy policy: pass@1 against generated answers (mean of {len(toy.seeds)} seeds)",
            xlabel="generated answers (tokens)",
            ylabel="pass@1",
        ),
    }
    print(table)
    print_summary(f"toy comparison done in {results['seconds']} s; outputs:", paths, threads)
    return paths


def _summarise(runs: list[ToyRun], ks: list[int]) -> dict[str, dict[str, object]]:
    summary: dict[str, dict[str, object]] = {}
    for algorithm in dict.fromkeys(r.algorithm for r in runs):
        mine = [r for r in runs if r.algorithm == algorithm]
        per_k = {}
        for k in ks:
            values = [r.pass_at_k[k] for r in mine]
            per_k[str(k)] = {
                "mean": statistics.fmean(values),
                "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            }
        summary[algorithm] = {"pass_at_k": per_k, "generated": mine[0].generated, "steps": mine[0].steps}
    return summary


def _mean_std(entry: dict[str, object], ks: list[int]) -> tuple[list[float], list[float]]:
    per_k = entry["pass_at_k"]
    return [per_k[str(k)]["mean"] for k in ks], [per_k[str(k)]["std"] for k in ks]


def _mean_learning_curves(runs: list[ToyRun]) -> dict[str, tuple[list[float], list[float]]]:
    """Per algorithm, pass@1 at each evaluation point averaged over seeds (seeds share the x points)."""
    curves = {}
    for algorithm in dict.fromkeys(r.algorithm for r in runs):
        mine = [r.curve for r in runs if r.algorithm == algorithm]
        xs = [point["generated"] for point in mine[0]]
        ys = [statistics.fmean(curve[i]["pass@1"] for curve in mine) for i in range(len(xs))]
        curves[algorithm] = (xs, ys)
    return curves


def _run_record(run: ToyRun) -> dict[str, object]:
    record = asdict(run)
    record["pass_at_k"] = {str(k): v for k, v in run.pass_at_k.items()}
    return record


def _markdown_table(summary: dict[str, dict[str, object]], base: dict[int, float], toy: ToyConfig) -> str:
    ks = [k for k in TABLE_KS if k in base]
    header = "| algorithm | " + " | ".join(f"pass@{k}" for k in ks) + " | generated | steps |"
    rule = "|---|" + "---:|" * (len(ks) + 2)
    rows = ["| base policy | " + " | ".join(f"{base[k]:.3f}" for k in ks) + " | 0 | 0 |"]
    for algorithm, entry in summary.items():
        per_k = entry["pass_at_k"]
        cells = [f"{per_k[str(k)]['mean']:.3f} ± {per_k[str(k)]['std']:.3f}" for k in ks]
        rows.append(f"| {algorithm} | " + " | ".join(cells) + f" | {entry['generated']:,} | {entry['steps']} |")
    caption = (
        f"Toy policy, {toy.num_problems} problems, G = {toy.group_size}, {len(toy.seeds)} seeds "
        f"(mean ± std), equal budget of {toy.token_budget:,} generated answers (probe answers count)."
    )
    return "\n".join([caption, "", header, rule, *rows]) + "\n"
