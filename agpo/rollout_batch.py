"""One step's training data: which prompts it takes, and the scored groups of responses sampled for them.

- :class:`PromptSampler`: seeded passes over the prompts, reshuffled every epoch; its cursor is a plain dict
  (it travels in checkpoints).
- :class:`RolloutBatch` (agpo.step_interfaces): the step's responses, flattened prompt-major: G rows per prompt group.
- :class:`RolloutCollector`: per step, takes ``rollout.prompts_per_step`` prompts, lets the step hooks choose each
  prompt's temperature (adaptive AGPO samples a probe group first), samples G responses per prompt with the
  rollout engine and scores them with the reward callable. DAPO options: the soft overlong penalty
  r += min(-(L - (L_max - buf)) / buf * penalty, 0), and dynamic sampling, which drops groups whose verifiable
  scores are all equal and refills from the next prompts for up to ``dapo.max_refill_rounds`` rounds. If the
  rounds run out short of ``rollout.prompts_per_step`` groups, ``dapo.dynamic_sampling_short_batch`` decides:
  "log" trains on the smaller batch and reports ``dynamic_sampling_short_batch`` = 1 and
  ``dynamic_sampling_rows_short`` (the rows of the missing groups), "raise" stops with an error. (When no group
  at all is kept, "log" trains on one fresh generation's groups so the step stays defined.)

Each row carries two numbers (docs/algorithms.md section 4): ``scores``, the verifiable score from the reward
callable, which decides correct vs wrong (dynamic sampling's "all equal" test, the accuracy and
group-outcome statistics of :func:`batch_statistics`, and the correct/wrong split of ``agpo`` and
``w_reinforce``); and ``rewards``, the score shaped by the overlong penalty, the value that enters the
advantage. A correct but long answer stays correct.

Data parallel: every rank draws the same prompts and keeps its contiguous share of whole groups; each
prompt's samples are seeded by the call count and its global position, so the ranks together sample exactly
what one process would (see agpo.rollout.hf). Group ids are global too.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

from agpo.rollout.base import FINISH_LENGTH, Rollout, RolloutEngine
from agpo.step_interfaces import RolloutBatch, StepHooks

if TYPE_CHECKING:
    from agpo.trainer_config import TrainerConfig

RewardFn = Callable[..., list[float | None]]
Timing = dict[str, float]


class PromptSampler:
    """Seeded passes over ``size`` prompts, reshuffled every epoch; its cursor is a plain dict."""

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("the trainer needs at least one prompt")
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def take(self, count: int) -> list[int]:
        taken = []
        while len(taken) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            taken.append(self._order[self.position])
            self.position += 1
        return taken

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._permutation(self.epoch)


def scores_by_group(batch: RolloutBatch) -> dict[int, list[float]]:
    """Each group's verifiable scores, by group id."""
    groups: dict[int, list[float]] = {}
    for gid, score in zip(batch.group_ids, batch.scores, strict=True):
        groups.setdefault(gid, []).append(score)
    return groups


def drop_uniform_groups(batch: RolloutBatch) -> RolloutBatch:
    """The rows of the groups whose verifiable scores are not all equal (their lengths, and so their shaped
    rewards, may differ: that is no signal of correctness)."""
    grouped = scores_by_group(batch)
    return batch.select([i for i, gid in enumerate(batch.group_ids) if len(set(grouped[gid])) > 1])


class RolloutCollector:
    """Samples and scores each step's groups; its counters (``groups_generated``, ``generate_calls``) are part
    of the trainer's checkpoint state."""

    def __init__(
        self,
        *,
        prompts: Sequence[str],
        prompt_ids: Sequence[list[int]],
        columns: dict[str, list[object]],
        reward_fn: RewardFn,
        answer_fn: Callable[[str], Hashable | None],
        sampler: PromptSampler,
        hooks: StepHooks,
        config: TrainerConfig,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.prompts, self.prompt_ids, self.columns = prompts, prompt_ids, columns
        self.reward_fn, self.answer_fn = reward_fn, answer_fn
        self.sampler, self.hooks, self.config = sampler, hooks, config
        self.rank, self.world_size = rank, world_size
        self.groups_generated = 0  # running id, so refill rounds never reuse a group id
        self.generate_calls = 0  # seeds each engine call: probes, rollouts and refills all differ
        self.local_tokens = 0  # generated by this rank in the current step (probes included)

    def collect(self, engine: RolloutEngine) -> tuple[RolloutBatch, dict[str, float], Timing]:
        """This rank's share of the step's batch, dynamic-sampling statistics and rollout / reward seconds."""
        wanted, dapo = self.config.rollout.prompts_per_step, self.config.dapo
        self.local_tokens = 0
        timing = {"rollout": 0.0, "reward": 0.0}
        batch = self._groups(engine, wanted, timing)
        if not dapo.dynamic_sampling:
            return batch, {}, timing
        groups_total = wanted
        batch = drop_uniform_groups(batch)
        rounds = 0
        while len(set(batch.group_ids)) < wanted and rounds < dapo.max_refill_rounds:
            missing = wanted - len(set(batch.group_ids))
            batch.extend(drop_uniform_groups(self._groups(engine, missing, timing)))
            groups_total += missing
            rounds += 1
        kept = len(set(batch.group_ids))
        missing = wanted - kept
        if missing and dapo.dynamic_sampling_short_batch == "raise":
            raise RuntimeError(
                f"dynamic sampling kept {kept} of {wanted} prompt groups after {dapo.max_refill_rounds} refill "
                "rounds (the others scored all correct or all wrong); raise dapo.max_refill_rounds, or set "
                "dapo.dynamic_sampling_short_batch: log to train on the smaller batch"
            )
        stats = {
            "groups_kept": float(kept),
            "groups_dropped": float(groups_total - kept),
            "dynamic_sampling_short_batch": float(missing > 0),
            "dynamic_sampling_rows_short": float(missing * self.config.rollout.group_size),
        }
        if kept == 0:  # nothing to learn from: keep one generation's groups so the step stays defined
            batch = self._groups(engine, wanted, timing)
        return batch, stats, timing

    def _groups(self, engine: RolloutEngine, count: int, timing: Timing) -> RolloutBatch:
        """G scored responses for each of this rank's share of the next ``count`` prompts."""
        indices = self.sampler.take(count)
        share = count // self.world_size
        first_position = self.rank * share
        indices = indices[first_position : first_position + share]
        ids = [self.prompt_ids[i] for i in indices]
        positions = [first_position + i for i in range(len(indices))]

        def probe(temperature: float) -> tuple[list[float], list[Hashable | None], list[str]]:
            probes = self._generate(engine, ids, [temperature] * len(ids), positions, timing)
            return *self._score(probes, indices, timing), probes.texts

        temperatures, probe_stats = self.hooks.choose_temperatures(self.config.rollout.temperature, len(ids), probe)
        rollout = self._generate(engine, ids, temperatures, positions, timing)
        scores, answers = self._score(rollout, indices, timing)
        first_group = self.groups_generated + first_position  # global ids: the same on every rank layout
        self.groups_generated += len(indices) * self.world_size
        return RolloutBatch(
            prompt_ids=[ids[i] for i in rollout.prompt_index],
            response_ids=rollout.token_ids,
            rewards=self._shape_overlong(scores, rollout),
            scores=scores,
            group_ids=[first_group + i for i in rollout.prompt_index],
            temperatures=[temperatures[i] for i in rollout.prompt_index],
            finish_reasons=rollout.finish_reasons,
            answers=answers,
            rollout_logprobs=rollout.logprobs,
            probe_stats={first_group + i: s for i, s in enumerate(probe_stats)},
        )

    def _generate(
        self,
        engine: RolloutEngine,
        ids: list[list[int]],
        temperatures: list[float],
        positions: list[int],
        timing: Timing,
    ) -> Rollout:
        """Sample G responses per prompt; a prompt's seed comes from the call count and its global position."""
        started = time.perf_counter()
        config = self.config
        call_seed = (config.seed * 1_000_003 + self.generate_calls) * 1_000_003
        self.generate_calls += 1
        rollout = engine.generate(
            ids,
            n=config.rollout.group_size,
            temperatures=temperatures,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=[call_seed + p for p in positions],
        )
        self.local_tokens += rollout.num_tokens
        timing["rollout"] += time.perf_counter() - started
        return rollout

    def _score(self, rollout: Rollout, indices: list[int], timing: Timing) -> tuple[list[float], list[Hashable | None]]:
        """Verifiable scores (every one must be a number) and extracted answers of a rollout's responses."""
        started = time.perf_counter()
        rows = [indices[i] for i in rollout.prompt_index]
        columns = {name: [values[r] for r in rows] for name, values in self.columns.items()}
        rewards = self.reward_fn([self.prompts[r] for r in rows], rollout.texts, **columns)
        missing = [rows[i] for i, r in enumerate(rewards) if r is None]
        if missing:
            raise ValueError(
                f"the reward function returned None for prompt #{missing[0]} ({self.prompts[missing[0]][:80]!r}): "
                "training prompts need a verifiable gold value"
            )
        answers = [self.answer_fn(text) for text in rollout.texts]
        timing["reward"] += time.perf_counter() - started
        return [float(r) for r in rewards], answers

    def _shape_overlong(self, scores: list[float], rollout: Rollout) -> list[float]:
        """The shaped rewards, DAPO's soft overlong punishment:
        r = score + min(-(L - (L_max - buf)) / buf * penalty, 0)."""
        buffer = self.config.dapo.overlong_buffer
        if buffer == 0:
            return list(scores)
        start = self.config.rollout.max_new_tokens - buffer
        return [
            score + min(-(len(ids) - start) / buffer * self.config.dapo.overlong_penalty, 0.0)
            for score, ids in zip(scores, rollout.token_ids, strict=True)
        ]


def batch_statistics(
    batch: RolloutBatch,
    correct_threshold: float,
    local_tokens: int,
    all_reduce_sum: Callable[[list[float]], list[float]],
) -> dict[str, float]:
    """Reward, accuracy, length and group-outcome shares of the whole step, summed over ranks; ``tokens`` is
    the step's generated-token count (probes included). The reward mean and std are of the shaped rewards;
    accuracy and the all-correct / all-wrong group shares count correct answers by their verifiable scores."""
    threshold = correct_threshold
    grouped = list(scores_by_group(batch).values())
    sums = all_reduce_sum(
        [
            len(batch),
            sum(batch.rewards),
            sum(r * r for r in batch.rewards),
            sum(s >= threshold for s in batch.scores),
            sum(a is None for a in batch.answers),
            sum(len(r) for r in batch.response_ids),
            sum(f == FINISH_LENGTH for f in batch.finish_reasons),
            sum(batch.temperatures),
            len(grouped),
            sum(all(r >= threshold for r in g) for g in grouped),
            sum(all(r < threshold for r in g) for g in grouped),
            local_tokens,
        ]
    )
    rows, total, squares, correct, unparseable, length, truncated, temps, groups, all_ok, all_bad, tokens = sums
    mean = total / rows
    variance = max(squares - rows * mean * mean, 0.0) / (rows - 1) if rows > 1 else 0.0
    return {
        "reward_mean": mean,
        "reward_std": variance**0.5,
        "accuracy": correct / rows,
        "unparseable_frac": unparseable / rows,
        "response_length_mean": length / rows,
        "truncated_frac": truncated / rows,
        "temperature_mean": temps / rows,
        "all_correct_frac": all_ok / groups,
        "all_wrong_frac": all_bad / groups,
        "tokens": tokens,
    }
