"""The teacher stage from a pretrained model: chat template, answer format, LoRA merged, prompt carried to RL.

The "pretrained" model here is a tiny local HF directory with a chat template (seconds on CPU); the packaged
SmolLM2 runs through the same code in tests/integration (minutes).
"""

import json

import pytest
import torch

from agpo.lora import LoRAConfig
from agpo.models import TinyModelConfig, build_tiny_qwen2, load_model, save_model, train_bpe_tokenizer
from agpo.sft import SFTConfig
from agpo.trainer import TrainerConfig
from agpo.trainer_config import RolloutConfig
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as prepare
from pipelines.ads.intake.synthetic import SyntheticConfig
from pipelines.ads.teacher.prompts import PROMPT_FILE, RELEVANCE_INSTRUCT_V1
from pipelines.ads.teacher.train import TrainTeacherConfig
from pipelines.ads.teacher.train import run as train
from pipelines.ads.teacher.warm_start import TeacherConfig
from pipelines.ads.teacher.warm_start import run as build_teacher

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_base(tmp_path_factory):
    """Synthetic pairs and a tiny 'instruction-tuned' base directory (random weights, ChatML template)."""
    work = tmp_path_factory.mktemp("chat-base")
    synthetic = SyntheticConfig(train=40, audit=8, unlabeled=8, test=8)
    pairs = prepare(DataConfig(out_dir=str(work / "data"), synthetic=synthetic))["pairs"]
    tokenizer = train_bpe_tokenizer([RELEVANCE_INSTRUCT_V1.instruction, "<answer>3</answer> red shoes"] * 5, 300)
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, intermediate_size=128))
    save_model(model, tokenizer, work / "base")
    return work, pairs


def test_lora_sft_of_a_chat_model_saves_a_plain_merged_model_that_rl_prompts_the_same_way(chat_base):
    work, pairs = chat_base
    config = TeacherConfig(
        pairs=str(pairs),
        out_dir=str(work / "sft"),
        base_model=str(work / "base"),
        answer_format="answer",
        sft_examples=16,
        audit_examples=8,
        max_new_tokens=8,
        sft=SFTConfig(epochs=1, batch_size=8, learning_rate=1e-2),
        lora=LoRAConfig(rank=4, target_modules=("q_proj", "v_proj")),
    )
    paths = build_teacher(config)
    report = json.loads(paths["report"].read_text())
    assert report["base_model"] == str(work / "base") and report["lora_rank"] == 4
    assert 0 < report["trainable_parameters"] < report["parameters"] / 10
    assert (report["chat_template"], report["answer_format"]) == (True, "answer")
    assert report["audit_unparseable_sft"] == 0.0  # graded within the grammar: every answer parses
    assert sum(report[f"audit_sft_predicted/g{g}"] for g in range(4)) == pytest.approx(1.0)
    assert json.loads((paths["model"] / PROMPT_FILE).read_text())["answer_format"] == "answer"
    assert not (paths["model"] / "adapter_config.json").exists()
    base, _ = load_model(work / "base")
    tuned, _ = load_model(paths["model"])
    changed = [n for n, p in tuned.named_parameters() if not torch.equal(p, base.get_parameter(n))]
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)

    rl = TrainTeacherConfig(
        pairs=str(pairs),
        base_model=str(paths["model"]),
        out_dir=str(work / "rl"),
        audit_examples=4,
        audit_samples=2,
        trainer=TrainerConfig(
            max_steps=1, eval_every=0, rollout=RolloutConfig(group_size=2, prompts_per_step=2, max_new_tokens=8)
        ),
    )
    summary = json.loads(train(rl)["summary"].read_text())
    assert (summary["prompt_version"], summary["answer_format"]) == ("relevance-instruct-v1", "answer")
    assert json.loads((work / "rl" / "model" / PROMPT_FILE).read_text())["chat_template"] is True


def test_trainable_layers_fine_tune_the_top_layer_alone(chat_base):
    work, pairs = chat_base
    config = TeacherConfig(
        pairs=str(pairs),
        out_dir=str(work / "sft-top"),
        base_model=str(work / "base"),
        answer_format="answer",
        sft_examples=16,
        audit_examples=4,
        max_new_tokens=8,
        trainable_layers=1,
        sft=SFTConfig(epochs=1, batch_size=8, learning_rate=1e-2),
    )
    paths = build_teacher(config)
    report = json.loads(paths["report"].read_text())
    base, _ = load_model(work / "base")
    tuned, _ = load_model(paths["model"])
    top = len(base.model.layers) - 1
    changed = {n for n, p in tuned.named_parameters() if not torch.equal(p, base.get_parameter(n))}
    assert changed == {n for n, _ in base.named_parameters() if n.startswith(f"model.layers.{top}.")}
    assert report["trainable_layers"] == 1
    assert report["trainable_parameters"] == sum(p.numel() for p in base.model.layers[top].parameters())


def test_lora_and_trainable_layers_need_a_pretrained_base():
    with pytest.raises(ValueError, match="lora needs a base_model"):
        TeacherConfig(lora=LoRAConfig(rank=8))
    with pytest.raises(ValueError, match="trainable_layers needs a base_model"):
        TeacherConfig(trainable_layers=2)
