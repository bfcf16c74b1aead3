"""The ads pipeline's stages on one device, as a GPU worker would run them: teacher SFT, teacher RL, annotation in
score mode, student distillation on the teacher's labels, and scoring, each through its stage's own ``run`` with
``device: auto`` (the GPU when torch sees one; bf16 there, fp32 on a CPU).

Nothing is downloaded: the data is the synthetic set (``--pairs`` unlabeled pairs to annotate and score; 2,000
gold train, 200 audit, 1,000 test); the teacher is the tiny Qwen2 built and warmed up by the teacher stage; the
student's backbone is an encoder of all-MiniLM-L6-v2's shape (hidden 384, 6 layers, 12 heads, MLP 1,536) with
random weights and a BPE tokenizer learned here (``--tiny``: hidden 32, one layer), saved as a local folder the
distil stage loads. Per stage: seconds, its work rate (SFT examples/s, RL generated tokens/s, annotated, distilled
and scored pairs/s) and the peak GPU memory it allocated (null on a CPU).

Run through ``benchmarks/gpu_check.sh`` on a GPU machine (100,000 pairs, a few minutes on one GPU) and here on
the CPU at a smaller size for the side-by-side rates; ``--tiny`` runs every stage in seconds (the CI test).
Writes results/gpu_pipeline.json (``--name`` for another file).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from common import write_results
from transformers import BertConfig, BertForSequenceClassification

from agpo.sft_config import SFTConfig
from pipelines.ads.annotation import annotate
from pipelines.ads.distillation import distil
from pipelines.ads.intake import data
from pipelines.ads.serving import score
from pipelines.ads.teacher import train
from pipelines.ads.teacher import warm_start as teacher
from pipelines.config import load_config
from pipelines.devices import choose_device
from student.model import train_pair_tokenizer

MINILM_SHAPE = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
TINY_SHAPE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 64}


def student_backbone(folder: Path, texts: list[str], tiny: bool) -> Path:
    """A random-weight encoder of MiniLM's shape (``tiny``: a small one) with a BPE tokenizer, as a model folder."""
    tokenizer = train_pair_tokenizer(texts, 4096 if not tiny else 300)
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=512,
        num_labels=4,
        pad_token_id=tokenizer.pad_token_id,
        **(TINY_SHAPE if tiny else MINILM_SHAPE),
    )
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


def measured(work: Callable[[], Any]) -> tuple[Any, float, float | None]:
    """(result, seconds, peak GPU memory in GiB allocated during ``work``; None without a GPU)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = work()
    if cuda:
        torch.cuda.synchronize()
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None
    return result, time.perf_counter() - started, peak


def stage(module: Any, config_class: type, sets: dict[str, Any]) -> Callable[[], dict[str, Path]]:
    return lambda: module.run(load_config(config_class, [], [f"{key}={value}" for key, value in sets.items()]))


def run_pipeline(work: Path, pairs: int, tiny: bool) -> dict[str, Any]:
    sizes = {"train": 200 if tiny else 2000, "audit": 40 if tiny else 200, "test": 40 if tiny else 1000}
    made = data.run(
        load_config(
            data.DataConfig,
            [],
            [f"out_dir={work / 'data'}", f"synthetic.unlabeled={pairs}"]
            + [f"synthetic.{split}={n}" for split, n in sizes.items()],
        )
    )
    pairs_file = made["pairs"]
    rows = json.loads(Path(made["summary"]).read_text())["per_split"]
    sft_steps, rl_steps = (2, 1) if tiny else (100, 4)
    teacher_sets = {"pairs": pairs_file, "out_dir": work / "teacher", "audit_examples": 16 if tiny else 100}
    teacher_sets |= {"sft.max_steps": sft_steps, "sft.eval_every": 0}
    if tiny:
        teacher_sets |= {"model.hidden_size": 64, "model.intermediate_size": 128}
    model = work / "teacher"
    rl = {"pairs": pairs_file, "base_model": model, "out_dir": work / "rl", "audit_examples": 16, "audit_samples": 1}
    rl |= {"trainer.max_steps": rl_steps, "trainer.eval_every": 0, "trainer.checkpoint.every": 0}
    rl |= {"trainer.rollout.prompts_per_step": 4 if tiny else 32, "trainer.rollout.group_size": 2 if tiny else 8}
    labels = work / "annotate"
    annotating = {"teacher": model, "input.path": pairs_file, "input.split": "unlabeled", "out_dir": labels}
    annotating |= {"voting.mode": "score", "voting.batch_pairs": 64 if tiny else 1024, "gold": "null"}
    backbone = student_backbone(work / "backbone", _texts(pairs_file), tiny)
    distilling = {"pairs": pairs_file, "labels": labels / "labels", "out_dir": work / "student", "export_onnx": False}
    distilling |= {"student.backbone": backbone, "student.kind": "cross", "training.epochs": 1}
    distilling |= {"training.min_epochs": 1, "training.batch_size": 32 if tiny else 256, "zero_shot_floor": False}
    scoring = {"input.path": pairs_file, "input.split": "unlabeled", "model": work / "student" / "model"}
    scoring |= {"out_dir": work / "score", "batch_size": 32 if tiny else 1024}
    stages = {
        "teacher_sft": stage(teacher, teacher.TeacherConfig, teacher_sets),
        "teacher_rl": stage(train, train.TrainTeacherConfig, rl),
        "annotate_score_mode": stage(annotate, annotate.AnnotateConfig, annotating),
        "distil": stage(distil, distil.DistilConfig, distilling),
        "score": stage(score, score.ScoreConfig, scoring),
    }
    table = {}
    for name, work_of in stages.items():
        outputs, seconds, peak = measured(work_of)
        table[name] = {"seconds": round(seconds, 2), "peak_gpu_memory_gib": peak, **_rate(name, outputs, seconds)}
        print(name, table[name], flush=True)
    return {"rows_per_split": rows, "stages": table}


def _texts(pairs_file: Path) -> list[str]:
    from pipelines.ads.intake.contracts import read_pairs

    rows = read_pairs(pairs_file, split="train").to_pylist()
    return [f"{r['query']} {r['ad_title']}" for r in rows]


def _rate(name: str, outputs: dict[str, Path], seconds: float) -> dict[str, Any]:
    """The stage's work per second, read from what it wrote."""
    if name == "teacher_sft":
        report = json.loads(Path(outputs["report"]).read_text())
        examples = report["sft_steps"] * SFTConfig().batch_size  # the stage runs with its default batch
        return {"work": "SFT examples", "count": examples, "per_s": round(examples / seconds, 1)}
    if name == "teacher_rl":
        tokens = json.loads(Path(outputs["summary"]).read_text())["generated_tokens"]
        return {"work": "generated tokens", "count": tokens, "per_s": round(tokens / seconds, 1)}
    if name == "distil":
        pairs = json.loads(Path(outputs["summary"]).read_text())["training_pairs"]
        return {"work": "training pairs (one epoch)", "count": pairs, "per_s": round(pairs / seconds, 1)}
    summary = json.loads(Path(outputs["summary"]).read_text())
    pairs = summary["labels"] if name == "annotate_score_mode" else summary["scored"]
    return {"work": "pairs", "count": pairs, "per_s": round(pairs / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="unlabeled pairs annotated, distilled, scored")
    parser.add_argument("--tiny", action="store_true", help="every stage in seconds, on the CPU (the CI test)")
    parser.add_argument("--name", default="gpu_pipeline", help="results file name (without .json)")
    args = parser.parse_args()
    device = choose_device("auto", "auto")
    with tempfile.TemporaryDirectory(prefix="agpo-gpu-pipeline-") as work:
        result = run_pipeline(Path(work), args.pairs, args.tiny)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    write_results(
        args.name, {"gpu": gpu, "device": device.describe(), "pairs": args.pairs, "tiny": args.tiny, **result}
    )


if __name__ == "__main__":
    main()
