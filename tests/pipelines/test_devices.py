"""The device rule (pipelines/devices.py): what each key resolves to on machines with and without GPUs, a GPU the
machine lacks as a one-line config error (exit 2) for every stage that has the key, and every stage's forward
passes running where and how the rule says.

Without a GPU the placement is proved through what travels with it: every stage hands its models the one
``DeviceChoice``, whose device and precision go together into the same calls (``model.to``, ``place``, the
engines' and trainers' ``autocast_dtype``). A forward hook on every embedding and linear layer records, for each
pass, the device of its inputs beside that of its weights and the autocast state: with ``precision=bf16`` on the
CPU every pass of every stage must run under bf16 autocast with its batch on its weights' device, and with
``auto`` none may (the CPU's auto is fp32, so CPU figures stay as they were).
"""

import dataclasses

import pytest
import torch

from pipelines.ads.pipeline_config import AdsPipelineConfig
from pipelines.cli import STAGES, main
from pipelines.config import load_config
from pipelines.devices import (
    Accelerators,
    DeviceUnavailable,
    check_devices,
    choose_device,
    device_configs,
    step_device,
)

NO_GPU = Accelerators(cuda_devices=0, bf16=False)
TWO_H100 = Accelerators(cuda_devices=2, bf16=True)
TWO_V100 = Accelerators(cuda_devices=2, bf16=False)


@pytest.mark.parametrize(
    ("device", "precision", "found", "environ", "expected"),
    [
        ("auto", "auto", NO_GPU, {}, ("cpu", "fp32")),
        ("auto", "auto", TWO_H100, {}, ("cuda:0", "bf16")),
        ("auto", "auto", TWO_V100, {}, ("cuda:0", "fp32")),  # no bf16 on the device: float32
        ("auto", "auto", TWO_H100, {"LOCAL_RANK": "1"}, ("cuda:1", "bf16")),  # a torchrun rank: its own GPU
        ("cuda", "fp32", TWO_H100, {"LOCAL_RANK": "1"}, ("cuda:1", "fp32")),
        ("cuda:1", "auto", TWO_H100, {"LOCAL_RANK": "0"}, ("cuda:1", "bf16")),  # an index is taken as written
        ("cpu", "auto", TWO_H100, {}, ("cpu", "fp32")),
        ("cpu", "bf16", NO_GPU, {}, ("cpu", "bf16")),  # bf16 autocast on a CPU, when asked for
    ],
)
def test_the_rule_resolves_each_key(device, precision, found, environ, expected):
    choice = choose_device(device, precision, found, environ)
    assert (choice.device, choice.precision) == expected
    assert choice.params()["device_used"] == expected[0]


@pytest.mark.parametrize(
    ("device", "found", "message"),
    [
        ("cuda", NO_GPU, "device=cuda but torch sees no CUDA device"),
        ("cuda:2", TWO_H100, r"device=cuda:2 but torch sees 2 CUDA device\(s\) \(index 2\)"),
    ],
)
def test_a_gpu_the_machine_lacks_is_refused_saying_what_to_set(device, found, message):
    with pytest.raises(DeviceUnavailable, match=message) as error:
        choose_device(device, "auto", found)
    assert "set device=auto or device=cpu" in str(error.value)


@pytest.mark.parametrize(("key", "value"), [("device", "gpu"), ("device", "cuda:x"), ("precision", "fp16")])
def test_malformed_keys_are_config_errors(key, value):
    with pytest.raises(ValueError, match=key):
        choose_device(**{"device": "auto", "precision": "auto", key: value}, accelerators=NO_GPU)


def test_a_pipeline_passes_its_device_to_the_stages_that_leave_theirs_auto():
    config = load_config(AdsPipelineConfig, [], ["device=cpu", "precision=bf16", "distil.device=auto"])
    assert {(c.device, c.precision) for c in device_configs(config)} == {("cpu", "bf16")}
    config = load_config(AdsPipelineConfig, [], ["distil.device=cuda"])
    with pytest.raises(DeviceUnavailable, match="device=cuda"):
        check_devices(config, NO_GPU)
    check_devices(config, TWO_H100)


DEVICE_STAGES = sorted(
    name for name, stage in STAGES.items() if any(f.name == "device" for f in dataclasses.fields(stage.config()))
)


def test_every_stage_that_runs_a_model_has_the_keys():
    assert {"teacher", "train", "annotate", "distil", "evaluate", "score", "serve", "math-train", "math-eval"} <= set(
        DEVICE_STAGES
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("stage", DEVICE_STAGES)
def test_agpo_stage_with_device_cuda_exits_2_with_one_line(stage, capsys):
    assert main([stage, "--set", "device=cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"agpo {stage}: config error: device=cuda"), err


class ForwardRecorder:
    """Per pass of a model's embedding or linear layer (every model reads its batch through the one and computes
    through the other): (the layer's weights' device, the devices of its tensor inputs, the autocast dtype or
    None). A global hook sees positional inputs only, which is how these layers are called."""

    def __init__(self) -> None:
        self.passes: list[tuple[str, set[str], torch.dtype | None]] = []

    def __call__(self, module, args):
        if not isinstance(module, torch.nn.Embedding | torch.nn.Linear):
            return
        weights = module.weight.device
        inputs = {str(value.device) for value in args if isinstance(value, torch.Tensor)}
        autocast = torch.get_autocast_dtype(weights.type) if torch.is_autocast_enabled(weights.type) else None
        self.passes.append((str(weights), inputs, autocast))


@pytest.fixture
def recorder():
    record = ForwardRecorder()
    handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
    yield record
    handle.remove()


def assert_every_pass(stage: str, recorder: ForwardRecorder, device: str, autocast: torch.dtype | None) -> None:
    assert recorder.passes, f"{stage}: no forward pass recorded"
    wrong = {(w, frozenset(i), a) for w, i, a in recorder.passes if (w, a) != (device, autocast) or not i <= {device}}
    assert not wrong, (stage, wrong)


def stage_settings(pairs, teacher, out) -> dict[str, tuple[str, dict]]:
    """Each stage that runs a model on tiny inputs: name -> (its command, its settings)."""
    annotating = {"teacher": teacher, "input.path": pairs, "input.split": "unlabeled", "gold": "null"}
    student = out / "student" / "model"
    return {
        "teacher SFT": (
            "teacher",
            {"pairs": pairs, "out_dir": out / "sft", "sft_examples": 24, "audit_examples": 8, "sft.epochs": 1}
            | {"model.hidden_size": 64, "model.intermediate_size": 128},
        ),
        "teacher RL": (
            "train",
            {"pairs": pairs, "base_model": teacher, "out_dir": out / "rl", "audit_examples": 8, "audit_samples": 1}
            | {"trainer.max_steps": 1, "trainer.rollout.group_size": 2, "trainer.rollout.prompts_per_step": 2}
            | {"trainer.rollout.max_new_tokens": 8},
        ),
        "annotate (sample)": (
            "annotate",
            annotating | {"out_dir": out / "annotate", "voting.votes": 2, "voting.max_new_tokens": 12},
        ),
        "annotate (score)": ("annotate", annotating | {"out_dir": out / "scored", "voting.mode": "score"}),
        "distil": (
            "distil",
            {"pairs": pairs, "labels": out / "annotate" / "labels", "out_dir": out / "student", "export_onnx": False}
            | {"student.tiny_hidden": 32, "student.tiny_vocab": 300, "training.epochs": 1},
        ),
        "evaluate": ("evaluate", {"pairs": pairs, "model": student, "out_dir": out / "eval"}),
        "score": ("score", {"input.path": pairs, "input.split": "test", "model": student, "out_dir": out / "score"}),
    }


@pytest.mark.integration
@pytest.mark.parametrize(("precision", "autocast"), [("bf16", torch.bfloat16), ("auto", None)])
def test_every_stage_runs_its_forward_passes_as_the_rule_says(small_teacher, tmp_path, recorder, precision, autocast):
    _, pairs, teacher = small_teacher
    for name, (command, settings) in stage_settings(pairs, teacher, tmp_path).items():
        sets = {**settings, "device": "cpu", "precision": precision}
        config = load_config(STAGES[command].config(), [], [f"{key}={value}" for key, value in sets.items()])
        recorder.passes.clear()
        STAGES[command].runner()(config)
        assert_every_pass(name, recorder, "cpu", autocast)


def test_a_steps_mlflow_params_name_the_device_it_chose():
    config = load_config(AdsPipelineConfig, [], ["device=cpu"]).distil
    assert step_device(config) == {
        "device_used": "cpu",
        "precision_used": "fp32",
        "device_source": "device=cpu; precision auto",
    }
    assert step_device(object()) == {}
