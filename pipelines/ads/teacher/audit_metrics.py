"""Teacher quality on gold pairs: greedy grade per pair, accuracy, parse failures, confusion matrix, and the
accuracy of sampled votes (pass@1 and maj@n, the majority taken as annotation takes it: ties to the lower
grade, agpo.sampling_metrics.majority). ``constraint`` (an ``AnswerGrammar``) decodes within the answer grammar, so
every answer parses (``unparseable`` is then 0 by construction); None grades the free-running teacher.

On skewed gold (real sets: 45-48% top grade) accuracy hides a teacher that answers one grade for every pair,
so ``relevance_accuracy`` also gives, per grade k, ``recall/g{k}`` (sklearn's recall: the share of gold-k
pairs predicted k; omitted when no gold pair has grade k, so no NaN reaches JSON or MLflow),
``balanced_accuracy`` (the mean of the recalls present) and ``predicted/g{k}`` / ``predicted/none`` (the
share of all predictions per grade, and unparseable; they sum to 1): the one-grade gate of
pipelines.ads.teacher.gate reads the latter.

The class-prior bar of balanced accuracy, for the prior gate: a teacher whose answer does not depend on the
pair (a constant grade, or grades drawn at its training class rates) has expected recall q_k on grade k for
answer shares q_k, so balanced accuracy (1/K) sum_k q_k = 1/K over the K grades gold has
(``balanced_accuracy_prior``). Its standard error under that null, with n_k gold pairs of grade k and
answers drawn uniformly (recall_k ~ Binomial(n_k, 1/K) / n_k), is

    se = (1/K) * sqrt( sum_k (1/K)(1 - 1/K) / n_k )          (K = 4, n_k = 75: se = 0.025)

(``balanced_accuracy_null_se``): how far above 1/K chance alone takes a teacher on this many pairs."""

from __future__ import annotations

from collections.abc import Sequence

from sklearn.metrics import recall_score

from agpo.rollout import RolloutEngine, encode_prompts
from agpo.sampling_metrics import maj_at_k
from pipelines.ads.teacher.answer_grammar import AnswerGrammar
from pipelines.ads.teacher.relevance_reward import ESCI_GRADES, parse_grade


def grade_pairs(
    engine: RolloutEngine,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    constraint: AnswerGrammar | None = None,
) -> tuple[list[int | None], list[str]]:
    """Greedy grade (None when unparseable) and raw completion for each prompt."""
    ids = encode_prompts(tokenizer, prompts)
    rollout = engine.generate(
        ids, n=1, temperatures=1.0, max_new_tokens=max_new_tokens, greedy=True, constraint=constraint
    )
    return [parse_grade(t) for t in rollout.texts], rollout.texts


def relevance_accuracy(predicted: Sequence[int | None], gold: Sequence[int]) -> dict[str, float]:
    """accuracy, unparseable share, the confusion counts ``confusion/g{gold}_p{pred}``, ``recall/g{k}`` (grades
    present in gold), ``balanced_accuracy`` with its class-prior bar and null standard error (module docstring)
    and the prediction shares ``predicted/g{k}``, ``predicted/none``."""
    if len(predicted) != len(gold) or not gold:
        raise ValueError(f"need equal, non-empty predicted and gold lists, got {len(predicted)} and {len(gold)}")
    pairs = list(zip(predicted, gold, strict=True))
    metrics = {
        "accuracy": sum(p == g for p, g in pairs) / len(gold),
        "unparseable": sum(p is None for p in predicted) / len(gold),
    }
    for g in ESCI_GRADES:
        for p in (*ESCI_GRADES, None):
            metrics[f"confusion/g{g}_p{'none' if p is None else p}"] = float(
                sum(pp == p and gg == g for pp, gg in pairs)
            )
    present = [g for g in ESCI_GRADES if g in gold]
    unparsed_as = -1  # a label no gold pair has: an unparseable answer counts as wrong
    recalls = recall_score(
        gold, [unparsed_as if p is None else p for p in predicted], labels=present, average=None, zero_division=0
    )
    metrics.update({f"recall/g{g}": float(r) for g, r in zip(present, recalls, strict=True)})
    metrics["balanced_accuracy"] = float(recalls.mean())
    k = len(present)
    metrics["balanced_accuracy_prior"] = 1 / k
    metrics["balanced_accuracy_null_se"] = (1 / k) * sum((1 / k) * (1 - 1 / k) / gold.count(g) for g in present) ** 0.5
    for p in (*ESCI_GRADES, None):
        metrics[f"predicted/{'none' if p is None else f'g{p}'}"] = predicted.count(p) / len(predicted)
    return metrics


def grade_breakdown(prefix: str, metrics: dict[str, float]) -> dict[str, float]:
    """The per-grade figures of ``relevance_accuracy`` (``recall/g*``, ``predicted/*``, ``balanced_accuracy*``),
    each key prefixed: what every teacher report and the gates read."""
    keep = ("recall/", "predicted/", "balanced_accuracy")
    return {f"{prefix}{k}": v for k, v in metrics.items() if k.startswith(keep)}


def sampled_accuracy(
    engine: RolloutEngine,
    tokenizer,
    prompts: Sequence[str],
    gold: Sequence[int],
    *,
    n: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    constraint: AnswerGrammar | None = None,
) -> dict[str, float]:
    """``vote_accuracy`` of n sampled answers per pair."""
    ids = encode_prompts(tokenizer, prompts)
    rollout = engine.generate(
        ids, n=n, temperatures=temperature, max_new_tokens=max_new_tokens, seed=seed, constraint=constraint
    )
    grades = [parse_grade(t) for t in rollout.texts]
    return vote_accuracy([grades[i * n : (i + 1) * n] for i in range(len(prompts))], gold)


def vote_accuracy(votes: Sequence[Sequence[int | None]], gold: Sequence[int]) -> dict[str, float]:
    """``pass@1``: the share of correct votes (the expected reward); ``maj@n``: the accuracy of the
    majority-voted grade (ties to the lower grade), what annotation with n votes labels."""
    n = len(votes[0])
    correct = sum(g == gold[i] for i, pair_votes in enumerate(votes) for g in pair_votes)
    voted = sum(maj_at_k(pair_votes, gold[i], n, tie="lowest") for i, pair_votes in enumerate(votes))
    return {"pass@1": correct / (n * len(votes)), f"maj@{n}": voted / len(votes)}
