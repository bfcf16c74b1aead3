"""compute.placement: the autocast context both libraries' forward passes enter, read back from torch's own state."""

import torch

from compute.placement import ON_CPU, Placement, autocast


def autocast_state(device_type: str) -> torch.dtype | None:
    """The dtype torch autocasts to on ``device_type`` right now, or None when autocast is off there."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def test_no_dtype_leaves_forward_passes_in_the_weights_precision():
    with autocast("cpu", None):
        assert autocast_state("cpu") is None
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float32
    with ON_CPU.autocast():
        assert autocast_state("cpu") is None


def test_bf16_runs_forward_passes_in_bf16_and_ends_with_the_context():
    linear = torch.nn.Linear(2, 2)
    with Placement("cpu", torch.bfloat16).autocast():
        assert autocast_state("cpu") == torch.bfloat16
        assert linear(torch.ones(1, 2)).dtype == torch.bfloat16
        assert linear.weight.dtype == torch.float32  # mixed precision: the weights stay float32
    assert autocast_state("cpu") is None


def test_a_device_name_with_an_index_autocasts_on_its_type():
    with autocast(torch.device("cpu"), torch.bfloat16):
        assert autocast_state("cpu") == torch.bfloat16
    assert Placement("cuda:1").device == "cuda:1" and Placement().device == ON_CPU.device == "cpu"
