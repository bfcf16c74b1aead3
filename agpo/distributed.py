"""How the trainer applies gradients: one process with plain PyTorch, or data-parallel DeepSpeed ZeRO.

:class:`Updater` is the interface the trainer's loop is typed against; :class:`LocalUpdater` and
:class:`DeepSpeedUpdater` implement it:

- ``forward_model``: what forward passes go through (the DeepSpeed engine, or the model itself);
- ``backward(loss, last)`` once per micro-batch, ``step()`` once per optimizer step (it clips the global
  gradient norm, steps the optimizer and returns that norm);
- ``rank``, ``world_size``, ``all_reduce_sum`` and ``all_reduce_max`` so the trainer can split each step's
  prompt groups over ranks and add up token counts, loss normalisers and metrics across them;
- ``full_weights()`` (ZeRO-3 gathers its partitions inside it) and the optimizer state of a checkpoint.

Data-parallel arithmetic: each rank holds ``rollout.prompts_per_step / world_size`` whole prompt groups, so
group-relative advantages stay local. Each micro-batch's loss is divided by normalisers of the *global*
batch (token and sequence counts summed over ranks; see agpo.update and agpo.losses), so the losses of all
micro-batches of all ranks sum to the full-batch loss. DeepSpeed averages gradients over ranks, so
``DeepSpeedUpdater`` multiplies the loss by ``world_size`` to turn that average back into the global sum.
Two processes then take the same optimizer step as one process with the whole batch, up to summation order.

DeepSpeed runs on CPU too: ``DS_ACCELERATOR=cpu`` (set here when no GPU is visible) and the gloo
backend. The torch optimizer and LR schedule built by the trainer are handed to DeepSpeed (ZeRO wraps
the optimizer; the LR lambda keeps writing the same param-group dicts), so schedules behave the same.
Every micro-batch but the last runs with the gradient-accumulation boundary off, so ZeRO reduces and
steps once per optimizer step whatever the number of micro-batches.

Checkpoints: each updater saves and loads the weights and optimizer state of a checkpoint, inside the project's
durable publish (durable.checkpoint: a temp folder, a manifest of every file's size and SHA-256, one atomic
rename, the same refusals of a corrupt or foreign checkpoint). ``LocalUpdater`` writes ``model.safetensors`` and
``optimizer.pt``; ``DeepSpeedUpdater`` lets DeepSpeed's own checkpoint engine write every rank's shards (ZeRO 1-3:
module and optimizer partitions) into ``deepspeed/`` of the one temp folder, the ranks agreeing on it through a
collective, and rank 0 publishes it once all have written. DeepSpeed reads its shards back with ``torch.load``
and ``weights_only=False`` (they hold its config objects), so the manifest's checksums are verified first: a
file changed since the save is refused before DeepSpeed opens it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import torch

from durable.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointWriter,
    finish_interrupted_save,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)

# Keys the trainer owns; a DeepSpeed config file must not set them (they would silently disagree).
_OWNED_KEYS = ("optimizer", "scheduler", "gradient_clipping", "train_batch_size", "gradient_accumulation_steps")
DEEPSPEED_FOLDER, DEEPSPEED_TAG = "deepspeed", "state"  # where a checkpoint keeps DeepSpeed's shards


class Updater(Protocol):
    """What the trainer's loop needs from whatever applies its gradients."""

    rank: int
    world_size: int
    zero_stage: int  # DeepSpeed ZeRO stage; 0 without partitioning
    model: torch.nn.Module  # the policy itself (its parameters hold full values inside full_weights())
    forward_model: torch.nn.Module  # what forward passes of the update go through

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        """Accumulate the gradient of one micro-batch's loss; ``last``: the optimizer step's last one."""
        ...

    def step(self) -> float:
        """Clip the accumulated gradient, step the optimizer; returns the gradient norm before clipping."""
        ...

    def all_reduce_sum(self, values: list[float]) -> list[float]: ...

    def all_reduce_max(self, values: list[float]) -> list[float]: ...

    def full_weights(self) -> AbstractContextManager[None]: ...

    def latest_checkpoint(self, root: Path) -> Path | None:
        """The newest finished checkpoint under ``root`` (a killed save's leftovers cleaned up first)."""
        ...

    def save_checkpoint(
        self, root: Path, step: int, trainer_state: dict[str, Any], fingerprint: dict[str, Any], keep_last: int
    ) -> Path:
        """Publish the checkpoint of ``step``: weights, optimizer state and ``trainer_state`` (every rank calls)."""
        ...

    def load_checkpoint(self, path: Path, fingerprint: dict[str, Any]) -> Checkpoint:
        """Verify ``path``, load its weights and optimizer state; its step and trainer state (every rank calls)."""
        ...


class LocalUpdater:
    """Single process: backward per micro-batch, then clip and step the torch optimizer."""

    rank, world_size, zero_stage = 0, 1, 0

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> None:
        self.model, self.optimizer, self.max_grad_norm = model, optimizer, max_grad_norm
        self.forward_model = model

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        loss.backward()

    def step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return float(norm)

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def all_reduce_max(self, values: list[float]) -> list[float]:
        return list(values)

    @contextlib.contextmanager
    def full_weights(self) -> Iterator[None]:
        """The model's parameters hold their full values inside this block (always true here)."""
        yield

    def latest_checkpoint(self, root: Path) -> Path | None:
        return latest_checkpoint(root)

    def save_checkpoint(
        self, root: Path, step: int, trainer_state: dict[str, Any], fingerprint: dict[str, Any], keep_last: int
    ) -> Path:
        optimizer_state = self.optimizer.state_dict()
        kept = {"model": self.model, "optimizer_state": optimizer_state, "trainer_state": trainer_state}
        return save_checkpoint(root, step, **kept, fingerprint=fingerprint, keep_last=keep_last)

    def load_checkpoint(self, path: Path, fingerprint: dict[str, Any]) -> Checkpoint:
        checkpoint, optimizer_state = load_checkpoint(path, model=self.model, fingerprint=fingerprint)
        self.optimizer.load_state_dict(optimizer_state)
        return checkpoint


class DeepSpeedUpdater:
    """Data-parallel ZeRO 0-3 through ``deepspeed.initialize``; launch several processes with torchrun."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        max_grad_norm: float,
        ds_config: dict[str, Any],
    ) -> None:
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        try:
            import deepspeed
        except ImportError as err:
            raise ImportError(
                "the deepspeed option needs DeepSpeed: pip install -c constraints.txt -e '.[gpu]'"
            ) from err
        import torch.distributed as dist

        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29511")
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("LOCAL_RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        config = {
            **ds_config,
            "train_micro_batch_size_per_gpu": 1,  # unused (no DeepSpeed data loader); keeps its batch check happy
            "gradient_accumulation_steps": 1,  # the trainer sets the accumulation boundary itself
            "gradient_clipping": max_grad_norm,
            "zero_allow_untested_optimizer": True,  # torch AdamW: no fused-kernel compile on CPU
        }
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        self.model, self.forward_model = model, self.engine
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.zero_stage = int(config.get("zero_optimization", {}).get("stage", 0))

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(last)
        # DeepSpeed averages gradients over ranks; each loss is already a share of the global batch's loss
        self.engine.backward(loss * self.world_size)

    def step(self) -> float:
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    @contextlib.contextmanager
    def full_weights(self) -> Iterator[None]:
        """ZeRO-3 partitions parameters over ranks: gather them (on every rank, a collective) so a rollout
        engine can copy full weights; other stages keep full parameters on each rank already."""
        if self.zero_stage != 3:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None):
            yield

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, "SUM")

    def all_reduce_max(self, values: list[float]) -> list[float]:
        return self._all_reduce(values, "MAX")

    @staticmethod
    def _all_reduce(values: list[float], op: str) -> list[float]:
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
        return tensor.tolist()

    def latest_checkpoint(self, root: Path) -> Path | None:
        """Rank 0 cleans up a killed save's leftovers; then every rank reads the same newest checkpoint."""
        import torch.distributed as dist

        if self.rank == 0 and root.is_dir():
            finish_interrupted_save(root)
        dist.barrier()
        found = list_checkpoints(root)
        return found[-1][1] if found else None

    def save_checkpoint(
        self, root: Path, step: int, trainer_state: dict[str, Any], fingerprint: dict[str, Any], keep_last: int
    ) -> Path:
        """Every rank writes its shards with DeepSpeed's engine into rank 0's temp folder, then rank 0 publishes."""
        import torch.distributed as dist

        owner = int(self.all_reduce_max([float(os.getpid()) if self.rank == 0 else 0.0])[0])
        writer = CheckpointWriter(root, step, keep_last, owner)
        if self.rank == 0:
            writer.begin()
        dist.barrier()
        self.engine.save_checkpoint(str(writer.folder / DEEPSPEED_FOLDER), tag=DEEPSPEED_TAG, save_latest=False)
        dist.barrier()
        if self.rank == 0:
            writer.publish(trainer_state, fingerprint)
        dist.barrier()
        return writer.final

    def load_checkpoint(self, path: Path, fingerprint: dict[str, Any]) -> Checkpoint:
        checkpoint = read_checkpoint(path, fingerprint)  # the manifest first: nothing changed since the save
        loaded, _ = self.engine.load_checkpoint(
            str(path / DEEPSPEED_FOLDER),
            tag=DEEPSPEED_TAG,
            load_module_strict=True,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,  # the trainer's schedule is in its own state
        )
        if loaded is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint in {path / DEEPSPEED_FOLDER}")
        return checkpoint


def end_process_group() -> None:
    """Destroy this process's torch.distributed group, when it has one. A rank that exits with the group's
    threads still running can abort in teardown (``terminate called without an active exception``, exit -6) after
    its work is done, which torchrun reports as a failed rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def load_deepspeed_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON config, refusing keys the trainer sets itself."""
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise FileNotFoundError(f"DeepSpeed config {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"DeepSpeed config {path} is not valid JSON: {err}") from None
    owned = [key for key in _OWNED_KEYS if key in config]
    if owned:
        raise ValueError(
            f"DeepSpeed config {path} sets {owned}; the trainer owns these (optimizer.learning_rate, "
            "optimizer.lr_schedule, optimizer.max_grad_norm, optimizer.micro_batch_size in the trainer config): "
            "remove them from the file"
        )
    stage = config.get("zero_optimization", {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"DeepSpeed config {path}: zero_optimization.stage must be 0-3, got {stage!r}")
    return config
