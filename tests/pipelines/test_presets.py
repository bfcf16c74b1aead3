"""The shipped presets load, validate and combine with every algorithm preset (the GPU one is not run here)."""

from pathlib import Path

import pytest
import yaml

from agpo.distributed import load_deepspeed_config
from agpo.trainer_config import RENAMED_KEYS
from pipelines.ads.pipeline import AdsPipelineConfig
from pipelines.ads.teacher.train import TrainTeacherConfig
from pipelines.config import load_config
from pipelines.math.math_compare import MathCompareConfig
from pipelines.math.math_eval import MathEvalConfig
from pipelines.math.math_pipeline import MathPipelineConfig
from pipelines.math.math_train import MathTrainConfig

ROOT = Path(__file__).resolve().parents[2]
ALGORITHMS = sorted((ROOT / "configs" / "train").glob("*.yaml"))
GPUS = 8


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda p: p.stem)
def test_gpu_7b_preset_is_a_valid_multi_gpu_run(algorithm):
    config = load_config(TrainTeacherConfig, [ROOT / "configs" / "gpu-7b.yaml", algorithm])
    assert config.engine == "vllm" and config.engine_options["dtype"] == "bfloat16"
    ds = load_deepspeed_config(ROOT / config.deepspeed)
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"]
    rollout = config.trainer.rollout
    assert rollout.group_size == 8 and rollout.prompts_per_step % GPUS == 0
    assert config.trainer.checkpoint.every > 0  # DeepSpeed's checkpoints (tests/agpo/test_deepspeed.py)
    per_gpu_rows = rollout.prompts_per_step // GPUS * rollout.group_size
    assert per_gpu_rows % config.trainer.optimizer.micro_batch_size == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda p: p.stem)
def test_cpu_tiny_preset_combines_with_every_algorithm(algorithm):
    config = load_config(TrainTeacherConfig, [ROOT / "configs" / "cpu-tiny.yaml", algorithm])
    assert config.engine == "hf" and config.deepspeed is None
    assert config.trainer.checkpoint.every > 0


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=lambda p: p.stem)
def test_gpu_math_preset_is_the_papers_multi_gpu_run(algorithm):
    config = load_config(MathTrainConfig, [ROOT / "configs" / "math" / "gpu-qwen2.5-math-7b.yaml", algorithm])
    assert config.dataset == "gsm8k" and "Qwen2.5-Math-7B" in config.base_model
    assert config.engine == "vllm" and config.engine_options["dtype"] == "bfloat16"
    ds = load_deepspeed_config(ROOT / config.deepspeed)
    assert ds["zero_optimization"]["stage"] == 3 and ds["bf16"]["enabled"]
    rollout = config.trainer.rollout
    assert rollout.group_size == 8 and rollout.prompts_per_step % GPUS == 0
    assert config.trainer.token_budget is not None and config.trainer.checkpoint.every > 0
    per_gpu_rows = rollout.prompts_per_step // GPUS * rollout.group_size
    assert per_gpu_rows % config.trainer.optimizer.micro_batch_size == 0
    prompt_room = config.engine_options["max_model_len"] - rollout.max_new_tokens
    assert prompt_room >= 512  # GSM8K prompts are < 300 tokens


def test_gpu_math_eval_preset_scores_math500_to_pass_at_64():
    config = load_config(MathEvalConfig, ROOT / "configs" / "math" / "gpu-eval-math500.yaml")
    assert config.dataset == "math500" and config.samples == 64 and config.engine == "vllm"
    assert config.engine_options["max_model_len"] - config.max_new_tokens >= 512


def test_math_compare_refuses_deepspeed_and_points_to_torchrun():
    with pytest.raises(ValueError, match="torchrun"):
        load_config(MathCompareConfig, [], ["train.deepspeed=configs/deepspeed/zero3-gpu.json"])


def test_cpu_math_compare_preset_is_the_issue_s_experiment():
    config = load_config(MathCompareConfig, ROOT / "configs" / "math" / "cpu-compare.yaml")
    assert set(config.algorithms) == {"grpo", "agpo", "w_reinforce", "adaptive_agpo"}
    assert len(config.seeds) == 3 and config.samples == 64
    assert config.train.trainer.token_budget is not None and config.train.deepspeed is None


PIPELINE_PRESETS = sorted((ROOT / "configs" / "pipeline").glob("*.yaml"))


@pytest.mark.parametrize("preset", PIPELINE_PRESETS, ids=lambda p: p.stem)
def test_every_pipeline_preset_loads_as_the_dag_loads_it(preset):
    cls = MathPipelineConfig if preset.stem.startswith("math") else AdsPipelineConfig
    config = load_config(cls, [preset, f"train={ROOT / 'configs/train/grpo.yaml'}"])  # the DAG adds the algorithm
    assert config.train.trainer.algorithm == "grpo"


def test_the_small_lm_preset_trains_the_same_top_layers_in_sft_and_rl_and_labels_by_score():
    config = load_config(AdsPipelineConfig, [ROOT / "configs/pipeline/small-lm.yaml"])
    assert config.teacher.base_model == "smollm2-135m-instruct" and config.teacher.answer_format == "answer"
    assert config.teacher.trainable_layers == config.train.trainer.optimizer.trainable_layers > 0
    assert config.annotate.voting.mode == "score" and config.distil.student.backbone == "all-minilm-l6-v2"
    assert config.gate_metric == "audit_greedy_accuracy_end"  # score mode labels with the argmax


def trainer_sections(node):
    """Every mapping under a ``trainer`` key in a loaded YAML tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "trainer" and isinstance(value, dict):
                yield value
            yield from trainer_sections(value)


@pytest.mark.parametrize("preset", sorted((ROOT / "configs").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_shipped_preset_uses_a_deprecated_trainer_key(preset):
    """The trainer's flat keys of the previous release still load (with a warning); the presets use the sections."""
    tree = yaml.safe_load(preset.read_text(encoding="utf-8"))
    old = [key for trainer in trainer_sections(tree) for key in trainer if key in RENAMED_KEYS]
    assert not old, f"{preset}: deprecated trainer keys {old}; use {[RENAMED_KEYS[k] for k in old]}"
