"""Where a stage runs its models and in what precision: one rule for every stage that runs torch or onnxruntime.

Two keys, on every such stage's config (a pipeline's own pass down to its stages that leave theirs ``auto``):

- ``device``: ``auto`` (the accelerator when torch sees one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``.
  In a torchrun rank (``LOCAL_RANK`` set) ``auto`` and ``cuda`` take ``cuda:LOCAL_RANK``: each rank its own
  GPU. ``cuda`` or ``cuda:N`` on a machine without that GPU is a config error (``agpo`` exits 2 before the
  stage starts: ``check_devices``).
- ``precision``: ``auto`` (bf16 on a GPU that supports it, else fp32), ``fp32`` or ``bf16``. bf16 is mixed
  precision: the weights (and the optimizer's state) stay float32 and forward passes run under
  ``torch.autocast`` to bfloat16, so training keeps float32 updates. The CPU's ``auto`` is fp32: a CPU run's
  figures stay what they were. fp16 is not offered: it needs loss scaling, and every GPU with fast fp16 that
  this product targets (A100, H100, H200, L4) has bf16.

A stage reads the rule once (``use_device``) and hands the library the torch device and the autocast dtype;
``agpo.trainer``, ``agpo.sft``, the HF rollout engine and ``student.model`` follow the model's device for
every batch, mask and generated tensor. Under DeepSpeed the engine places the model itself (its accelerator,
``cuda:LOCAL_RANK``) and its JSON's ``bf16`` section sets the precision. MLflow params name the choice
(``device_used``, ``precision_used``), as they do the threads (pipelines.threads).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from compute.placement import Placement

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")
PRECISIONS = ("auto", "fp32", "bf16")


class DeviceUnavailable(ValueError):
    """The config names a device this machine does not have."""


@dataclass(frozen=True)
class Accelerators:
    """What this machine offers: how many CUDA devices torch sees, and whether they compute in bf16."""

    cuda_devices: int
    bf16: bool

    @classmethod
    def probe(cls) -> Accelerators:
        import torch  # only when a stage runs: configs stay importable without it

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(count, bool(count) and torch.cuda.is_bf16_supported())


@dataclass(frozen=True)
class DeviceChoice:
    """The device and precision a stage runs with, and why."""

    device: str  # "cpu", "cuda:0", ...
    precision: str  # "fp32" or "bf16"
    source: str

    def torch_device(self) -> Any:
        import torch

        return torch.device(self.device)

    def autocast_dtype(self) -> Any:
        """The dtype forward passes autocast to; None for fp32 (no autocast)."""
        import torch

        return torch.bfloat16 if self.precision == "bf16" else None

    def placement(self) -> Placement:
        """Where a student runs (student.model's ``RelevanceStudent.place``)."""
        return Placement(self.device, self.autocast_dtype())

    def describe(self) -> str:
        return f"{self.device}, {self.precision} ({self.source})"

    def params(self) -> dict[str, str]:
        """For MLflow: what the stage ran on."""
        return {"device_used": self.device, "precision_used": self.precision, "device_source": self.source}


def check_device(value: object) -> None:
    """A ``device`` key's value is well formed (availability is checked when the stage runs)."""
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {value!r}")


def check_precision(value: object) -> None:
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {value!r}")


def choose_device(
    device: str,
    precision: str = "auto",
    accelerators: Accelerators | None = None,
    environ: Mapping[str, str] = os.environ,
) -> DeviceChoice:
    """The device and precision of the module docstring's rule; ``DeviceUnavailable`` for a GPU not there."""
    check_device(device)
    check_precision(precision)
    found = accelerators or Accelerators.probe()
    local_rank = environ.get("LOCAL_RANK", "").strip()
    if device == "cpu" or (device == "auto" and not found.cuda_devices):
        chosen, source = "cpu", "device=cpu" if device == "cpu" else "auto: no CUDA device"
    else:
        index = int(device.partition(":")[2] or (local_rank if local_rank.isdigit() else 0))
        if index >= found.cuda_devices:
            have = f"{found.cuda_devices} CUDA device(s)" if found.cuda_devices else "no CUDA device"
            raise DeviceUnavailable(
                f"device={device} but torch sees {have} (index {index}); set device=auto or device=cpu, or run "
                "on a machine with the GPU and a CUDA build of torch"
            )
        chosen, source = f"cuda:{index}", "auto" if device == "auto" else f"device={device}"
        if ":" not in device and local_rank.isdigit():
            source += f", torchrun local rank {local_rank}"
    if precision == "auto":
        bf16 = chosen != "cpu" and found.bf16
        return DeviceChoice(chosen, "bf16" if bf16 else "fp32", f"{source}; precision auto")
    return DeviceChoice(chosen, precision, f"{source}; precision={precision}")


def use_device(config: Any, accelerators: Accelerators | None = None) -> DeviceChoice:
    """The choice for a stage config with a ``device`` key (and ``precision``: ``auto`` where it has none)."""
    return choose_device(config.device, getattr(config, "precision", "auto"), accelerators)


def device_configs(config: Any) -> Iterator[Any]:
    """``config`` and every config nested in it that has a ``device`` key."""
    if not is_dataclass(config):
        return
    if isinstance(getattr(config, "device", None), str):
        yield config
    for item in fields(config):
        yield from device_configs(getattr(config, item.name))


def check_devices(config: Any, accelerators: Accelerators | None = None) -> None:
    """Before a stage runs: every device its config (and the stages a pipeline nests) names is present."""
    configs = list(device_configs(config))
    if configs:
        found = accelerators or Accelerators.probe()
        for nested in configs:
            use_device(nested, found)


def step_device(params: object) -> dict[str, str]:
    """A step's MLflow params naming its device choice (none for a step without a ``device`` key)."""
    return use_device(params).params() if isinstance(getattr(params, "device", None), str) else {}


def device_field() -> Any:
    return field(
        default="auto",
        metadata={
            "help": "where the stage's models run: auto (the GPU when torch sees one, else the CPU; a torchrun rank "
            "takes cuda:LOCAL_RANK), cpu, cuda or cuda:N (pipelines/devices.py); MLflow params device_used names it"
        },
    )


def precision_field() -> Any:
    return field(
        default="auto",
        metadata={
            "help": "auto (bf16 on a GPU that supports it, fp32 on the CPU), fp32 or bf16 (autocast; weights and "
            "optimizer stay float32)"
        },
    )


def check_device_keys(config: Any) -> None:
    """In a stage config's ``__post_init__``."""
    check_device(config.device)
    check_precision(config.precision)


def pass_device_down(pipeline: Any, stages: tuple[str, ...]) -> None:
    """In a pipeline config's ``__post_init__``: each of ``stages`` whose ``device`` / ``precision`` is ``auto``
    takes the pipeline's (its --print-config and params then show what it runs with)."""
    check_device_keys(pipeline)
    for name in stages:
        stage = getattr(pipeline, name)
        changes = {
            key: getattr(pipeline, key)
            for key in ("device", "precision")
            if getattr(stage, key) == "auto" and getattr(pipeline, key) != "auto"
        }
        if changes:
            object.__setattr__(pipeline, name, replace(stage, **changes))  # frozen: set once, here


def teacher_on_device(
    model_dir: Any, engine: str, engine_options: Mapping[str, Any], choice: DeviceChoice, trains: bool = False
) -> tuple[Any, Any, Any]:
    """(model, tokenizer, rollout engine) of the causal LM in ``model_dir`` for a stage on ``choice``. The model
    goes to the device, except where vLLM serves it and nothing trains it (vLLM holds its own copy on the GPU;
    the model only hands it its weights once); the hf engine's passes run in the choice's precision."""
    from agpo.models import load_model
    from agpo.rollout.factory import build_engine

    model, tokenizer = load_model(model_dir)
    if trains or engine != "vllm":
        model.to(choice.torch_device())
    rollout = build_engine(
        engine, model, tokenizer, model_dir, autocast_dtype=choice.autocast_dtype(), **engine_options
    )
    return model, tokenizer, rollout
