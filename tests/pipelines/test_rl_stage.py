"""The one RL stage runner behind `agpo train` and `agpo math-train`: each stage killed with SIGKILL and rerun
writes the same metrics, step for step, as a run that was never interrupted, and every step exactly once, also
when the kill tore the last line of metrics.jsonl; a corrupt checkpoint is refused; math-train trains with two
torchrun ranks from `processes: 2` alone; both configs check the shared settings the same way."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agpo.trainer_config import TIMING_METRICS
from pipelines.ads.teacher.train import TrainTeacherConfig
from pipelines.config import load_config
from pipelines.errors import StageFailed
from pipelines.logs import configure_logging
from pipelines.math.math_train import MathTrainConfig
from pipelines.rl.stage import _evaluation_start_and_end, outputs, restart_metrics, run_once

ROOT = Path(__file__).resolve().parents[2]
MAX_STEPS = 8
TRAINER = {
    "trainer.max_steps": MAX_STEPS,
    "trainer.rollout.group_size": 4,
    "trainer.rollout.prompts_per_step": 4,
    "trainer.rollout.max_new_tokens": 16,
    "trainer.eval_every": 4,
    "trainer.checkpoint.every": 2,
    "trainer.checkpoint.keep": 2,
    "trainer.optimizer.lr_schedule": "cosine",
    "trainer.optimizer.learning_rate": 1e-3,
}


def stage_command(stage: str, sets: dict) -> list[str]:
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    return [sys.executable, "-m", "pipelines.cli", stage, *args]


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING_METRICS} for row in rows]


def steps_written(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) - 1 if path.exists() else 0


@pytest.fixture(params=["train", "math-train"])
def stage_settings(request):
    """(stage, work dir, its settings without out_dir): the relevance teacher or the arithmetic model."""
    if request.param == "train":
        work, pairs, model = request.getfixturevalue("small_teacher")
        sets = {"pairs": pairs, "base_model": model, "audit_examples": 16, "audit_samples": 2}
    else:
        work, base, math_sets = request.getfixturevalue("small_math_base")
        sets = {**math_sets, "base_model": base}
    return request.param, work / f"resume-{request.param}", {**sets, **TRAINER}


@pytest.mark.integration
def test_sigkill_then_rerun_gives_the_uninterrupted_metrics(stage_settings):
    stage, work, sets = stage_settings
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    whole, killed = work / "whole", work / "killed"
    done = subprocess.run(stage_command(stage, {**sets, "out_dir": whole}), env=env, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]

    proc = subprocess.Popen(
        stage_command(stage, {**sets, "out_dir": killed}), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    while steps_written(killed) < 5 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 5 <= steps_written(killed) < MAX_STEPS
    with (killed / "metrics.jsonl").open("ab") as log:  # a kill inside the next step's append: a torn line
        log.write(f'{{"step": {steps_written(killed) + 1}, "reward_mean": 0.'.encode())

    command = stage_command(stage, {**sets, "out_dir": killed})
    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] in (4, 6) and summary["steps"] == MAX_STEPS
    assert [row["step"] for row in metrics(killed)] == list(range(MAX_STEPS + 1))  # each step exactly once
    # the same steps from the same checkpoint; floats equal to rounding (MKL's sums may depend on how a fresh
    # process's buffers happen to be aligned, so a resumed process can differ in the 7th digit)
    rounded = [{k: pytest.approx(v, rel=1e-5, abs=1e-7) for k, v in row.items()} for row in metrics(whole)]
    assert metrics(killed) == rounded
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-00000006", "step-00000008"]

    # a corrupted newest checkpoint is refused with a clear message, no traceback and exit code 1 (the run failed)
    newest = killed / "checkpoints" / "step-00000008" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:-10])
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "model.safetensors is truncated or overwritten" in refused.stderr and "delete" in refused.stderr


@pytest.mark.integration
def test_math_train_launches_two_torchrun_ranks_from_its_config(small_math_base, tmp_path):
    from pipelines.math.math_train import run

    _, base, sets = small_math_base
    overrides = {
        **sets,
        "base_model": base,
        "out_dir": tmp_path / "ranks",
        "processes": 2,
        "deepspeed": ROOT / "configs/deepspeed/zero1.json",
        "trainer.algorithm": "grpo",
        "trainer.max_steps": 2,
        "trainer.rollout.group_size": 4,
        "trainer.rollout.prompts_per_step": 4,
        "trainer.rollout.max_new_tokens": 16,
        "trainer.eval_every": 0,
    }
    paths = run(load_config(MathTrainConfig, [], [f"{k}={v}" for k, v in overrides.items()]))
    summary = json.loads(paths["summary"].read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 2 and summary["generated_tokens"] > 0
    assert (paths["model"] / "model.safetensors").is_file() and paths["base"] == base
    assert (tmp_path / "ranks" / "launch" / "math-train.yaml").is_file()  # what the ranks were given


@pytest.mark.parametrize("config_class", [TrainTeacherConfig, MathTrainConfig])
def test_both_rl_stages_check_the_shared_settings_alike(config_class):
    with pytest.raises(ValueError, match="processes=2 trains data-parallel through DeepSpeed: set deepspeed too"):
        config_class(processes=2)
    with pytest.raises(ValueError, match="engine must be one of"):
        config_class(engine="tgi")
    assert config_class(resume=False).resume is False


def test_the_summary_takes_every_evaluation_metric_at_start_and_end():
    history = [
        {"step": 0, "eval/acc": 0.25, "eval/maj@4": 0.5},
        {"step": 1, "reward_mean": 0.5},
        {"step": 2, "reward_mean": 0.75, "eval/acc": 0.5, "eval/maj@4": 0.75},
    ]
    assert _evaluation_start_and_end(history) == {
        "acc_start": 0.25,
        "acc_end": 0.5,
        "maj@4_start": 0.5,
        "maj@4_end": 0.75,
    }


def test_resume_drops_a_torn_last_metrics_line_and_names_a_damaged_one(tmp_path, capsys):
    configure_logging("train")  # the project's log format on stderr, as agpo train has it
    path = tmp_path / "metrics.jsonl"
    lines = "".join(json.dumps({"step": step, "reward_mean": step / 10}) + "\n" for step in range(6))
    path.write_text(lines + '{"step": 6, "reward_mean": 0.', encoding="utf-8")  # killed while appending step 6
    left = tmp_path / ".metrics.jsonl.host.123.abcd1234.tmp"  # killed while the file was rewritten
    left.write_text('{"step": 0}\n')
    restart_metrics(path, 4)
    assert path.read_text(encoding="utf-8") == "".join(lines.splitlines(keepends=True)[:5]) and not left.exists()
    assert "dropped a torn last line of 29 bytes" in capsys.readouterr().err
    path.write_text(lines.replace('{"step": 2, "reward_mean": 0.2}', '{"step": 2, "rew'), encoding="utf-8")
    with pytest.raises(StageFailed, match=r"metrics.jsonl, line 3, is not JSON"):
        restart_metrics(path, 4)
    restart_metrics(path, None)  # a fresh run starts over
    assert not path.exists()


def test_run_once_reads_a_finished_run_back_and_trains_a_changed_one(tmp_path):
    trained = []

    def train(config):  # stands in for a stage's run(): writes the summary a finished run leaves
        trained.append(config.trainer.seed)
        Path(config.out_dir).mkdir(parents=True, exist_ok=True)
        outputs(Path(config.out_dir))["summary"].write_text(json.dumps({"seed": config.trainer.seed}))
        return outputs(Path(config.out_dir))

    config = load_config(MathTrainConfig, [], [f"out_dir={tmp_path}"])
    assert run_once(config, train) == outputs(tmp_path)
    assert run_once(config, train) == outputs(tmp_path)
    assert trained == [0]  # the second call found the finished run of the same config
    changed = load_config(MathTrainConfig, [], [f"out_dir={tmp_path}", "trainer.seed=1"])
    run_once(changed, train)
    assert trained == [0, 1]  # another config in the same folder trains (resume refuses a foreign checkpoint)
    (tmp_path / "summary.json").unlink()
    run_once(changed, train)
    assert trained == [0, 1, 1]  # no summary: the run did not finish


def test_run_once_reads_back_a_run_recorded_with_the_flat_trainer_keys_of_before(tmp_path, caplog):
    """A grid finished before the trainer config had sections recorded ``trainer.group_size``, ... flat: the
    record, its keys moved to the sections, is this config's, so the run is not trained again."""
    from agpo.trainer_config import RENAMED_KEYS

    trained = []

    def train(config):
        trained.append(config)
        return outputs(Path(config.out_dir))

    config = load_config(MathTrainConfig, [], [f"out_dir={tmp_path}", "trainer.rollout.group_size=4"])
    record = json.loads(json.dumps(dataclasses.asdict(config)))
    for old, new in RENAMED_KEYS.items():  # the trainer section as the previous release wrote it
        section, key = new.split(".")
        record["trainer"][old] = record["trainer"][section].pop(key)
    for section in {new.split(".")[0] for new in RENAMED_KEYS.values()}:
        assert record["trainer"].pop(section) == {}
    (tmp_path / "run_config.json").write_text(json.dumps(record))
    (tmp_path / "summary.json").write_text("{}")
    assert run_once(config, train) == outputs(tmp_path) and trained == []
    assert not caplog.records  # a record is not the user's config: nothing to warn about
    record["trainer"]["group_size"] = 8
    (tmp_path / "run_config.json").write_text(json.dumps(record))
    run_once(config, train)
    assert trained == [config]  # a different recorded setting still trains
