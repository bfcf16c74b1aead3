"""The one RL stage runner behind ``agpo train`` (relevance) and ``agpo math-train`` (math).

A stage describes its task as an ``RLTask`` (prompts, reward columns, reward, answer extraction, the
evaluation run at the start, every ``trainer.eval_every`` steps and at the end, and what its summary and
curves show); ``run_rl_stage`` does the rest the same way for both:

  processes > 1 outside torchrun -> launch ``agpo <stage>`` as N torchrun ranks (pipelines.launch) and return
  load the base model onto the stage's device (pipelines.devices; DeepSpeed places it itself) -> build the
  rollout engine -> RLTrainer (DeepSpeed when configured; forward passes in the stage's precision)
  -> restore the newest checkpoint (``resume``) and cut ``metrics.jsonl`` back to it (``restart_metrics``:
     a last line torn by a kill while it was appended is dropped)
  -> train, one metrics line per step -> save ``model/`` (every rank; rank 0 writes)
  -> ``summary.json`` (``<metric>_start`` / ``<metric>_end`` of every evaluation metric), ``curves.png``,
     and the end-of-stage summary printed with where the outputs are.

The settings both stages share are fields of their configs (``engine``, ``engine_options``, ``deepspeed``,
``processes``, ``resume``, ``trainer``, ``out_dir``), declared once in pipelines.rl.engine_fields and
pipelines.rl.stage_fields and checked by ``check_rl_settings``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agpo.distributed import load_deepspeed_config
from agpo.rollout import RolloutEngine
from agpo.trainer import RewardFn, RLTrainer
from durable.fileio import read_jsonl
from pipelines.config import ConfigError, move_renamed_keys
from pipelines.devices import DeviceChoice, teacher_on_device, use_device
from pipelines.errors import StageFailed
from pipelines.io import append_metrics, moving_average, print_summary, remove_temps, write_atomic, write_json_atomic
from pipelines.launch import torchrun, under_torchrun
from pipelines.plots import plot_learning_curves
from pipelines.progress import progress_bar
from pipelines.threads import ThreadChoice, use_threads

LOG = logging.getLogger(__name__)

SMOOTHING = 10  # steps averaged in the plotted train reward (one step is only G x prompts samples)


def outputs(out: Path) -> dict[str, Path]:
    """What an RL stage writes into ``out`` (the in-process run and the torchrun launcher both return it)."""
    return {
        "model": out / "model",
        "metrics": out / "metrics.jsonl",
        "summary": out / "summary.json",
        "curves": out / "curves.png",
    }


def run_once(config: Any, train: Callable[[Any], dict[str, Path]]) -> dict[str, Path]:
    """``train(config)``, unless ``config.out_dir`` holds a finished run of this same config: then its paths.

    A finished run leaves ``run_config.json`` (the whole config) beside its summary, so an experiment that
    trains many runs (train-compare, math-compare) reruns as a no-op for the finished ones, and an
    interrupted run resumes from its newest checkpoint (``resume``) or trains again. A record written before
    the trainer config had sections (flat ``trainer.group_size``, ...) is read with its keys moved to them.
    """
    out = Path(config.out_dir)
    settings = json.loads(json.dumps(dataclasses.asdict(config), default=str))
    done = out / "run_config.json"
    if done.is_file() and outputs(out)["summary"].is_file() and _recorded(done, type(config)) == settings:
        return outputs(out)
    paths = train(config)
    write_json_atomic(done, settings)
    return paths


def _recorded(path: Path, cls: type) -> Any:
    """The settings a finished run recorded, old trainer keys moved to their sections."""
    recorded = json.loads(path.read_text())
    try:
        return move_renamed_keys(cls, recorded, warn=False)
    except ConfigError:  # an old and a new key both set: not a record of this config
        return recorded


Evaluate = Callable[[], dict[str, float]]


@dataclass(frozen=True)
class RLTask:
    """What an RL stage trains on and how it is judged."""

    title: str  # "teacher RL", "math RL": the plot title and the summary line
    prompts: Sequence[str]
    columns: Mapping[str, Sequence[object]]  # reward inputs per prompt (gold grade, gold answer)
    reward_fn: RewardFn
    answer_fn: Callable[[str], Hashable | None]
    evaluation: Callable[[RolloutEngine, Any], Evaluate]  # (engine, tokenizer) -> the evaluation callable
    curves: Mapping[str, str]  # plot label -> evaluation metric; the first is the summary line's headline
    summary: Mapping[str, object] = field(default_factory=dict)  # the task's own summary fields
    base_model: str | None = None  # as recorded in the summary; default: the loaded directory
    on_saved: Callable[[Path], object] | None = None  # writes the task's files beside the saved model


def run_rl_stage(stage: str, config: Any, base_dir: Path, rl_task: RLTask) -> dict[str, Path]:
    """Train ``config.trainer`` on ``rl_task`` from ``base_dir``; see the module docstring for the sequence.

    The task is built before the launch, so a torchrun launcher checks the inputs before it starts any rank.
    Returns the output paths; {} on ranks other than 0.
    """
    out = Path(config.out_dir)
    threads = use_threads(config.threads)
    if config.processes > 1 and not under_torchrun():
        torchrun(stage, config, config.processes, out, threads.threads)
        return outputs(out)
    device = use_device(config)
    if config.deepspeed:  # DeepSpeed places the model on its own accelerator: the stage keeps the precision only
        device = replace(device, device="cpu", source=f"{device.source}; the model placed by DeepSpeed")
    model, tokenizer, engine = teacher_on_device(base_dir, config.engine, config.engine_options, device, trains=True)
    out.mkdir(parents=True, exist_ok=True)
    paths = outputs(out)
    trainer = RLTrainer(
        model,
        tokenizer,
        engine,
        rl_task.reward_fn,
        rl_task.prompts,
        {name: list(values) for name, values in rl_task.columns.items()},
        config.trainer,
        answer_fn=rl_task.answer_fn,
        evaluate=rl_task.evaluation(engine, tokenizer),
        progress_bar=progress_bar,
        checkpoint_dir=out / "checkpoints",
        deepspeed_config=load_deepspeed_config(config.deepspeed) if config.deepspeed else None,
        autocast_dtype=device.autocast_dtype(),
    )
    resumed_from = trainer.restore() if config.resume else None
    if trainer.is_main_process:
        restart_metrics(paths["metrics"], resumed_from)
        trainer.callback = lambda step, metrics: append_metrics(paths["metrics"], step, metrics)
    started = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - started
    trainer.save_model(paths["model"])
    if not trainer.is_main_process:
        return {}
    if rl_task.on_saved is not None:
        rl_task.on_saved(paths["model"])
    history, _ = read_jsonl(paths["metrics"])
    summary = {
        "algorithm": config.trainer.algorithm,
        "steps": result.steps,
        "generated_tokens": result.generated_tokens,
        "seconds": round(seconds, 1),
        "resumed_from_step": resumed_from,
        "engine": config.engine,
        "world_size": trainer.updater.world_size,
        **_evaluation_start_and_end(history),
        "train_reward_last": history[-1].get("reward_mean"),
        **_group_signal(history),
        "base_model": rl_task.base_model or str(base_dir),
        **rl_task.summary,
    }
    write_json_atomic(paths["summary"], summary)
    _plot(history, rl_task, config.trainer.algorithm, paths["curves"])
    _print_summary(rl_task, summary, paths, threads, device)
    return paths


def restart_metrics(path: Path, resumed_step: int | None) -> None:
    """A fresh run starts an empty file; a resumed one keeps the lines up to its checkpoint's step (later
    steps are trained again, so each step is written exactly once). A last line torn by a kill while it was
    appended (``append_metrics``) is dropped: its step came after the checkpoint, which is saved after the
    step's line. Any other line that is not JSON stops the stage, naming the file and the line. A temp copy
    left by a kill while the file was rewritten is removed (one training process per run folder)."""
    remove_temps(path.parent, path.name)
    if resumed_step is None:
        path.unlink(missing_ok=True)
        return
    try:
        records, torn = read_jsonl(path) if path.exists() else ([], b"")
    except ValueError as err:
        raise StageFailed(str(err)) from None
    if torn:
        LOG.warning("%s: dropped a torn last line of %d bytes (a kill while it was appended)", path, len(torn))
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records if r["step"] <= resumed_step))


def _group_signal(history: list[dict[str, Any]]) -> dict[str, float]:
    """The mean share of groups with no learning signal over the steps: every sample right
    (``all_correct_frac_mean``) or every sample wrong (``all_wrong_frac_mean``)."""
    steps = [h for h in history if "all_correct_frac" in h]
    if not steps:
        return {}
    return {f"{k}_mean": sum(h[k] for h in steps) / len(steps) for k in ("all_correct_frac", "all_wrong_frac")}


def _evaluation_start_and_end(history: list[dict[str, Any]]) -> dict[str, float]:
    """``<metric>_start`` and ``<metric>_end`` of every evaluation metric (logged as ``eval/<metric>``)."""
    evals = [h for h in history if any(k.startswith("eval/") for k in h)]
    if not evals:
        return {}
    names = [k.removeprefix("eval/") for k in evals[0] if k.startswith("eval/")]
    return {
        f"{name}_{edge}": row[f"eval/{name}"]
        for name in names
        for edge, row in (("start", evals[0]), ("end", evals[-1]))
    }


def _plot(history: list[dict[str, Any]], task: RLTask, algorithm: str, path: Path) -> Path:
    steps = [h for h in history if "reward_mean" in h]
    curves = {
        f"train reward ({SMOOTHING}-step mean)": (
            [h["step"] for h in steps],
            moving_average([h["reward_mean"] for h in steps], SMOOTHING),
        )
    }
    for label, metric in task.curves.items():
        evals = [h for h in history if f"eval/{metric}" in h]
        curves[label] = ([h["step"] for h in evals], [h[f"eval/{metric}"] for h in evals])
    title = f"{task.title[0].upper()}{task.title[1:]} with {algorithm}"
    return plot_learning_curves(curves, path, title=title, xlabel="step", ylabel="reward / accuracy")


def _print_summary(
    task: RLTask, summary: dict[str, Any], paths: dict[str, Path], threads: ThreadChoice, device: DeviceChoice
) -> None:
    changes = ", ".join(
        f"{label} {summary[f'{metric}_start']:.3f} -> {summary[f'{metric}_end']:.3f}"
        for label, metric in task.curves.items()
    )
    signal = ""
    if "all_correct_frac_mean" in summary:
        signal = (
            f" (groups without signal: {summary['all_correct_frac_mean']:.0%} all right, "
            f"{summary['all_wrong_frac_mean']:.0%} all wrong)"
        )
    print_summary(
        f"{task.title} ({summary['algorithm']}): {changes} in {summary['steps']} steps{signal}, "
        f"{summary['generated_tokens']:,} generated tokens, {summary['seconds']} s",
        paths,
        threads,
        device,
    )
