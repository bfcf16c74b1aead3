"""The RL trainer: one explicit loop, rollout -> reward -> advantage -> loss -> step.

Per training step (:meth:`RLTrainer.step`), three public phases a caller or a test can run alone (``collect``,
``advantages``, ``update``; ``micro_batch`` gives one micro-batch's tensors):
 1. collect (agpo.rollout_batch): take ``rollout.prompts_per_step`` prompts from a seeded, resumable sampler; the
    step hooks choose each prompt's temperature (adaptive AGPO: from a probe group sampled at tau_base and
    scored; probe tokens count in the generated-token budget); sample G responses per prompt with the
    rollout engine and score them with the reward callable; DAPO options: overlong penalty, dynamic
    sampling (drop groups whose verifiable scores are all equal and refill from the next prompts; a batch
    left short is logged or raises, per ``dapo.dynamic_sampling_short_batch``);
 2. advantages with any registered estimator (sequence level, broadcast over response tokens): the shaped
    reward is the value, the verifiable score decides correct vs wrong (``agpo``, ``w_reinforce``) against
    the trainer's ``advantage.correct_threshold``, the one the accuracy metrics use;
 3. update (:meth:`RLTrainer.update`), every pass with dropout off (eval mode, as the engine samples): old
    log-probs (and reference log-probs when ``loss.kl_coef > 0``) from the training model; with one PPO epoch
    and no hook that reads them first, old = current, taken detached from the gradient pass. Then
    ``optimizer.ppo_epochs`` optimizer steps, each over the whole rollout batch in micro-batches (masked rows per
    ``dapo.mask_truncated``; clip range per row when the hooks give one). Each micro-batch's loss is divided by
    normalisers of the whole batch (global token and sequence counts, agpo.update and agpo.losses; the length L
    of seq-mean-token-sum-norm is ``loss.max_response_len``, else ``rollout.max_new_tokens``: a constant of the
    run), so the micro-batch losses sum to the full-batch loss and the accumulated gradient equals the full-batch
    gradient for every ``loss_agg_mode``; gradient clipping, AdamW, LR schedule; then the hooks observe the
    update (adaptive AGPO: its step-KL EMA);
 4. the engine is synced to the new weights; metrics leave through the injected callback;
 5. every ``checkpoint.every`` steps a checkpoint (durable.checkpoint) is written atomically, by the updater
    (agpo.distributed: weights and optimizer state, or DeepSpeed's shards of every rank); ``restore``
    continues a run from one with the same following metrics as a run that was never stopped.

Where algorithms differ: the advantage estimator, the policy loss and its aggregation are chosen by name from
registries (agpo.advantages, agpo.surrogates, agpo.losses); the DAPO switches are options of the collector and
the loss; adaptive AGPO acts through the step hooks (agpo.hooks), the no-op ``PlainStep`` for every other estimator.

Also: data parallel under DeepSpeed (each rank keeps its contiguous share of whole groups, sampled as one process
would; counts, normalisers and metrics summed over ranks: agpo.distributed); rollout correction
(``rollout_logprob_abs_diff`` logged; ``loss.rollout_is_cap`` weights each token by min(pi_old / pi_rollout, cap));
log-probs at each row's temperature, a prompt's G rows sharing its key/value cache (agpo.logprobs); the trainer runs
where the model is, the loss in float32, ``autocast_dtype`` (bf16) for the forward passes with float32 weights.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agpo.adaptive import AdaptiveController, advantage_rule
from agpo.advantages import compute_advantage
from agpo.distributed import DeepSpeedUpdater, LocalUpdater, Updater
from agpo.estimator_params import estimator_params
from agpo.hooks import AdaptiveHooks, PlainStep
from agpo.logprobs import response_tensors, token_log_probs
from agpo.losses import policy_loss, truncated_is_weights
from agpo.models import autocast, save_model, train_top_layers
from agpo.optim import build_optimizer
from agpo.rollout.base import RolloutEngine, encode_prompts
from agpo.rollout.hf import HFRolloutEngine
from agpo.rollout_batch import PromptSampler, RewardFn, RolloutCollector, batch_statistics
from agpo.step_interfaces import RolloutBatch, StepHooks
from agpo.trainer_config import TrainerConfig
from agpo.update import UpdateMetrics, global_normalisers, micro_batch_rows

__all__ = ["MetricsCallback", "RLTrainer", "RewardFn", "TrainResult", "TrainerConfig"]

MetricsCallback = Callable[[int, dict[str, float]], None]


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
        progress_bar: Callable[..., tqdm] = tqdm,
        checkpoint_dir: str | Path | None = None,
        deepspeed_config: dict[str, Any] | None = None,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        for name, values in columns.items():
            if len(values) != len(prompts):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(prompts)} prompts")
        self.model, self.tokenizer, self.engine = model, tokenizer, engine
        self.prompts = list(prompts)
        self.config = config
        self.callback, self.evaluate, self.progress = callback, evaluate, progress
        self.progress_bar = progress_bar  # tqdm, or a caller's kind of bar (a log's: pipelines.progress)
        self.autocast_dtype = autocast_dtype  # mixed precision of the update's forward passes (None: the weights')
        optimizer, self.scheduler = self._optimizer(model)
        self.reference = self._frozen_copy(model) if config.loss.kl_coef > 0 else None
        max_grad_norm = config.optimizer.max_grad_norm
        self.updater: Updater = (
            LocalUpdater(model, optimizer, max_grad_norm)
            if deepspeed_config is None
            else DeepSpeedUpdater(model, optimizer, max_grad_norm, deepspeed_config)
        )
        self.controller = AdaptiveController(config.adaptive) if config.adaptive_mode else None
        self.hooks = self._hooks()
        self._check_parallel_and_checkpoint_settings(checkpoint_dir, deepspeed_config)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.sampler = PromptSampler(len(self.prompts), config.seed)
        self.collector = RolloutCollector(
            prompts=self.prompts,
            prompt_ids=encode_prompts(tokenizer, self.prompts),
            columns={k: list(v) for k, v in columns.items()},
            reward_fn=reward_fn,
            answer_fn=answer_fn,
            sampler=self.sampler,
            hooks=self.hooks,
            config=config,
            rank=self.updater.rank,
            world_size=self.updater.world_size,
        )
        self.step_count = 0
        self.generated_tokens = 0

    def _optimizer(self, model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
        """AdamW and its LR schedule over the parameters that train (the top ``trainable_layers`` when set)."""
        opt = self.config.optimizer
        if opt.trainable_layers:
            train_top_layers(model, opt.trainable_layers)
        return build_optimizer(
            model,
            learning_rate=opt.learning_rate,
            weight_decay=opt.weight_decay,
            total_steps=self.config.max_steps,
            warmup_steps=opt.warmup_steps,
            schedule=opt.lr_schedule,
        )

    def _hooks(self) -> StepHooks:
        """The step hooks: adaptive AGPO's controller behind them, else the no-op ``PlainStep``."""
        if self.controller is None:
            return PlainStep()
        return AdaptiveHooks(
            self.controller,
            self.config.rollout.group_size,
            eps_low=self.config.loss.eps_low,
            eps_high=self.config.loss.eps_high,
            all_reduce_sum=self.updater.all_reduce_sum,
        )

    def _check_parallel_and_checkpoint_settings(self, checkpoint_dir, deepspeed_config) -> None:
        config, world = self.config, self.updater.world_size
        if config.checkpoint.every and checkpoint_dir is None:
            raise ValueError("checkpoint.every > 0 needs a checkpoint folder (checkpoint_dir)")
        if world == 1:
            return
        if config.rollout.prompts_per_step % world:
            raise ValueError(
                f"rollout.prompts_per_step ({config.rollout.prompts_per_step}) must divide evenly over {world} ranks"
            )
        if config.dapo.dynamic_sampling or config.adaptive_mode:
            raise ValueError(
                "dapo.dynamic_sampling and adaptive_agpo run in one process only (their state is per batch)"
            )
        if self.updater.zero_stage == 3 and isinstance(self.engine, HFRolloutEngine):
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

    # ------------------------------------------------------------------ loop

    def train(self) -> TrainResult:
        """Run until ``max_steps`` or the token budget; returns every step's metrics."""
        config = self.config
        history: list[dict[str, float]] = []
        if self.evaluate is not None and self.step_count == 0:
            self._emit(0, {f"eval/{k}": v for k, v in self.evaluate().items()}, history)
        bar = self.progress_bar(
            total=config.max_steps,
            initial=self.step_count,
            desc=f"RL {config.algorithm}",
            unit="step",
            disable=not (self.progress and self.is_main_process),
            mininterval=1.0,
        )
        with bar:
            while self.step_count < config.max_steps and not self._budget_spent():
                metrics = self.step()
                last = self.step_count == config.max_steps or self._budget_spent()
                due = config.eval_every and self.step_count % config.eval_every == 0
                if self.evaluate is not None and (due or last):
                    metrics.update({f"eval/{k}": v for k, v in self.evaluate().items()})
                self._emit(self.step_count, metrics, history)
                if config.checkpoint.every and (self.step_count % config.checkpoint.every == 0 or last):
                    self.save_checkpoint()
                bar.update()
                bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", tokens=self.generated_tokens, refresh=False)
        return TrainResult(self.step_count, self.generated_tokens, history)

    def step(self) -> dict[str, float]:
        """One training step; returns its metrics (summed over data-parallel ranks)."""
        started = time.perf_counter()
        batch, rollout_stats, timing = self.collect()
        advantages = self.advantages(batch)
        update_started = time.perf_counter()
        update_metrics = self.update(batch, advantages)
        self.scheduler.step()
        with self.updater.full_weights():
            self.engine.sync_weights(self.model)
        self.step_count += 1
        timing["update"] = time.perf_counter() - update_started
        elapsed = time.perf_counter() - started
        batch_stats = batch_statistics(
            batch, self.config.advantage.correct_threshold, self.collector.local_tokens, self.updater.all_reduce_sum
        )
        step_tokens = int(batch_stats.pop("tokens"))
        self.generated_tokens += step_tokens
        return {
            **batch_stats,
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

    def collect(self) -> tuple[RolloutBatch, dict[str, float], dict[str, float]]:
        """This rank's scored rollout batch, dynamic-sampling statistics and rollout / reward seconds."""
        return self.collector.collect(self.engine)

    def advantages(self, batch: RolloutBatch) -> torch.Tensor:
        """The batch's per-response advantages from the run's estimator (module docstring, step 2)."""
        config = self.config
        name, params = advantage_rule(config.algorithm, config.advantage.params)
        if "correct_threshold" in estimator_params(name):  # one threshold: accuracy metrics and this split alike
            params = {**params, "correct_threshold": config.advantage.correct_threshold}
        low = -config.dapo.overlong_penalty if config.dapo.overlong_buffer else 0.0
        rewards, scores = torch.tensor(batch.rewards), torch.tensor(batch.scores)  # scores: correct vs wrong
        return compute_advantage(name, rewards, batch.group_ids, scores=scores, reward_range=(low, 1.0), **params)

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """``optimizer.ppo_epochs`` optimizer steps over the batch, each accumulating every micro-batch's gradient.

        Dropout is off in every pass of the update: old, reference and new log-probs and the gradient passes all
        run with the model in eval mode, the mode the rollout engine samples in. pi_old, the policy differentiated
        and the sampler are then one function, so the first epoch's ratio is exactly 1 (old log-probs in eval mode
        against gradient passes in train mode made any dropout, LoRA's say, move it). TRL's ``disable_dropout``
        makes the same choice.

        Its metrics include its phases' seconds: time_logprobs (old / reference log-probs, without gradient),
        time_forward_backward (every epoch's gradient passes, loss included), time_optimizer (clip and step)."""
        config, updater, cap = self.config, self.updater, self.config.loss.rollout_is_cap
        rows = micro_batch_rows(len(batch), config.optimizer.micro_batch_size)
        tensors = [self.micro_batch(batch, r) for r in rows]
        # seq-mean-token-sum-norm's L: a constant of the run, as Dr.GRPO's (the generation limit), never a step's
        # longest response, which would re-weight the loss from step to step
        max_len = config.loss.max_response_len or config.rollout.max_new_tokens
        normalisers = global_normalisers([t["mask"] for t in tensors], updater, max_len)
        # With one PPO epoch, pi_old is the policy being differentiated: its log-probs come detached from the
        # gradient pass (ratio 1, the same gradient) instead of a forward pass of their own, a quarter of the
        # update's compute. Otherwise (or when a hook reads them first) they are computed up front.
        old_from_gradient_pass = config.optimizer.ppo_epochs == 1 and not self.hooks.reads_old_policy
        # ZeRO-3 gathers the parameters in every forward pass, in lock-step over the ranks: there each rank runs
        # one pass per micro-batch rather than one per length chunk (agpo.logprobs), whose count varies by rank.
        chunked = updater.zero_stage != 3 or updater.world_size == 1

        def log_probs(model: torch.nn.Module, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
            with autocast(self.model, self.autocast_dtype):
                return token_log_probs(model, t, chunk_by_length=chunked)

        self.model.eval()  # dropout off in every pass (see the docstring)
        started = time.perf_counter()
        with torch.no_grad():
            old = [] if old_from_gradient_pass else [log_probs(updater.forward_model, t) for t in tensors]
            refs = [log_probs(self.reference, t)[0] for t in tensors] if self.reference is not None else None
        timing = {"time_logprobs": time.perf_counter() - started, "time_forward_backward": 0.0, "time_optimizer": 0.0}
        clip = self.hooks.clip_ranges(batch, [entropy for _, entropy in old], [t["mask"] for t in tensors])
        is_weights: list[torch.Tensor | None] = [None] * len(tensors)  # per micro-batch; fixed across epochs
        metrics, grad_norms = UpdateMetrics(tensors, normalisers, cap), []
        for _ in range(config.optimizer.ppo_epochs):
            started = time.perf_counter()
            updater.zero_grad()
            for k, (t, r) in enumerate(zip(tensors, rows, strict=True)):
                log_prob, entropy = log_probs(updater.forward_model, t)
                if old_from_gradient_pass:
                    old.append((log_prob.detach(), entropy.detach()))
                if cap and is_weights[k] is None:
                    is_weights[k] = truncated_is_weights(old[k][0], t["rollout_logprobs"], cap)
                loss, micro_metrics = policy_loss(
                    log_prob,
                    old[k][0],
                    advantages[r],
                    t["mask"],
                    config.loss,
                    ref_log_prob=refs[k] if refs is not None else None,
                    entropy=entropy,
                    eps_low=clip[0][r] if clip is not None else None,
                    eps_high=clip[1][r] if clip is not None else None,
                    token_weights=is_weights[k],
                    normalisers=normalisers,  # the loss is this micro-batch's share of the full-batch loss
                )
                updater.backward(loss, last=k == len(tensors) - 1)
                metrics.add(micro_metrics)
            stepped = time.perf_counter()
            grad_norms.append(updater.step())
            timing["time_forward_backward"] += stepped - started
            timing["time_optimizer"] += time.perf_counter() - stepped
        old_log_probs = [log_prob for log_prob, _ in old]
        summary = metrics.summary(updater, grad_norms, old_log_probs, is_weights)
        return summary | self.hooks.observe_update(self.model, batch, tensors, old_log_probs, clip) | timing

    def micro_batch(self, batch: RolloutBatch, rows: slice) -> dict[str, torch.Tensor]:
        """One micro-batch's tensors (agpo.logprobs.response_tensors) with this run's padding and masking."""
        return response_tensors(batch, rows, self.tokenizer.pad_token_id, self.config.dapo.mask_truncated)

    def _budget_spent(self) -> bool:
        return self.config.token_budget is not None and self.generated_tokens >= self.config.token_budget

    def _emit(self, step: int, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
        history.append({"step": step, **metrics})
        if self.callback is not None:
            self.callback(step, metrics)

    # ------------------------------------------------------------------ checkpoints

    def fingerprint(self) -> dict[str, object]:
        """What a checkpoint must share with this run to be resumed by it. Its keys are the trainer config's flat
        key names of before the config had sections (``group_size``, not ``rollout.group_size``): a checkpoint
        written then still resumes."""
        shapes = ";".join(f"{name}:{tuple(p.shape)}" for name, p in self.model.state_dict().items())
        config = self.config
        return {
            "model_shapes": hashlib.sha256(shapes.encode()).hexdigest()[:16],
            "prompts": hashlib.sha256("\x00".join(self.prompts).encode()).hexdigest()[:16],
            "algorithm": config.algorithm,
            "group_size": config.rollout.group_size,
            "prompts_per_step": config.rollout.prompts_per_step,
            "seed": config.seed,
            "trainable_layers": config.optimizer.trainable_layers,
            "world_size": self.updater.world_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """Counters, data cursor, LR schedule and the hooks' (adaptive controller) state (JSON-compatible)."""
        return {
            "step_count": self.step_count,
            "generated_tokens": self.generated_tokens,
            "groups_generated": self.collector.groups_generated,
            "generate_calls": self.collector.generate_calls,
            "sampler": self.sampler.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "controller": self.hooks.state_dict(),
        }

    def save_checkpoint(self) -> Path:
        """Write a checkpoint of the current step (atomic; older ones pruned to ``checkpoint.keep``); under DeepSpeed
        every rank calls it (agpo.distributed)."""
        if self.checkpoint_dir is None:
            raise ValueError("this trainer has no checkpoint folder (checkpoint_dir)")
        return self.updater.save_checkpoint(
            self.checkpoint_dir, self.step_count, self.state_dict(), self.fingerprint(), self.config.checkpoint.keep
        )

    def restore(self, path: str | Path | None = None) -> int | None:
        """Continue from checkpoint ``path`` (default: the newest in ``checkpoint_dir``); returns its step.

        Returns None when there is nothing to resume. Raises ``CheckpointError`` for a corrupt, truncated
        or foreign checkpoint.
        """
        if path is None:
            path = self.updater.latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir is not None else None
            if path is None:
                return None
        checkpoint = self.updater.load_checkpoint(Path(path), self.fingerprint())
        state = checkpoint.trainer_state
        self.step_count = state["step_count"]
        self.generated_tokens = state["generated_tokens"]
        self.collector.groups_generated = state["groups_generated"]
        self.collector.generate_calls = state["generate_calls"]
        self.sampler.load_state_dict(state["sampler"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.hooks.load_state_dict(state["controller"])
        with self.updater.full_weights():
            self.engine.sync_weights(self.model)
        return checkpoint.step

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        reference = copy.deepcopy(model).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
        return reference
