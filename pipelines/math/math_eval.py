"""Stage ``agpo math-eval``: sample n solutions per problem of a math set and report pass@k, maj@k and
accuracy per subject and level.

For each problem (GSM8K, MATH-500 or CMATH via pipelines.math.math_data, prompted for a ``\\boxed{}`` answer)
the model samples ``samples`` completions (seeded per problem). Each completion is scored by the math
reward (math-verify equivalence with the gold answer). Reported, over problems:

- pass@k for k = 1, 2, 4, ..., n with the unbiased estimator (agpo.sampling_metrics.pass_at_k);
- maj@k for the same k: the majority of the first k extracted answers (ties: the first seen) is correct;
- mean@n, the share of unparseable completions, and mean@n per subject and per level (MATH's fields).

Writes ``results.json`` and ``pass_at_k.png`` into ``out_dir``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agpo.pretrained import resolve_base_model
from agpo.rewards.math import extract_answer, math_equivalent
from agpo.rollout import encode_prompts
from agpo.sampling_metrics import majority, mean_at_n, pass_at_k_curve, power_of_two_ks
from pipelines.devices import teacher_on_device, use_device
from pipelines.io import print_summary, write_json_atomic
from pipelines.math.math_data import load_math_set, render_prompt
from pipelines.math.math_eval_config import MathEvalConfig
from pipelines.plots import plot_pass_at_k
from pipelines.progress import progress_bar
from pipelines.threads import use_threads


def score_samples(problems: Sequence[dict[str, Any]], completions: Sequence[Sequence[str]]) -> dict[str, Any]:
    """pass@k, maj@k, mean@n, unparseable share and per-subject / per-level mean@n from the completions
    of each problem (``completions[i]`` holds problem i's n samples; every problem has the same n)."""
    if len(problems) != len(completions) or not problems:
        raise ValueError(f"need one list of completions per problem, got {len(problems)} and {len(completions)}")
    n = len(completions[0])
    if n == 0 or any(len(c) != n for c in completions):
        raise ValueError("every problem needs the same, non-zero number of completions")
    pairs = zip(problems, completions, strict=True)
    correct = [[math_equivalent(c, problem["answer"]) for c in samples] for problem, samples in pairs]
    answers = [[extract_answer(c) for c in samples] for samples in completions]
    ks = power_of_two_ks(n)
    maj = {}
    for k in ks:
        # the majority answer is scored by math-verify (as its first sample was), not compared as a string
        winners = [majority(votes[:k]) for votes in answers]
        hits = [
            w is not None and right[votes.index(w)] for w, votes, right in zip(winners, answers, correct, strict=True)
        ]
        maj[k] = sum(hits) / len(problems)
    groups: dict[str, dict[str, list[float]]] = {"subject": defaultdict(list), "level": defaultdict(list)}
    for problem, right in zip(problems, correct, strict=True):
        for key in groups:
            if problem.get(key) is not None:
                groups[key][str(problem[key])].append(sum(right) / n)
    return {
        "problems": len(problems),
        "samples": n,
        "pass_at_k": pass_at_k_curve(correct, ks),
        "maj_at_k": maj,
        "mean_at_n": mean_at_n([c for right in correct for c in right]),
        "unparseable": sum(a is None for votes in answers for a in votes) / (n * len(answers)),
        "per_subject": {g: sum(v) / len(v) for g, v in sorted(groups["subject"].items())},
        "per_level": {g: sum(v) / len(v) for g, v in sorted(groups["level"].items())},
    }


def sample_completions(config: MathEvalConfig, problems: Sequence[dict[str, Any]], name: str) -> list[list[str]]:
    model_dir = resolve_base_model(config.model)
    _, tokenizer, engine = teacher_on_device(model_dir, config.engine, config.engine_options, use_device(config))
    completions: list[list[str]] = []
    step = config.batch_problems
    for start in progress_bar(range(0, len(problems), step), desc=f"math-eval {name}", unit="batch"):
        batch = problems[start : start + step]
        ids = encode_prompts(tokenizer, [render_prompt(p["problem"]) for p in batch])
        rollout = engine.generate(
            ids,
            n=config.samples,
            temperatures=config.temperature,
            max_new_tokens=config.max_new_tokens,
            seed=[config.seed * 1_000_003 + start + i for i in range(len(batch))],
        )
        completions += [rollout.texts[i * config.samples : (i + 1) * config.samples] for i in range(len(batch))]
    return completions


def run(
    config: MathEvalConfig, problems: Sequence[dict[str, Any]] | None = None, name: str | None = None
) -> dict[str, Path]:
    """Evaluate on ``config.dataset`` (or on the given ``problems``, reported under ``name``)."""
    threads = use_threads(config.threads)
    name = name or config.dataset
    if problems is None:
        problems = load_math_set(config.dataset, config.path, config.limit)
    started = time.perf_counter()
    completions = sample_completions(config, problems, name)
    scores = score_samples(problems, completions)
    results = {
        "model": config.model,
        "dataset": name,
        "temperature": config.temperature,
        "max_new_tokens": config.max_new_tokens,
        "seconds": round(time.perf_counter() - started, 1),
        **scores,
    }
    out = Path(config.out_dir)
    ks = list(scores["pass_at_k"])
    paths = {
        "results": write_json_atomic(out / "results.json", results),
        "plot": plot_pass_at_k(
            {"pass@k": (ks, list(scores["pass_at_k"].values()), [0.0] * len(ks))},
            out / "pass_at_k.png",
            f"{name}: {scores['problems']} problems, {scores['samples']} samples each",
            baseline=("maj@k", ks, list(scores["maj_at_k"].values())),
        ),
    }
    print_summary(
        f"math-eval {name}: {scores['problems']} problems x {scores['samples']} samples: pass@1 "
        f"{scores['pass_at_k'][1]:.3f}, pass@{ks[-1]} {scores['pass_at_k'][ks[-1]]:.3f}, maj@{ks[-1]} "
        f"{scores['maj_at_k'][ks[-1]]:.3f}, unparseable {scores['unparseable']:.2f}",
        paths,
        threads,
    )
    return paths
