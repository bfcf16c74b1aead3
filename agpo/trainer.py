"""The RL trainer: one explicit loop, rollout -> reward -> advantage -> loss -> step.

Per training step:
 1. take ``prompts_per_step`` prompts from a seeded, resumable sampler;
 2. adaptive AGPO only: sample a probe group per prompt at tau_base, score it, and let the controllers
    choose each prompt's temperature (probe tokens count in the generated-token budget);
 3. sample G responses per prompt with the rollout engine and score them with the reward callable;
    optional DAPO switches: overlong penalty, dynamic sampling (drop groups whose rewards are all equal
    and refill from the next prompts), masking of truncated responses;
 4. advantages with any registered estimator (sequence level, broadcast over response tokens);
 5. recompute old log-probs (and reference log-probs when ``kl_coef > 0``) with the training model; with
    one PPO epoch (and no adaptive controller) old = current, taken detached from the gradient pass;
 6. ``ppo_epochs`` passes, each one optimizer step over the whole rollout batch split into micro-batches
    (losses weighted so that the accumulated gradient equals the full-batch aggregation), gradient
    clipping, AdamW, LR schedule; adaptive AGPO clips each prompt with its own range and updates its
    step-KL EMA afterwards;
 7. the engine is synced to the new weights; metrics leave through the injected callback;
 8. every ``checkpoint_every`` steps a checkpoint (durable.checkpoint) is written atomically; ``restore``
    continues a run from one with the same following metrics as a run that was never stopped.

Data parallel (``deepspeed_config`` given, launched by torchrun): every rank draws the same prompts and
keeps its contiguous share of whole groups; each prompt's samples are seeded by its global position, so
the ranks together sample exactly what one process would (see agpo.rollout.hf). Token counts, loss
normalisers and metrics are summed over ranks (agpo.distributed).

Rollout correction: the engine's log-probs of the sampled tokens are kept; their mean absolute
difference from the trainer's is the ``rollout_logprob_abs_diff`` metric, and ``loss.rollout_is_cap``
weights each token's loss by the truncated importance ratio min(pi_old / pi_rollout, cap).

Sequences are laid out as [left-padded prompt | right-padded response] so every response starts at the
same column; position ids come from the attention mask, as in generation. The G responses of a prompt
share it: each distinct prompt of a micro-batch is run through the model once, with gradient, and its
key/value cache feeds all its rows (a GRPO batch is mostly prompt tokens; computing them G times is what
a plain batched forward does). Log-probs are taken on
logits / temperature of each row, the distribution the engine sampled from.
"""

from __future__ import annotations

import copy
import hashlib
import random
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agpo.adaptive import (
    ADAPTIVE_AGPO,
    AdaptiveConfig,
    AdaptiveController,
    ProbeStats,
    advantage_rule,
    algorithm_names,
    group_probe_statistics,
)
from agpo.advantages import compute_advantage, validate_estimator_params
from agpo.checks import require_choice, require_int, require_ints, require_positive
from agpo.distributed import DeepSpeedUpdater, LocalUpdater
from agpo.losses import PolicyLossConfig, entropy_from_logits, policy_loss, truncated_is_weights
from agpo.models import cache_argument, save_model
from agpo.optim import SCHEDULES, build_optimizer
from agpo.rollout.base import FINISH_LENGTH, Rollout, RolloutEngine, encode_prompts
from agpo.rollout.hf import HFRolloutEngine
from durable.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

RewardFn = Callable[..., list[float | None]]
MetricsCallback = Callable[[int, dict[str, float]], None]


@dataclass(frozen=True)
class TrainerConfig:
    """RL trainer settings. Presets in configs/ set these per algorithm."""

    algorithm: str = field(default="agpo", metadata={"help": "advantage estimator name, or adaptive_agpo"})
    advantage_params: dict[str, object] = field(
        default_factory=dict, metadata={"help": "estimator parameters, e.g. {lambda_neg: 0.5, lambda_pos: 1.0}"}
    )
    group_size: int = field(default=8, metadata={"help": "G, responses sampled per prompt"})
    prompts_per_step: int = field(default=8, metadata={"help": "prompts per training step"})
    max_steps: int = field(default=60, metadata={"help": "training steps (the run also stops at token_budget)"})
    token_budget: int | None = field(
        default=None, metadata={"help": "stop once this many tokens were generated (probes count); null: no cap"}
    )
    ppo_epochs: int = field(default=1, metadata={"help": "optimizer steps per rollout batch"})
    micro_batch_size: int = field(default=32, metadata={"help": "sequences per forward/backward pass"})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW peak learning rate"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    lr_schedule: str = field(default="constant", metadata={"help": f"one of {list(SCHEDULES)}"})
    warmup_steps: int = field(default=0, metadata={"help": "linear LR warm-up steps"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (adaptive_agpo: its tau_base)"})
    max_new_tokens: int = field(default=32, metadata={"help": "longest response in tokens"})
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "DAPO: drop groups with all-equal rewards and refill from new prompts"}
    )
    max_refill_rounds: int = field(default=3, metadata={"help": "dynamic sampling: extra generation rounds"})
    overlong_buffer: int = field(
        default=0, metadata={"help": "DAPO soft overlong penalty over the last N tokens before max_new_tokens; 0 off"}
    )
    overlong_penalty: float = field(default=1.0, metadata={"help": "largest overlong penalty (reward units)"})
    mask_truncated: bool = field(
        default=False, metadata={"help": "exclude responses cut at max_new_tokens from the loss"}
    )
    correct_threshold: float = field(
        default=1.0, metadata={"help": "reward at or above which a response counts as correct"}
    )
    eval_every: int = field(default=10, metadata={"help": "steps between evaluations (0: only at start and end)"})
    seed: int = field(default=0, metadata={"help": "seed of prompt order and sampling"})
    checkpoint_every: int = field(
        default=0, metadata={"help": "steps between checkpoints (also one at the end); 0: no checkpoints"}
    )
    keep_checkpoints: int = field(default=2, metadata={"help": "newest checkpoints kept on disk"})
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig, metadata={"help": "policy loss"})
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig, metadata={"help": "adaptive AGPO controllers"})

    def __post_init__(self) -> None:
        if self.algorithm not in algorithm_names():
            raise ValueError(f"unknown algorithm {self.algorithm!r}; known: {', '.join(algorithm_names())}")
        if self.algorithm != ADAPTIVE_AGPO:
            validate_estimator_params(self.algorithm, self.advantage_params)
        elif self.advantage_params:
            raise ValueError("adaptive_agpo uses its own advantage; advantage_params must be empty")
        positive = ("group_size", "prompts_per_step", "max_steps", "ppo_epochs", "micro_batch_size", "max_new_tokens")
        require_ints(self, positive, 1)
        require_ints(
            self, ("warmup_steps", "max_refill_rounds", "overlong_buffer", "eval_every", "checkpoint_every"), 0
        )
        require_int("keep_checkpoints", self.keep_checkpoints, 1)
        if self.token_budget is not None:
            require_int("token_budget", self.token_budget, 1)
        require_positive(learning_rate=self.learning_rate)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        require_choice("lr_schedule", self.lr_schedule, SCHEDULES)
        if self.overlong_buffer >= self.max_new_tokens:
            raise ValueError(
                f"overlong_buffer ({self.overlong_buffer}) must be smaller than max_new_tokens ({self.max_new_tokens})"
            )

    @property
    def adaptive_mode(self) -> bool:
        return self.algorithm == ADAPTIVE_AGPO


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


@dataclass
class RolloutBatch:
    """One step's scored responses, flattened prompt-major."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    rewards: list[float]
    group_ids: list[int]
    temperatures: list[float]
    finish_reasons: list[str]
    answers: list[Hashable | None]
    rollout_logprobs: list[list[float]]
    probe_stats: dict[int, ProbeStats] = field(default_factory=dict)  # adaptive AGPO, by group id

    PER_ROW = (
        "prompt_ids",
        "response_ids",
        "rewards",
        "group_ids",
        "temperatures",
        "finish_reasons",
        "answers",
        "rollout_logprobs",
    )

    def extend(self, other: RolloutBatch) -> None:
        for name in self.PER_ROW:
            getattr(self, name).extend(getattr(other, name))
        self.probe_stats.update(other.probe_stats)

    def select(self, rows: list[int]) -> RolloutBatch:
        kept = {name: [getattr(self, name)[i] for i in rows] for name in self.PER_ROW}
        groups = set(kept["group_ids"])
        return RolloutBatch(**kept, probe_stats={g: s for g, s in self.probe_stats.items() if g in groups})

    def __len__(self) -> int:
        return len(self.response_ids)


@dataclass
class TrainResult:
    steps: int
    generated_tokens: int
    history: list[dict[str, float]]


class RLTrainer:
    """Group-relative policy optimisation of a causal LM on verifiable rewards."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        engine: RolloutEngine,
        reward_fn: RewardFn,
        prompts: Sequence[str],
        columns: dict[str, Sequence[object]],
        config: TrainerConfig,
        *,
        answer_fn: Callable[[str], Hashable | None] = str.strip,
        callback: MetricsCallback | None = None,
        evaluate: Callable[[], dict[str, float]] | None = None,
        progress: bool = True,
        checkpoint_dir: str | Path | None = None,
        deepspeed_config: dict[str, Any] | None = None,
    ) -> None:
        for name, values in columns.items():
            if len(values) != len(prompts):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(prompts)} prompts")
        self.model, self.tokenizer, self.engine = model, tokenizer, engine
        self.reward_fn, self.answer_fn = reward_fn, answer_fn
        self.prompts = list(prompts)
        self.prompt_ids = encode_prompts(tokenizer, self.prompts)
        self.columns = {k: list(v) for k, v in columns.items()}
        self.config = config
        self.callback, self.evaluate, self.progress = callback, evaluate, progress
        self.sampler = PromptSampler(len(self.prompts), config.seed)
        optimizer, self.scheduler = build_optimizer(
            model,
            learning_rate=config.learning_rate,
            weight_decay=config.weight_decay,
            total_steps=config.max_steps,
            warmup_steps=config.warmup_steps,
            schedule=config.lr_schedule,
        )
        self.controller = AdaptiveController(config.adaptive) if config.adaptive_mode else None
        self.reference = self._frozen_copy(model) if config.loss.kl_coef > 0 else None
        if deepspeed_config is None:
            self.updater: LocalUpdater | DeepSpeedUpdater = LocalUpdater(model, optimizer, config.max_grad_norm)
        else:
            self.updater = DeepSpeedUpdater(model, optimizer, config.max_grad_norm, deepspeed_config)
        self._check_parallel_and_checkpoint_settings(checkpoint_dir, deepspeed_config)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.step_count = 0
        self.generated_tokens = 0
        self.groups_generated = 0  # running id, so refill rounds never reuse a group id
        self.generate_calls = 0  # seeds each engine call: probes, rollouts and refills all differ
        self._local_tokens = 0  # generated by this rank in the current step

    def _check_parallel_and_checkpoint_settings(self, checkpoint_dir, deepspeed_config) -> None:
        config, world = self.config, self.updater.world_size
        if config.checkpoint_every and checkpoint_dir is None:
            raise ValueError("checkpoint_every > 0 needs a checkpoint folder (checkpoint_dir)")
        if config.checkpoint_every and deepspeed_config is not None:
            raise ValueError("checkpoints under DeepSpeed are not supported yet: set checkpoint_every to 0")
        if world == 1:
            return
        if config.prompts_per_step % world:
            raise ValueError(f"prompts_per_step ({config.prompts_per_step}) must divide evenly over {world} ranks")
        if config.dynamic_sampling or config.adaptive_mode:
            raise ValueError("dynamic_sampling and adaptive_agpo run in one process only (their state is per batch)")
        if getattr(self.updater, "zero_stage", 0) == 3 and isinstance(self.engine, HFRolloutEngine):
            raise ValueError(
                "ZeRO-3 over several ranks needs a rollout engine with its own copy of the weights (engine: vllm); "
                "the hf engine would generate through partitioned parameters out of lock-step"
            )

    @property
    def is_main_process(self) -> bool:
        """Rank 0: the process that writes outputs."""
        return self.updater.rank == 0

    def save_model(self, directory: str | Path) -> Path:
        """Save the policy and tokenizer (safetensors) from rank 0. Call it on every rank: under ZeRO-3 the
        parameters are partitioned and gathering them is a collective."""
        directory = Path(directory)
        with self.updater.full_weights():
            if self.is_main_process:
                save_model(self.model, self.tokenizer, directory)
        return directory

    # ------------------------------------------------------------------ checkpoints

    def fingerprint(self) -> dict[str, object]:
        """What a checkpoint must share with this run to be resumed by it."""
        shapes = ";".join(f"{name}:{tuple(p.shape)}" for name, p in self.model.state_dict().items())
        config = self.config
        return {
            "model_shapes": hashlib.sha256(shapes.encode()).hexdigest()[:16],
            "prompts": hashlib.sha256("\x00".join(self.prompts).encode()).hexdigest()[:16],
            "algorithm": config.algorithm,
            "group_size": config.group_size,
            "prompts_per_step": config.prompts_per_step,
            "seed": config.seed,
            "world_size": self.updater.world_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, data cursor, LR schedule and controller state (JSON-compatible)."""
        return {
            "step_count": self.step_count,
            "generated_tokens": self.generated_tokens,
            "groups_generated": self.groups_generated,
            "generate_calls": self.generate_calls,
            "sampler": self.sampler.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "controller": self.controller.state_dict() if self.controller is not None else None,
        }

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (atomic; older ones pruned to ``keep_checkpoints``)."""
        if self.checkpoint_dir is None:
            raise ValueError("this trainer has no checkpoint folder (checkpoint_dir)")
        return save_checkpoint(
            self.checkpoint_dir,
            self.step_count,
            model=self.model,
            optimizer_state=self.updater.optimizer_state(),
            trainer_state=self.state_dict(),
            fingerprint=self.fingerprint(),
            keep_last=self.config.keep_checkpoints,
        )

    def restore(self, path: str | Path | None = None) -> int | None:
        """Continue from checkpoint ``path`` (default: the newest in ``checkpoint_dir``); returns its step.

        Returns None when there is nothing to resume. Raises ``CheckpointError`` for a corrupt, truncated
        or foreign checkpoint.
        """
        if path is None:
            path = latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir is not None else None
            if path is None:
                return None
        checkpoint, optimizer_state = load_checkpoint(path, model=self.model, fingerprint=self.fingerprint())
        self.updater.load_optimizer_state(optimizer_state)
        state = checkpoint.trainer_state
        self.step_count = state["step_count"]
        self.generated_tokens = state["generated_tokens"]
        self.groups_generated = state["groups_generated"]
        self.generate_calls = state["generate_calls"]
        self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.controller is not None:
            self.controller.load_state_dict(state["controller"])
        self.engine.sync_weights(self.model)
        return checkpoint.step

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        reference = copy.deepcopy(model).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
        return reference

    # ------------------------------------------------------------------ loop

    def train(self) -> TrainResult:
        """Run until ``max_steps`` or the token budget; returns every step's metrics."""
        config = self.config
        history: list[dict[str, float]] = []
        if self.evaluate is not None and self.step_count == 0:
            self._emit(0, {f"eval/{k}": v for k, v in self.evaluate().items()}, history)
        bar = tqdm(total=config.max_steps, initial=self.step_count, desc=f"RL {config.algorithm}", unit="step",
                   disable=not (self.progress and self.is_main_process), mininterval=1.0)  # fmt: skip
        with bar:
            while self.step_count < config.max_steps and not self._budget_spent():
                metrics = self.step()
                last = self.step_count == config.max_steps or self._budget_spent()
                due = config.eval_every and self.step_count % config.eval_every == 0
                if self.evaluate is not None and (due or last):
                    metrics.update({f"eval/{k}": v for k, v in self.evaluate().items()})
                self._emit(self.step_count, metrics, history)
                if config.checkpoint_every and (self.step_count % config.checkpoint_every == 0 or last):
                    self.save_checkpoint()
                bar.update()
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", tokens=self.generated_tokens, refresh=False)
        return TrainResult(self.step_count, self.generated_tokens, history)

    def _budget_spent(self) -> bool:
        return self.config.token_budget is not None and self.generated_tokens >= self.config.token_budget

    def _emit(self, step: int, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
        history.append({"step": step, **metrics})
        if self.callback is not None:
            self.callback(step, metrics)

    def step(self) -> dict[str, float]:
        """One training step; returns its metrics (summed over data-parallel ranks)."""
        started = time.perf_counter()
        self._local_tokens = 0
        batch, rollout_stats, timing = self._collect()
        advantages = self._advantages(batch)
        update_started = time.perf_counter()
        update_metrics = self._update(batch, advantages)
        with self.updater.full_weights():
            self.engine.sync_weights(self.model)
        self.step_count += 1
        timing["update"] = time.perf_counter() - update_started
        elapsed = time.perf_counter() - started
        rows = self._row_statistics(batch)
        step_tokens = int(rows["tokens"])
        self.generated_tokens += step_tokens
        metrics = {
            **{k: v for k, v in rows.items() if k != "tokens"},
            "generated_tokens": float(self.generated_tokens),
            "step_tokens": float(step_tokens),
            "lr": self.scheduler.get_last_lr()[0],
            "time_rollout": timing["rollout"],
            "time_reward": timing["reward"],
            "time_update": timing["update"],
            "time_step": elapsed,
            "tokens_per_s": step_tokens / elapsed,
            **rollout_stats,
            **update_metrics,
        }
        return metrics

    def _row_statistics(self, batch: RolloutBatch) -> dict[str, float]:
        """Reward, accuracy, length and group-outcome shares of the whole step, over all ranks."""
        threshold = self.config.correct_threshold
        grouped = list(_rewards_by_group(batch).values())
        sums = self.updater.all_reduce_sum(
            [
                len(batch),
                sum(batch.rewards),
                sum(r * r for r in batch.rewards),
                sum(r >= threshold for r in batch.rewards),
                sum(a is None for a in batch.answers),
                sum(len(r) for r in batch.response_ids),
                sum(f == FINISH_LENGTH for f in batch.finish_reasons),
                sum(batch.temperatures),
                len(grouped),
                sum(all(r >= threshold for r in g) for g in grouped),
                sum(all(r < threshold for r in g) for g in grouped),
                self._local_tokens,
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

    # ------------------------------------------------------------------ rollout

    def _collect(self) -> tuple[RolloutBatch, dict[str, float], dict[str, float]]:
        config = self.config
        timing = {"rollout": 0.0, "reward": 0.0}
        batch = self._generate_groups(self._take_prompts(config.prompts_per_step), timing)
        stats: dict[str, float] = {}
        if config.dynamic_sampling:
            groups_total = config.prompts_per_step
            batch = self._drop_uniform_groups(batch)
            rounds = 0
            while len(set(batch.group_ids)) < config.prompts_per_step and rounds < config.max_refill_rounds:
                missing = config.prompts_per_step - len(set(batch.group_ids))
                extra = self._drop_uniform_groups(self._generate_groups(self._take_prompts(missing), timing))
                batch.extend(extra)
                groups_total += missing
                rounds += 1
            kept = len(set(batch.group_ids))
            stats.update({"groups_kept": float(kept), "groups_dropped": float(groups_total - kept)})
            if kept == 0:  # nothing to learn from: keep one generation's groups so the step stays defined
                batch = self._generate_groups(self._take_prompts(config.prompts_per_step), timing)
        return batch, stats, timing

    def _take_prompts(self, count: int) -> tuple[list[int], int]:
        """This rank's share of the next ``count`` prompts, and the global position of its first one."""
        indices = self.sampler.take(count)
        share = count // self.updater.world_size
        first = self.updater.rank * share
        return indices[first : first + share], first

    def _generate_groups(self, taken: tuple[list[int], int], timing: dict[str, float]) -> RolloutBatch:
        config = self.config
        indices, first_position = taken
        ids = [self.prompt_ids[i] for i in indices]
        positions = [first_position + i for i in range(len(indices))]
        temperatures: list[float] = [config.temperature] * len(indices)
        probe_stats = None
        if self.controller is not None:
            started = time.perf_counter()
            probe = self._generate(ids, [config.adaptive.tau_base] * len(indices), positions)
            timing["rollout"] += time.perf_counter() - started
            probe_rewards, probe_answers = self._score(probe, indices, timing)
            probe_stats = group_probe_statistics(
                probe_rewards, probe_answers, config.group_size, config.adaptive.dispersion
            )
            temperatures = self.controller.temperatures(probe_stats)
        started = time.perf_counter()
        rollout = self._generate(ids, temperatures, positions)
        timing["rollout"] += time.perf_counter() - started
        rewards, answers = self._score(rollout, indices, timing)
        rewards = self._shape_overlong(rewards, rollout)
        first_group = self.groups_generated + first_position  # global ids: the same on every rank layout
        self.groups_generated += len(indices) * self.updater.world_size
        return RolloutBatch(
            prompt_ids=[ids[i] for i in rollout.prompt_index],
            response_ids=rollout.token_ids,
            rewards=rewards,
            group_ids=[first_group + i for i in rollout.prompt_index],
            temperatures=[temperatures[i] for i in rollout.prompt_index],
            finish_reasons=rollout.finish_reasons,
            answers=answers,
            rollout_logprobs=rollout.logprobs,
            probe_stats={first_group + i: s for i, s in enumerate(probe_stats)} if probe_stats else {},
        )

    def _generate(self, ids: list[list[int]], temperatures: list[float], positions: list[int]) -> Rollout:
        """Sample G responses per prompt; a prompt's seed comes from the call count and its global position."""
        config = self.config
        call_seed = (config.seed * 1_000_003 + self.generate_calls) * 1_000_003
        self.generate_calls += 1
        rollout = self.engine.generate(
            ids,
            n=config.group_size,
            temperatures=temperatures,
            max_new_tokens=config.max_new_tokens,
            seed=[call_seed + p for p in positions],
        )
        self._local_tokens += rollout.num_tokens
        return rollout

    def _score(
        self, rollout: Rollout, indices: list[int], timing: dict[str, float]
    ) -> tuple[list[float], list[Hashable | None]]:
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

    def _shape_overlong(self, rewards: list[float], rollout: Rollout) -> list[float]:
        """DAPO soft overlong punishment: r += min(-(L - (L_max - buf)) / buf * penalty, 0)."""
        buffer = self.config.overlong_buffer
        if buffer == 0:
            return rewards
        start = self.config.max_new_tokens - buffer
        return [
            r + min(-(len(ids) - start) / buffer * self.config.overlong_penalty, 0.0)
            for r, ids in zip(rewards, rollout.token_ids, strict=True)
        ]

    @staticmethod
    def _drop_uniform_groups(batch: RolloutBatch) -> RolloutBatch:
        grouped = _rewards_by_group(batch)
        return batch.select([i for i, gid in enumerate(batch.group_ids) if len(set(grouped[gid])) > 1])

    def _advantages(self, batch: RolloutBatch) -> torch.Tensor:
        config = self.config
        name, params = advantage_rule(config.algorithm, config.advantage_params)
        low = -config.overlong_penalty if config.overlong_buffer else 0.0
        return compute_advantage(name, torch.tensor(batch.rewards), batch.group_ids, reward_range=(low, 1.0), **params)

    # ------------------------------------------------------------------ update

    def _update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        config = self.config
        updater, forward_model = self.updater, self.updater.forward_model
        micro = list(range(0, len(batch), config.micro_batch_size))
        tensors = [self._tensors(batch, slice(s, s + config.micro_batch_size)) for s in micro]
        total_tokens, total_seqs = updater.all_reduce_sum([sum(float(t["mask"].sum()) for t in tensors), len(batch)])
        # With one PPO epoch and no adaptive controller, pi_old is the policy being differentiated: its
        # log-probs come detached from the gradient pass (ratio 1, the same gradient) instead of a forward
        # pass of their own, a quarter of the update's compute. Otherwise they are recomputed up front.
        old_from_gradient_pass = config.ppo_epochs == 1 and self.controller is None
        with torch.no_grad():
            old = [] if old_from_gradient_pass else [self._log_probs(forward_model, t) for t in tensors]
            refs = [self._log_probs(self.reference, t)[0] for t in tensors] if self.reference is not None else None
        cap = config.loss.rollout_is_cap
        eps = self._clip_ranges(batch, old, tensors)
        metrics: dict[str, list[float]] = {}
        grad_norms = []
        is_weights: list[torch.Tensor | None] = [None] * len(tensors)  # per micro-batch; fixed across epochs
        self.model.train()
        for _ in range(config.ppo_epochs):
            updater.zero_grad()
            for k, t in enumerate(tensors):
                log_prob, entropy = self._log_probs(forward_model, t)
                if old_from_gradient_pass:
                    old.append((log_prob.detach(), entropy.detach()))
                if cap and is_weights[k] is None:
                    is_weights[k] = truncated_is_weights(old[k][0], t["rollout_logprobs"], cap)
                rows = slice(micro[k], micro[k] + config.micro_batch_size)
                eps_rows = eps[rows] if eps is not None else None
                loss, m = policy_loss(
                    log_prob,
                    old[k][0],
                    advantages[rows],
                    t["mask"],
                    config.loss,
                    ref_log_prob=refs[k] if refs is not None else None,
                    entropy=entropy,
                    eps_low=eps_rows,
                    eps_high=eps_rows,
                    token_weights=is_weights[k],
                )
                token_mode = config.loss.loss_agg_mode == "token-mean"
                weight = float(t["mask"].sum()) / max(total_tokens, 1) if token_mode else len(log_prob) / total_seqs
                updater.backward(loss * weight, last=k == len(tensors) - 1)
                for key, value in m.items():
                    metrics.setdefault(key, []).append(value * weight)
            grad_norms.append(updater.step())
        self.scheduler.step()
        self.model.eval()
        # Micro-batch metrics were weighted like the loss (shares of the global batch), so their sum over
        # micro-batches and ranks is the full-batch value.
        keys = sorted(metrics)
        # Engine vs trainer log-probs of the same tokens: 0 up to numerics when both run the same weights.
        mismatch = sum(
            float(((o[0] - t["rollout_logprobs"]).abs() * t["mask"]).sum()) for o, t in zip(old, tensors, strict=True)
        )
        weight_sum = capped = 0.0
        if cap:
            for weights, t in zip(is_weights, tensors, strict=True):
                weight_sum += float((weights * t["mask"]).sum())
                capped += float(((weights >= cap) * t["mask"]).sum())
        *totals, mismatch, weight_sum, capped = updater.all_reduce_sum(
            [*(sum(metrics[key]) for key in keys), mismatch, weight_sum, capped]
        )
        summary = {key: total / config.ppo_epochs for key, total in zip(keys, totals, strict=True)}
        summary["grad_norm"] = statistics.fmean(grad_norms)
        summary["rollout_logprob_abs_diff"] = mismatch / max(total_tokens, 1)
        if cap:
            summary["rollout_is_weight_mean"] = weight_sum / max(total_tokens, 1)
            summary["rollout_is_capped_frac"] = capped / max(total_tokens, 1)
        if self.controller is not None:
            with torch.no_grad():
                new = [self._log_probs(self.model, t)[0] for t in tensors]
            kl = [
                self.controller.observe_step_kl(o[0], n, t["mask"]) for o, n, t in zip(old, new, tensors, strict=True)
            ]
            summary["step_kl"] = statistics.fmean(kl)
            summary["step_kl_ema"] = self.controller.step_kl_ema
            summary["clip_eps_mean"] = float(eps.mean())
        return summary

    def _clip_ranges(self, batch: RolloutBatch, old: list, tensors: list) -> torch.Tensor | None:
        """Adaptive AGPO: one clip range per prompt group, from its probe statistics and the policy entropy."""
        if self.controller is None:
            return None
        mask_sum = sum(float(t["mask"].sum()) for t in tensors)
        policy_entropy = sum(float((o[1] * t["mask"]).sum()) for o, t in zip(old, tensors, strict=True)) / max(
            mask_sum, 1
        )
        group_order = list(dict.fromkeys(batch.group_ids))
        per_group = self.controller.clip_eps([batch.probe_stats[g] for g in group_order], policy_entropy)
        by_group = dict(zip(group_order, per_group.tolist(), strict=True))
        return torch.tensor([by_group[g] for g in batch.group_ids])

    def _tensors(self, batch: RolloutBatch, rows: slice) -> dict[str, torch.Tensor]:
        """[left-padded prompt | right-padded response] for the rows of one micro-batch."""
        prompts, responses = batch.prompt_ids[rows], batch.response_ids[rows]
        p_width = max(len(p) for p in prompts)
        r_width = max(1, max(len(r) for r in responses))
        pad = self.tokenizer.pad_token_id
        size = len(prompts)
        input_ids = torch.full((size, p_width + r_width), pad, dtype=torch.long)
        attention = torch.zeros((size, p_width + r_width), dtype=torch.long)
        mask = torch.zeros((size, r_width))
        rollout_logprobs = torch.zeros((size, r_width))
        for i, (p, r, lp) in enumerate(zip(prompts, responses, batch.rollout_logprobs[rows], strict=True)):
            rollout_logprobs[i, : len(lp)] = torch.tensor(lp)
            input_ids[i, p_width - len(p) : p_width] = torch.tensor(p)
            input_ids[i, p_width : p_width + len(r)] = torch.tensor(r, dtype=torch.long)
            attention[i, p_width - len(p) : p_width + len(r)] = 1
            mask[i, : len(r)] = 1.0
        if self.config.mask_truncated:
            truncated = torch.tensor([f == FINISH_LENGTH for f in batch.finish_reasons[rows]])
            mask[truncated] = 0.0
        temperatures = torch.tensor(batch.temperatures[rows])
        distinct: dict[tuple[int, ...], int] = {}
        prompt_of_row, first_row_of_prompt = [], []
        for row, p in enumerate(prompts):
            if tuple(p) not in distinct:
                distinct[tuple(p)] = len(distinct)
                first_row_of_prompt.append(row)
            prompt_of_row.append(distinct[tuple(p)])
        return {
            "input_ids": input_ids,
            "attention": attention,
            "mask": mask,
            "temperature": temperatures,
            "rollout_logprobs": rollout_logprobs,
            "prompt_rows": torch.tensor(first_row_of_prompt),
            "prompt_of_row": torch.tensor(prompt_of_row),
        }

    @staticmethod
    def _log_probs(model: torch.nn.Module, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs and entropies [B, R] of the response tokens at each row's temperature."""
        r_width = t["mask"].shape[1]
        device = next(model.parameters()).device
        input_ids, attention = t["input_ids"].to(device), t["attention"].to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        prefix = input_ids.shape[1] - r_width - 1  # the prompt but its last token
        prompt_rows = t["prompt_rows"].to(device)
        if len(prompt_rows) == len(input_ids) or prefix < 1:
            logits = model(
                input_ids=input_ids, attention_mask=attention, position_ids=positions, logits_to_keep=r_width + 1
            ).logits[:, :-1]
        else:
            # The G rows of a group share their prompt: each distinct prompt goes through the model once
            # (with gradient) and every row continues from its prompt's key/value cache.
            prompt_output = model(
                input_ids=input_ids[prompt_rows, :prefix],
                attention_mask=attention[prompt_rows, :prefix],
                position_ids=positions[prompt_rows, :prefix],
                use_cache=True,
            )
            cache = getattr(prompt_output, cache_argument(model))
            cache.batch_select_indices(t["prompt_of_row"].to(device))
            logits = model(
                input_ids=input_ids[:, prefix:],
                attention_mask=attention,
                position_ids=positions[:, prefix:],
                **{cache_argument(model): cache},
            ).logits[:, :-1]
        logits = logits.float() / t["temperature"].to(device)[:, None, None]
        targets = t["input_ids"][:, -r_width:].to(device)
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
        return log_probs.cpu(), entropy_from_logits(logits).cpu()


def _rewards_by_group(batch: RolloutBatch) -> dict[int, list[float]]:
    groups: dict[int, list[float]] = {}
    for gid, reward in zip(batch.group_ids, batch.rewards, strict=True):
        groups.setdefault(gid, []).append(reward)
    return groups
