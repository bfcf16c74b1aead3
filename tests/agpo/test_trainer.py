"""The RL trainer on a tiny random model: bookkeeping, micro-batch equivalence, DAPO switches, adaptive mode."""

from dataclasses import replace

import pytest
import torch

from agpo import trainer as trainer_module
from agpo.adaptive_config import algorithm_names
from agpo.distributed import LocalUpdater
from agpo.logprobs import token_log_probs
from agpo.losses import AGGREGATION_MODES, PolicyLossConfig
from agpo.rollout import HFRolloutEngine
from agpo.rollout.base import FINISH_LENGTH, FINISH_STOP
from agpo.rollout_batch import PromptSampler, batch_statistics
from agpo.step_interfaces import RolloutBatch
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import TIMING_METRICS, OptimizerConfig, RolloutConfig

PROMPTS = ["<query>red shoes</query>\n<ad>", "<query>black phone case</query>\n", "a b", "价格"]


def starts_with_token(prompts, completions, *, target, **_):
    """Verifiable toy reward: 1 when the completion contains the target character."""
    return [float(t in c) for c, t in zip(completions, target, strict=True)]


BASE = TrainerConfig(
    max_steps=2,
    rollout=RolloutConfig(group_size=4, prompts_per_step=2, max_new_tokens=6),
    optimizer=OptimizerConfig(learning_rate=1e-3),
)


def with_settings(config: TrainerConfig, **changes) -> TrainerConfig:
    """``config`` with top-level keys replaced and sections given as dicts (``optimizer={"ppo_epochs": 2}``)
    applied over its own sections."""
    sections = {k: replace(getattr(config, k), **v) for k, v in changes.items() if isinstance(v, dict)}
    return replace(config, **(changes | sections))


def make_trainer(model, tokenizer, reward=starts_with_token, targets=("e", "a", "<", "s"), **overrides):
    config = with_settings(BASE, **overrides)
    engine = HFRolloutEngine(model, tokenizer)
    return RLTrainer(model, tokenizer, engine, reward, PROMPTS, {"target": list(targets)}, config, progress=False)


def test_sampler_covers_every_prompt_each_epoch_and_resumes():
    sampler = PromptSampler(5, seed=1)
    first = sampler.take(5)
    assert sorted(first) == [0, 1, 2, 3, 4]
    state = sampler.state_dict()
    later = sampler.take(7)
    resumed = PromptSampler(5, seed=1)
    resumed.load_state_dict(state)
    assert resumed.take(7) == later
    assert sorted(later[:5]) == [0, 1, 2, 3, 4]


def test_a_step_reports_every_metric_and_counts_tokens(tiny_model, tiny_tokenizer):
    trainer = make_trainer(tiny_model, tiny_tokenizer)
    seen = []
    trainer.callback = lambda step, metrics: seen.append((step, metrics))
    result = trainer.train()
    assert result.steps == 2 and [s for s, _ in seen] == [1, 2]
    metrics = seen[-1][1]
    for key in (
        "reward_mean",
        "accuracy",
        "all_correct_frac",
        "all_wrong_frac",
        "response_length_mean",
        "pg_clipfrac",
        "approx_kl",
        "entropy",
        "grad_norm",
        "generated_tokens",
        *TIMING_METRICS,
        "lr",
    ):
        assert key in metrics, key
    assert result.generated_tokens == metrics["generated_tokens"] > 0
    assert metrics["generated_tokens"] == sum(m["step_tokens"] for _, m in seen)


def test_training_changes_the_weights_and_is_reproducible(tiny_tokenizer, tiny_model):
    initial = [p.detach().clone() for p in tiny_model.parameters()]
    first = make_trainer(tiny_model, tiny_tokenizer).train()
    assert any(not torch.equal(a, b) for a, b in zip(initial, tiny_model.parameters(), strict=True))
    with torch.no_grad():
        for param, value in zip(tiny_model.parameters(), initial, strict=True):
            param.copy_(value)
    again = make_trainer(tiny_model, tiny_tokenizer).train()
    assert [h["reward_mean"] for h in first.history] == [h["reward_mean"] for h in again.history]


def test_trainable_layers_train_the_top_layers_only(tiny_tokenizer, three_layer_model):
    before = {n: p.detach().clone() for n, p in three_layer_model.named_parameters()}
    trainer = make_trainer(three_layer_model, tiny_tokenizer, optimizer={"trainable_layers": 2})
    trainer.train()
    changed = {n for n, p in three_layer_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in changed)
    assert trainer.fingerprint()["trainable_layers"] == 2


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batches_give_the_full_batch_gradient(tiny_tokenizer, tiny_model, mode):
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    full = make_trainer(
        tiny_model, tiny_tokenizer, max_steps=1, optimizer={"micro_batch_size": 64}, loss={"loss_agg_mode": mode}
    )
    full_metrics = full.step()
    tiny_model.load_state_dict(state)
    split = make_trainer(
        tiny_model, tiny_tokenizer, max_steps=1, optimizer={"micro_batch_size": 3}, loss={"loss_agg_mode": mode}
    )
    split_metrics = split.step()
    assert split_metrics["reward_mean"] == full_metrics["reward_mean"]
    assert split_metrics["grad_norm"] == pytest.approx(full_metrics["grad_norm"], rel=1e-4)
    assert split_metrics["pg_loss"] == pytest.approx(full_metrics["pg_loss"], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "loss",
    [
        {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, "loss_agg_mode": "seq-mean-token-mean"},
        {"policy_loss": "cispo", "eps_low": 1.0, "eps_high": 0.28},
    ],
)
def test_sequence_and_weight_clipped_losses_train_in_micro_batches(tiny_tokenizer, tiny_model, loss):
    """Over two PPO epochs (the second sees moved ratios) micro-batches still give the full batch's update."""
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    runs = []
    for micro_batch_size in (64, 3):
        tiny_model.load_state_dict(state)
        optimizer = {"ppo_epochs": 2, "micro_batch_size": micro_batch_size}
        trainer = make_trainer(tiny_model, tiny_tokenizer, max_steps=1, optimizer=optimizer, loss=loss)
        runs.append(trainer.step())
    full, split = runs
    assert split["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert split["pg_clipfrac"] == pytest.approx(full["pg_clipfrac"], abs=1e-6)
    if loss["policy_loss"] == "gspo":  # a 4e-4 range around a moved sequence ratio: the second epoch clips
        assert full["pg_clipfrac"] > 0


def test_token_budget_stops_the_run(tiny_model, tiny_tokenizer):
    result = make_trainer(tiny_model, tiny_tokenizer, max_steps=50, token_budget=30).train()
    assert result.steps < 50 and result.generated_tokens >= 30


def test_dynamic_sampling_drops_groups_with_equal_scores(tiny_model, tiny_tokenizer):
    def only_first_prompt_varies(prompts, completions, **_):
        return [float(i % 2) if p == PROMPTS[0] else 1.0 for i, p in enumerate(prompts)]

    trainer = make_trainer(
        tiny_model,
        tiny_tokenizer,
        reward=only_first_prompt_varies,
        dapo={"dynamic_sampling": True, "max_refill_rounds": 2},
    )
    metrics = trainer.step()
    assert metrics["all_correct_frac"] == 0.0  # every kept group has mixed rewards
    assert metrics["groups_kept"] >= 1 and metrics["groups_dropped"] >= 1


def first_prompt_only_varies():
    """A reward whose first prompt seen gets mixed scores (0, 1, 0, 1, ...) and every other prompt all 1."""
    first = []

    def reward(prompts, completions, **_):
        if not first:
            first.append(prompts[0])
        return [float(i % 2) if p == first[0] else 1.0 for i, p in enumerate(prompts)]

    return reward


def collecting(trainer):
    """Record every batch the trainer collects; returns the list they land in."""
    batches, collect = [], trainer.collect

    def recorded():
        result = collect()
        batches.append(result[0])
        return result

    trainer.collect = recorded
    return batches


def test_a_short_dynamic_sampling_batch_is_logged_and_trained(tiny_model, tiny_tokenizer):
    """Two prompts a step, one refill round: only the first prompt's group has mixed scores, the refill's does
    not, so the step trains on one group (4 rows) and says it is 4 rows short."""
    trainer = make_trainer(
        tiny_model,
        tiny_tokenizer,
        reward=first_prompt_only_varies(),
        dapo={"dynamic_sampling": True, "max_refill_rounds": 1},
    )
    batches = collecting(trainer)
    metrics = trainer.step()
    assert metrics["groups_kept"] == 1 and metrics["groups_dropped"] == 2
    assert metrics["dynamic_sampling_short_batch"] == 1.0 and metrics["dynamic_sampling_rows_short"] == 4.0
    assert len(batches[0]) == 4 and len(set(batches[0].group_ids)) == 1
    assert metrics["grad_norm"] > 0  # and it trained


def test_a_short_dynamic_sampling_batch_raises_when_configured(tiny_model, tiny_tokenizer):
    trainer = make_trainer(
        tiny_model,
        tiny_tokenizer,
        reward=first_prompt_only_varies(),
        dapo={"dynamic_sampling": True, "max_refill_rounds": 1, "dynamic_sampling_short_batch": "raise"},
    )
    with pytest.raises(RuntimeError, match=r"kept 1 of 2 prompt groups after 1 refill rounds.*dapo.max_refill_rounds"):
        trainer.step()


def test_a_correct_long_answer_stays_correct_under_the_overlong_penalty(tiny_model, tiny_tokenizer):
    """Every answer is correct; the untrained model's run long and are penalised. Accuracy and the group
    outcomes read the score (all correct), the advantages split on it (agpo: all-correct groups, no update;
    w_reinforce: +lambda_psr each), the reward mean is the shaped one."""

    def always_right(prompts, completions, **_):
        return [1.0] * len(prompts)

    dapo = {"overlong_buffer": 4, "overlong_penalty": 0.5}
    trainer = make_trainer(tiny_model, tiny_tokenizer, reward=always_right, dapo=dapo)
    batches = collecting(trainer)
    metrics = trainer.step()
    batch = batches[0]
    assert batch.scores == [1.0] * 8 and min(batch.rewards) < 1.0  # some ran into the buffer
    assert metrics["accuracy"] == 1.0 and metrics["all_correct_frac"] == 1.0 and metrics["all_wrong_frac"] == 0.0
    assert metrics["reward_mean"] == pytest.approx(sum(batch.rewards) / 8) and metrics["reward_mean"] < 1.0
    assert trainer.advantages(batch).tolist() == [0.0] * 8
    w_reinforce = make_trainer(tiny_model, tiny_tokenizer, algorithm="w_reinforce", dapo={"overlong_buffer": 4})
    assert w_reinforce.advantages(batch).tolist() == pytest.approx([0.1] * 8)


def test_overlong_penalty_and_truncation_mask(tiny_model, tiny_tokenizer):
    dapo = {"overlong_buffer": 2, "overlong_penalty": 0.5, "mask_truncated": True}
    trainer = make_trainer(tiny_model, tiny_tokenizer, dapo=dapo)
    metrics = trainer.step()
    assert metrics["reward_mean"] < 1.0  # untrained responses run long: penalised
    assert metrics["truncated_frac"] > 0


def test_kl_to_reference_starts_at_zero(tiny_model, tiny_tokenizer):
    trainer = make_trainer(tiny_model, tiny_tokenizer, loss={"kl_coef": 0.1})
    assert trainer.step()["kl"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.step()["kl"] != 0.0


class RecordingEngine(HFRolloutEngine):
    """Records each generate call's temperatures and generated-token count."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = []

    def generate(self, *args, **kwargs):
        rollout = super().generate(*args, **kwargs)
        self.calls.append((list(kwargs["temperatures"]), sum(len(ids) for ids in rollout.token_ids)))
        return rollout


def test_adaptive_agpo_runs_its_controllers(tiny_model, tiny_tokenizer):
    # temperature 0.7 is the plain trainers' sampling temperature; adaptive AGPO probes at its tau_base (1.0)
    trainer = make_trainer(
        tiny_model,
        tiny_tokenizer,
        algorithm="adaptive_agpo",
        optimizer={"ppo_epochs": 2},
        rollout={"temperature": 0.7},
    )
    trainer.engine = engine = RecordingEngine(tiny_model, tiny_tokenizer)
    batches = collecting(trainer)
    metrics = trainer.step()
    assert 0.05 <= metrics["clip_eps_mean"] <= 0.4
    assert 0.5 <= metrics["temperature_mean"] <= 1.5
    assert metrics["step_kl"] >= 0 and trainer.controller.state_dict()["entropy_ref"] is not None
    # one probe call at tau_base for both prompts, then the training rollout; the probe's tokens count in the
    # budget: the step's tokens are exactly the training responses' plus the probe's
    (probe_temperatures, probe_tokens), (_, rollout_tokens) = engine.calls
    assert probe_temperatures == [1.0, 1.0] and probe_tokens > 0
    assert rollout_tokens == sum(len(ids) for ids in batches[0].response_ids)
    assert metrics["step_tokens"] == rollout_tokens + probe_tokens


def test_reward_none_is_a_clear_error(tiny_model, tiny_tokenizer):
    trainer = make_trainer(tiny_model, tiny_tokenizer, reward=lambda prompts, completions, **_: [None] * len(prompts))
    with pytest.raises(ValueError, match="returned None for prompt"):
        trainer.step()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithm": "ppo"}, "unknown algorithm 'ppo'"),
        ({"advantage": {"params": {"lambda": 1}}}, "unknown parameter"),
        ({"algorithm": "adaptive_agpo", "advantage": {"params": {"eps": 1}}}, "advantage.params must be empty"),
        ({"rollout": {"group_size": 0}}, "group_size must be an int >= 1"),
        ({"rollout": {"temperature": 0.0}}, "temperature must be > 0"),
        ({"dapo": {"overlong_buffer": 32}}, "must be smaller than rollout.max_new_tokens"),
        ({"dapo": {"max_refill_rounds": -1}}, "max_refill_rounds must be an int >= 0"),
        ({"optimizer": {"learning_rate": -1.0}}, "learning_rate must be a finite number > 0"),
        ({"optimizer": {"lr_schedule": "linear"}}, "lr_schedule must be one of"),
        ({"optimizer": {"ppo_epochs": 0}}, "ppo_epochs must be an int >= 1"),
        ({"dapo": {"dynamic_sampling_short_batch": "drop"}}, "dynamic_sampling_short_batch must be one of"),
        ({"advantage": {"params": {"correct_threshold": 0.5}}}, "set advantage.correct_threshold instead"),
        ({"checkpoint": {"keep": 0}}, "keep must be an int >= 1"),
        ({"max_steps": 0}, "max_steps must be an int >= 1"),
        ({"token_budget": 0}, "token_budget must be an int >= 1"),
        (
            {"algorithm": "adaptive_agpo", "loss": PolicyLossConfig(eps_low=0.0, eps_high=0.28)},
            r"loss.eps_low = 0.0 with loss.eps_high = 0.28.*ratio eps_high / eps_low",
        ),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        with_settings(TrainerConfig(), **kwargs)


def test_columns_must_match_prompts(tiny_model, tiny_tokenizer):
    with pytest.raises(ValueError, match="column 'target' has 1 values for 4 prompts"):
        make_trainer(tiny_model, tiny_tokenizer, targets=("a",))
    assert "adaptive_agpo" in algorithm_names() and "agpo" in algorithm_names()


class OffsetLogprobEngine(HFRolloutEngine):
    """Stands in for an engine whose numerics differ from the trainer's (bf16 vLLM kernels, say):
    the same tokens, with every reported log-prob 0.5 lower."""

    def generate(self, *args, **kwargs):
        rollout = super().generate(*args, **kwargs)
        rollout.logprobs = [[lp - 0.5 for lp in row] for row in rollout.logprobs]
        return rollout


def test_rollout_mismatch_is_measured_and_corrected_with_a_capped_ratio(tiny_model, tiny_tokenizer):
    trainer = make_trainer(tiny_model, tiny_tokenizer, max_steps=1, loss={"rollout_is_cap": 1.2})
    exact = trainer.train().history[-1]
    assert exact["rollout_logprob_abs_diff"] < 1e-5
    assert exact["rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-5) and exact["rollout_is_capped_frac"] == 0

    trainer = make_trainer(tiny_model, tiny_tokenizer, max_steps=1, loss={"rollout_is_cap": 1.2})
    trainer.engine = OffsetLogprobEngine(tiny_model, tiny_tokenizer)
    shifted = trainer.train().history[-1]
    assert shifted["rollout_logprob_abs_diff"] == pytest.approx(0.5, abs=1e-5)
    # ratio exp(0.5) = 1.65 on every token, capped at 1.2
    assert shifted["rollout_is_weight_mean"] == pytest.approx(1.2) and shifted["rollout_is_capped_frac"] == 1.0


def test_shared_prompt_forward_gives_the_full_forwards_log_probs_and_gradients(tiny_model, tiny_tokenizer):
    """Rows sharing a prompt run it once through the model; log-probs, entropies and gradients equal a
    forward pass over every full row (prompts of different lengths, left-padded; a group split unevenly)."""
    trainer = make_trainer(tiny_model, tiny_tokenizer, optimizer={"micro_batch_size": 64})
    batch, _, _ = trainer.collect()
    t = trainer.micro_batch(batch, slice(0, 7))  # 4 rows of one prompt, 3 of the next
    assert t["prompt_rows"].tolist() == [0, 4] and t["prompt_of_row"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    every_row = {**t, "prompt_rows": torch.arange(7), "prompt_of_row": torch.arange(7)}  # no sharing
    results = []
    for tensors in (t, every_row):
        tiny_model.zero_grad()
        log_prob, entropy = token_log_probs(tiny_model, tensors)
        (log_prob * tensors["mask"]).sum().backward()
        results.append((log_prob.detach(), entropy.detach(), [p.grad.clone() for p in tiny_model.parameters()]))
    (shared_lp, shared_h, shared_g), (full_lp, full_h, full_g) = results
    mask = t["mask"].bool()
    assert torch.allclose(shared_lp[mask], full_lp[mask], atol=1e-5)
    assert torch.allclose(shared_h[mask], full_h[mask], atol=1e-5)
    for got, want in zip(shared_g, full_g, strict=True):
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)


def mixed_length_batch(tokenizer, max_new_tokens):
    """12 rows, 3 prompt groups, responses of uneven lengths; the rows of length max_new_tokens are
    truncated (so masked under mask_truncated), unevenly over micro-batches of 3 rows: [2 5 3] [6 1 4]
    [6 6 2] [3 4 5] -> micro-batch widths 5, 6, 6, 5 and 0, 1, 2, 0 masked rows."""
    lengths = [2, 5, 3, 6, 1, 4, 6, 6, 2, 3, 4, 5]
    generator = torch.Generator().manual_seed(0)
    prompts = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:3]]
    return RolloutBatch(
        prompt_ids=[prompts[i // 4] for i in range(12)],
        response_ids=[torch.randint(0, 320, (n,), generator=generator).tolist() for n in lengths],
        rewards=[float(i % 2) for i in range(12)],
        group_ids=[i // 4 for i in range(12)],
        temperatures=[1.0] * 12,
        finish_reasons=[FINISH_LENGTH if n == max_new_tokens else FINISH_STOP for n in lengths],
        answers=[None] * 12,
        rollout_logprobs=[[0.0] * n for n in lengths],
    )


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_micro_batches_give_the_full_batch_gradient_with_masked_rows(tiny_tokenizer, tiny_model, mode):
    """Every loss_agg_mode, truncated rows masked, max_response_len null: micro-batches of 3 rows accumulate
    the gradient (and report the metrics) of the whole batch taken in one micro-batch."""
    batch = mixed_length_batch(tiny_tokenizer, max_new_tokens=6)
    advantages = torch.linspace(-1.0, 1.5, len(batch))
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    results = {}
    for size in (64, 3):
        tiny_model.load_state_dict(state)
        trainer = make_trainer(
            tiny_model,
            tiny_tokenizer,
            rollout={"max_new_tokens": 6},
            dapo={"mask_truncated": True},
            optimizer={"micro_batch_size": size},
            loss={"loss_agg_mode": mode, "entropy_coef": 0.01},
        )
        # lr 0 and no clipping: the parameters stay put and .grad keeps the accumulated gradient
        optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
        trainer.updater = LocalUpdater(tiny_model, optimizer, max_grad_norm=float("inf"))
        metrics = trainer.update(batch, advantages)
        results[size] = metrics, [p.grad.clone() for p in tiny_model.parameters()]
    (full_metrics, full_grads), (split_metrics, split_grads) = results[64], results[3]
    assert any(g.abs().sum() > 0 for g in full_grads)
    for got, want in zip(split_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for key in ("pg_loss", "entropy", "pg_clipfrac", "approx_kl"):
        assert split_metrics[key] == pytest.approx(full_metrics[key], rel=1e-5, abs=1e-7), key


def test_one_correct_threshold_decides_accuracy_and_the_advantage_split(tiny_model, tiny_tokenizer):
    """correct_threshold 0.5, scores [0.6, 0.6, 0, 0]: accuracy 0.5, and agpo / w_reinforce count the 0.6 answers
    correct too. agpo: mu 0.3, population sigma 0.3 -> +0.3 / (0.3 + 1e-6) for the correct ones, -0.5 * (1 - 0)
    for the wrong ones (with the estimators' own threshold 1.0 all four were wrong: -0.5 * 0.4 = -0.2)."""
    batch = RolloutBatch(
        prompt_ids=[[1]] * 4,
        response_ids=[[2]] * 4,
        rewards=[0.6, 0.6, 0.0, 0.0],
        group_ids=[0] * 4,
        temperatures=[1.0] * 4,
        finish_reasons=[FINISH_STOP] * 4,
        answers=["a"] * 4,
        rollout_logprobs=[[0.0]] * 4,
    )
    trainer = make_trainer(tiny_model, tiny_tokenizer, advantage={"correct_threshold": 0.5})
    assert batch_statistics(batch, trainer.config.advantage.correct_threshold, 0, list)["accuracy"] == 0.5
    assert trainer.advantages(batch).tolist() == pytest.approx([0.3 / (0.3 + 1e-6)] * 2 + [-0.5] * 2, abs=1e-6)
    w_reinforce = make_trainer(
        tiny_model, tiny_tokenizer, algorithm="w_reinforce", advantage={"correct_threshold": 0.5}
    )
    assert w_reinforce.advantages(batch).tolist() == pytest.approx([0.1, 0.1, -1.0, -1.0])


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_with_dropout_the_first_epoch_ratio_is_exactly_one(tiny_model, tiny_tokenizer, monkeypatch, mode):
    """Attention dropout 0.5 (active in train mode): old log-probs (their own no-grad pass, ppo_epochs 2) and the
    first epoch's gradient passes run in one dropout-free mode, so on every micro-batch of the first epoch
    logp == logp_old exactly: approx_kl 0 and no token clipped, whatever mode the caller left the model in."""
    for layer in tiny_model.model.layers:
        layer.self_attn.attention_dropout = 0.5
    ids = torch.tensor([tiny_tokenizer("<query>red shoes</query>", add_special_tokens=False)["input_ids"]])
    tiny_model.train()
    assert not torch.equal(tiny_model(input_ids=ids).logits, tiny_model(input_ids=ids).logits)  # dropout is on
    getattr(tiny_model, mode)()
    losses, real_policy_loss = [], trainer_module.policy_loss

    def recording(log_prob, old_log_prob, *args, **kwargs):
        loss, metrics = real_policy_loss(log_prob, old_log_prob, *args, **kwargs)
        losses.append((log_prob.detach(), old_log_prob, metrics))
        return loss, metrics

    monkeypatch.setattr(trainer_module, "policy_loss", recording)
    trainer = make_trainer(tiny_model, tiny_tokenizer, max_steps=1, optimizer={"ppo_epochs": 2, "micro_batch_size": 3})
    trainer.step()
    assert len(losses) == 2 * 3  # 8 rows in micro-batches of 3, two epochs
    for log_prob, old_log_prob, metrics in losses[:3]:
        assert torch.equal(log_prob, old_log_prob)
        assert metrics["approx_kl"] == 0.0 and metrics["pg_clipfrac"] == 0.0


def test_dr_grpo_length_normaliser_defaults_to_max_new_tokens_in_every_step(tiny_model, tiny_tokenizer):
    """seq-mean-token-sum-norm, max_response_len null: L is max_new_tokens (10), not the batch's longest
    response, so it is the same constant whatever a step's lengths. At ratio 1 with A = +1 on every row the
    loss is -sum(lengths) / (S * L): 12 rows of 47 tokens -> -47 / 120 (not / (12 * 6)); 4 rows of lengths
    2, 3, 1, 2 -> -8 / 40 (not / (4 * 3))."""
    trainer = make_trainer(
        tiny_model, tiny_tokenizer, rollout={"max_new_tokens": 10}, loss={"loss_agg_mode": "seq-mean-token-sum-norm"}
    )
    batch = mixed_length_batch(tiny_tokenizer, max_new_tokens=10)
    short = batch.select([0, 2, 4, 8])
    assert [max(len(r) for r in b.response_ids) for b in (batch, short)] == [6, 3]
    metrics = [trainer.update(b, torch.ones(len(b)))["pg_loss"] for b in (batch, short)]
    assert metrics == pytest.approx([-47 / 120, -8 / 40])


@pytest.mark.parametrize("ppo_epochs", [1, 2])
def test_the_step_kl_ema_moves_once_per_rollout_step(tiny_model, tiny_tokenizer, ppo_epochs):
    """Adaptive AGPO's KL_step_ema takes in one KL_step per rollout step: not one per micro-batch (micro-batches
    of 1 and of the whole batch give the same EMA) nor one per PPO epoch. From 0 at rate 0.1: after step 1
    0.1 * KL_1, after step 2 0.1 * KL_2 + 0.9 * 0.1 * KL_1."""
    state = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    first_step_ema = {}
    for micro_batch_size in (64, 1):
        tiny_model.load_state_dict(state)
        trainer = make_trainer(
            tiny_model,
            tiny_tokenizer,
            algorithm="adaptive_agpo",
            optimizer={"ppo_epochs": ppo_epochs, "micro_batch_size": micro_batch_size},
        )
        observed, observe = [], trainer.controller.observe_step_kl

        def counted(step_kl, observed=observed, observe=observe):
            observed.append(step_kl)
            return observe(step_kl)

        trainer.controller.observe_step_kl = counted
        history = [trainer.step(), trainer.step()]
        assert observed == [m["step_kl"] for m in history]  # one update per step, with that step's KL_step
        kl_1, kl_2 = observed
        assert kl_1 > 0 and kl_2 > 0
        assert history[0]["step_kl_ema"] == pytest.approx(0.1 * kl_1)
        assert history[1]["step_kl_ema"] == trainer.controller.step_kl_ema == pytest.approx(0.1 * kl_2 + 0.09 * kl_1)
        first_step_ema[micro_batch_size] = history[0]["step_kl_ema"]
    assert first_step_ema[1] == pytest.approx(first_step_ema[64], rel=1e-3)
