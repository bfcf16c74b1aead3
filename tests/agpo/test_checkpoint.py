"""Checkpoints: exact resume, epoch boundaries, keep-last-K, and refusal of corrupt or foreign checkpoints."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import TIMING_METRICS, CheckpointConfig, OptimizerConfig, RolloutConfig
from durable.checkpoint import (
    MANIFEST_FILE,
    MODEL_FILE,
    OPTIMIZER_FILE,
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
)

PROMPTS = ["<query>red shoes</query>\n<ad>", "<query>black phone case</query>\n", "a b", "价格"]


def contains_target(prompts, completions, *, target, **_):
    return [float(t in c) for c, t in zip(completions, target, strict=True)]


def fresh_model(tokenizer):
    """The same initial weights every call (seeded init)."""
    return build_tiny_qwen2(
        tokenizer, TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=1, intermediate_size=128)
    ).eval()


BASE = TrainerConfig(
    max_steps=4,
    rollout=RolloutConfig(group_size=4, prompts_per_step=2, max_new_tokens=6),
    optimizer=OptimizerConfig(learning_rate=1e-3, lr_schedule="cosine"),
    checkpoint=CheckpointConfig(every=2, keep=2),
)


def make_trainer(tokenizer, checkpoint_dir, **overrides):
    """A trainer of BASE with top-level keys replaced and sections given as dicts applied over BASE's."""
    sections = {k: replace(getattr(BASE, k), **v) for k, v in overrides.items() if isinstance(v, dict)}
    config = replace(BASE, **(overrides | sections))
    model = fresh_model(tokenizer)
    return RLTrainer(
        model,
        tokenizer,
        HFRolloutEngine(model, tokenizer),
        contains_target,
        PROMPTS,
        {"target": ["e", "a", "<", "s"]},
        config,
        progress=False,
        checkpoint_dir=checkpoint_dir,
    )


def comparable(history):
    return [{k: v for k, v in h.items() if k not in TIMING_METRICS} for h in history]


class Killed(Exception):
    pass


def kill_at(step):
    def callback(current, _):
        if current == step:
            raise Killed

    return callback


@pytest.mark.parametrize("algorithm", ["agpo", "adaptive_agpo"])
def test_a_resumed_run_continues_exactly_like_an_uninterrupted_one(tiny_tokenizer, tmp_path, algorithm):
    # 4 prompts, 2 per step: the step-2 checkpoint sits exactly on an epoch boundary
    uninterrupted = make_trainer(tiny_tokenizer, tmp_path / "whole", algorithm=algorithm)
    whole = uninterrupted.train()
    killed = make_trainer(tiny_tokenizer, tmp_path / "split", algorithm=algorithm)
    killed.callback = kill_at(3)  # dies after step 3 ran, before its next checkpoint (step 4)
    with pytest.raises(Killed):
        killed.train()
    resumed = make_trainer(tiny_tokenizer, tmp_path / "split", algorithm=algorithm)
    assert resumed.restore() == 2
    assert resumed.sampler.state_dict() == {"epoch": 0, "position": 4}  # the end of epoch 0
    rest = resumed.train()
    assert rest.steps == 4 and [h["step"] for h in rest.history] == [3, 4]  # the remaining steps are trained
    assert comparable(rest.history) == comparable(whole.history[2:])
    assert rest.generated_tokens == whole.generated_tokens
    params = zip(resumed.model.parameters(), uninterrupted.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in params)


def test_keeps_the_newest_k_and_ignores_half_written_ones(tiny_tokenizer, tmp_path):
    trainer = make_trainer(tiny_tokenizer, tmp_path, max_steps=5, checkpoint={"every": 1})
    (tmp_path / ".tmp-step-00000009-1").mkdir(parents=True)  # a save killed mid-way
    trainer.train()
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert not list(tmp_path.glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).name == "step-00000005"
    manifest = json.loads((latest_checkpoint(tmp_path) / MANIFEST_FILE).read_text())
    assert manifest["step"] == 5 and set(manifest["files"]) == {
        MODEL_FILE,
        OPTIMIZER_FILE,
        "rng.pt",
        "trainer_state.json",
    }


def test_a_finished_run_resumes_to_nothing_to_do(tiny_tokenizer, tmp_path):
    make_trainer(tiny_tokenizer, tmp_path).train()
    again = make_trainer(tiny_tokenizer, tmp_path)
    assert again.restore() == 4
    assert again.train().history == []


def test_restore_without_checkpoints_starts_fresh(tiny_tokenizer, tmp_path):
    assert make_trainer(tiny_tokenizer, tmp_path / "none").restore() is None


@pytest.fixture
def saved(tiny_tokenizer, tmp_path):
    make_trainer(tiny_tokenizer, tmp_path, max_steps=2).train()
    return latest_checkpoint(tmp_path)


def test_a_corrupt_file_is_refused(tiny_tokenizer, saved):
    data = bytearray((saved / MODEL_FILE).read_bytes())
    data[-5] ^= 0xFF
    (saved / MODEL_FILE).write_bytes(bytes(data))
    trainer = make_trainer(tiny_tokenizer, saved.parent)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(CheckpointError, match=r"model.safetensors is corrupt: sha256 .* delete .*step-00000002"):
        trainer.restore()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


def test_a_truncated_file_is_refused(tiny_tokenizer, saved):
    data = (saved / OPTIMIZER_FILE).read_bytes()
    (saved / OPTIMIZER_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"optimizer.pt is truncated or overwritten: \d+ bytes, expected"):
        make_trainer(tiny_tokenizer, saved.parent).restore()


def test_a_missing_manifest_is_not_a_checkpoint(tiny_tokenizer, saved):
    (saved / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointError, match="is not a finished checkpoint"):
        make_trainer(tiny_tokenizer, saved.parent).restore()


def test_a_checkpoint_of_a_different_run_is_refused(tiny_tokenizer, saved):
    with pytest.raises(CheckpointError, match=r"different run \(checkpoint -> this run: group_size: 4 -> 8\)"):
        make_trainer(tiny_tokenizer, saved.parent, rollout={"group_size": 8}).restore()
    with pytest.raises(CheckpointError, match='algorithm: "agpo" -> "grpo"'):
        make_trainer(tiny_tokenizer, saved.parent, algorithm="grpo").restore()


def test_the_fingerprint_keeps_the_flat_key_names_so_older_checkpoints_resume(tiny_tokenizer, saved):
    """The trainer config grew sections (rollout.group_size, optimizer.trainable_layers, ...); the fingerprint a
    checkpoint records keeps the flat names it had before, so a checkpoint written then still matches."""
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    assert set(manifest["fingerprint"]) == {
        "model_shapes",
        "prompts",
        "algorithm",
        "group_size",
        "prompts_per_step",
        "seed",
        "trainable_layers",
        "world_size",
    }
    assert manifest["fingerprint"]["group_size"] == 4 and manifest["fingerprint"]["prompts_per_step"] == 2


class Payload:
    """Unpickling it creates the file ``sentinel``: code that runs on load, as an attacker's would."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (Path.touch, (self.sentinel,))


def test_pickled_code_is_refused_even_with_a_matching_checksum(tiny_tokenizer, saved, tmp_path):
    """An attacker who rewrites the manifest too still cannot run code: loading is weights_only, and the
    refusal comes before the weights are loaded into the model."""
    from durable.checkpoint import _describe

    sentinel = tmp_path / "code-ran"
    torch.save({"state": {}, "param_groups": [], "evil": Payload(sentinel)}, saved / OPTIMIZER_FILE)
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    manifest["files"][OPTIMIZER_FILE] = _describe(saved / OPTIMIZER_FILE)
    (saved / MANIFEST_FILE).write_text(json.dumps(manifest))
    trainer = make_trainer(tiny_tokenizer, saved.parent)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(CheckpointError, match=r"optimizer\.pt cannot be read safely"):
        trainer.restore()
    assert not sentinel.exists()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    torch.load(saved / OPTIMIZER_FILE, weights_only=False)  # the unsafe load the checkpoint loader never does
    assert sentinel.exists()  # ... runs the payload: the refusal above is what kept it from running


def test_checkpointing_needs_a_folder(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"checkpoint\.every > 0 needs a checkpoint folder"):
        make_trainer(tiny_tokenizer, None)
