"""Runs a few RL steps of a tiny model, plainly or under DeepSpeed (launched by torchrun), and writes the
step metrics and the saved model's per-tensor sums as JSON from
rank 0. Used by test_deepspeed.py; not a test module itself.

    python -m torch.distributed.run --nproc_per_node 2 tests/agpo/deepspeed_worker.py OUT.json ZERO_CONFIG.json
    python tests/agpo/deepspeed_worker.py OUT.json          # the plain single-process trainer

Environment: ``MAX_STEPS`` (default 3); ``CHECKPOINT_DIR``: checkpoint every step there and resume from the newest
one; ``KILL_AT_STEP``: SIGKILL this process once that step is trained, before its checkpoint is written.
"""

import json
import os
import signal
import sys
from pathlib import Path

import torch

from agpo.distributed import end_process_group, load_deepspeed_config
from agpo.models import TinyModelConfig, build_tiny_qwen2, load_model, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine
from agpo.trainer import RLTrainer, TrainerConfig
from agpo.trainer_config import CheckpointConfig, OptimizerConfig, RolloutConfig

CORPUS = ["<query>red nike running shoes</query>\n<ad>nike running shoes, red</ad>\n", " <answer>3</answer>"] * 20
PROMPTS = [f"<query>{w} shoes</query>\n<ad>{w}" for w in ("red", "blue", "black", "nike", "mesh", "size", "a", "b")]


def contains_target(prompts, completions, *, target, **_):
    return [float(t in c) for c, t in zip(completions, target, strict=True)]


def kill_at(step: int):
    """A metrics callback that kills the process at ``step`` (after the step, before its checkpoint)."""

    def callback(at: int, _metrics: dict) -> None:
        if at == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return callback


def main(out: str, ds_config_path: str | None = None) -> None:
    torch.manual_seed(0)
    tokenizer = train_bpe_tokenizer(CORPUS, vocab_size=300)
    model = build_tiny_qwen2(
        tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1, intermediate_size=128)
    )
    checkpoints = os.environ.get("CHECKPOINT_DIR")
    config = TrainerConfig(
        max_steps=int(os.environ.get("MAX_STEPS", "3")),
        seed=1,
        rollout=RolloutConfig(group_size=4, prompts_per_step=4, max_new_tokens=8),
        # uneven micro-batches: 8 rows per rank -> 3 + 3 + 2
        optimizer=OptimizerConfig(micro_batch_size=3, learning_rate=3e-3, lr_schedule="cosine"),
        checkpoint=CheckpointConfig(every=1 if checkpoints else 0, keep=2),
    )
    engine = HFRolloutEngine(model, tokenizer)
    ds_config = load_deepspeed_config(ds_config_path) if ds_config_path else None
    trainer = RLTrainer(
        model,
        tokenizer,
        engine,
        contains_target,
        PROMPTS,
        {"target": list("eabsdrkn")},
        config,
        progress=False,
        deepspeed_config=ds_config,
        checkpoint_dir=checkpoints,
        callback=kill_at(int(os.environ.get("KILL_AT_STEP", "0"))),
    )
    resumed = trainer.restore() if checkpoints else None
    history = trainer.train().history
    saved = trainer.save_model(Path(out).with_suffix(".model"))  # every rank: ZeRO-3 gathers its partitions
    if trainer.is_main_process:
        weights = {name: float(p.double().sum()) for name, p in load_model(saved)[0].named_parameters()}
        with open(out, "w", encoding="utf-8") as handle:
            result = {"world_size": trainer.updater.world_size, "history": history, "weights": weights}
            json.dump({**result, "resumed_from": resumed}, handle)
    end_process_group()  # as agpo does: the group's threads stopped before the rank exits


if __name__ == "__main__":
    main(*sys.argv[1:])
