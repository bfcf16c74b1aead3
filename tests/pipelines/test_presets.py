"""The shipped presets load, validate and combine with every algorithm preset (the GPU one is not run here)."""

from pathlib import Path

import pytest

from agpo.distributed import load_deepspeed_config
from pipelines.config import load_config
from pipelines.train_teacher import TrainTeacherConfig

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
GPUS = 8


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda p: p.stem)
def test_gpu_7b_preset_is_a_valid_multi_gpu_run(algorithm):
    config = load_config(TrainTeacherConfig, [ROOT / "configs" / "gpu-7b.yaml", algorithm])
    assert config.engine == "vllm" and config.engine_options["dtype"] == "bfloat16"
    ds = load_deepspeed_config(ROOT / config.deepspeed)
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"]
    trainer = config.trainer
    assert trainer.group_size == 8 and trainer.prompts_per_step % GPUS == 0
    assert trainer.checkpoint_every == 0  # checkpoints under DeepSpeed are refused by the trainer
    per_gpu_rows = trainer.prompts_per_step // GPUS * trainer.group_size
    assert per_gpu_rows % trainer.micro_batch_size == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda p: p.stem)
def test_cpu_tiny_preset_combines_with_every_algorithm(algorithm):
    config = load_config(TrainTeacherConfig, [ROOT / "configs" / "cpu-tiny.yaml", algorithm])
    assert config.engine == "hf" and config.deepspeed is None
    assert config.trainer.checkpoint_every > 0
