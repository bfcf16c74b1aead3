"""DeepSpeed on CPU (gloo): ZeRO 1, 2 and 3 with offload give the plain trainer's loss curve, in one process
and in two processes at the same global batch (each rank holding half of the prompt groups); a run killed
mid-run resumes from DeepSpeed's checkpoint to the uninterrupted run's curve.

The model each saves holds the same weights (per-tensor sums to 1e-4).

Tolerance: per-step metrics agree to 1e-5 absolute (float32 sums in a different order); measured
identical to 6 decimals.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agpo.distributed import DeepSpeedUpdater, LocalUpdater, Updater, load_deepspeed_config
from agpo.trainer_config import TIMING_METRICS
from durable.checkpoint import CheckpointError, read_checkpoint

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("deepspeed_worker.py")


def run_worker(
    out: Path, nproc: int | None = None, ds_config: str | None = None, extra_env: dict | None = None, killed=False
) -> dict | None:
    """The worker's JSON; with ``killed``, None once it is checked that the run died (``KILL_AT_STEP``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **(extra_env or {})}
    launcher = (
        []
        if nproc is None
        else ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(29600 + nproc)]
    )
    args = [str(out)] + ([str(ROOT / "configs" / "deepspeed" / ds_config)] if ds_config else [])
    done = subprocess.run(
        [sys.executable, *launcher, str(WORKER), *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    if killed:
        assert done.returncode != 0 and not out.exists(), done.stderr[-3000:]
        return None
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return run_worker(tmp_path_factory.mktemp("plain") / "plain.json")


def assert_same_curve(result, reference):
    assert len(result["history"]) == len(reference["history"]) == 3
    for got, want in zip(result["history"], reference["history"], strict=True):
        assert set(got) == set(want)
        for key, value in want.items():
            if key not in TIMING_METRICS:
                assert got[key] == pytest.approx(value, abs=1e-5), (got["step"], key)


@pytest.mark.integration
@pytest.mark.minutes(5)  # the file's tests together
@pytest.mark.parametrize(("nproc", "ds_config"), [(2, "zero2.json"), (1, "zero3-offload.json")])
def test_deepspeed_gives_the_single_process_loss_curve(plain, tmp_path, nproc, ds_config):
    """ZeRO-1 is left out: DeepSpeed runs stages 1 and 2 with one optimizer class (the optimizer state partitioned
    alike), and the distributed stack's test trains its teacher with zero1.json over two ranks."""
    result = run_worker(tmp_path / "ds.json", nproc, ds_config)
    assert result["world_size"] == nproc
    assert_same_curve(result, plain)
    # the saved model holds the trained weights (under ZeRO-3 the rank's partitions, gathered)
    assert result["weights"].keys() == plain["weights"].keys()
    for name, total in plain["weights"].items():
        assert result["weights"][name] == pytest.approx(total, abs=1e-4), name


@pytest.mark.integration
@pytest.mark.parametrize(("nproc", "ds_config"), [(2, "zero2.json"), (1, "zero3-offload.json")])
def test_a_deepspeed_run_killed_mid_run_resumes_to_the_uninterrupted_curve(tmp_path, nproc, ds_config):
    """Checkpoints every step; SIGKILL after step 3 is trained, before its checkpoint; a rerun resumes from step 2
    and trains 3 and 4 as the run that was never stopped did (ZeRO-3 over two ranks needs the vllm engine: one
    rank here, its partitioned and offloaded state saved and loaded all the same). ZeRO-1 is left out: its
    checkpoint is ZeRO-2's (both partition the optimizer state, in the same files), and a third series cost a
    minute of CI."""
    four = {"MAX_STEPS": "4"}
    uninterrupted = run_worker(tmp_path / "full.json", nproc, ds_config, four)
    resuming = {**four, "CHECKPOINT_DIR": str(tmp_path / "checkpoints")}
    run_worker(tmp_path / "killed.json", nproc, ds_config, {**resuming, "KILL_AT_STEP": "3"}, killed=True)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    resumed = run_worker(tmp_path / "resumed.json", nproc, ds_config, resuming)
    assert resumed["resumed_from"] == 2
    assert [h["step"] for h in resumed["history"]] == [3, 4]
    for got, want in zip(resumed["history"], uninterrupted["history"][2:], strict=True):
        for key, value in want.items():
            if key not in TIMING_METRICS:
                assert got[key] == pytest.approx(value, abs=1e-5), (got["step"], key)
    for name, total in uninterrupted["weights"].items():
        assert resumed["weights"][name] == pytest.approx(total, abs=1e-4), name
    shards = {p.name for p in (tmp_path / "checkpoints" / "step-00000004" / "deepspeed").rglob("*.pt")}
    assert any("optim_states" in name for name in shards), shards  # DeepSpeed's own partitioned optimizer state
    shard = next((tmp_path / "checkpoints" / "step-00000004" / "deepspeed").rglob("*optim_states.pt"))
    shard.write_bytes(shard.read_bytes()[:-1])  # the manifest covers DeepSpeed's files: refused before it opens them
    with pytest.raises(CheckpointError, match="truncated"):
        read_checkpoint(tmp_path / "checkpoints" / "step-00000004", fingerprint={})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"optimizer": {"type": "Adam"}}', r"sets \['optimizer'\]; the trainer owns these"),
        ('{"zero_optimization": {"stage": 4}}', "stage must be 0-3, got 4"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_deepspeed_config_errors(tmp_path, content, message):
    path = tmp_path / "ds.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_deepspeed_config(path)
    with pytest.raises(FileNotFoundError, match="DeepSpeed config"):
        load_deepspeed_config(tmp_path / "missing.json")


def test_the_shipped_deepspeed_configs_load():
    for path in sorted((ROOT / "configs" / "deepspeed").glob("*.json")):
        assert "zero_optimization" in load_deepspeed_config(path)


def protocol_members(protocol):
    return {name for name in vars(protocol) if not name.startswith("_")} | set(protocol.__annotations__)


def test_both_updaters_offer_the_updater_interface():
    model = torch.nn.Linear(2, 1)
    local = LocalUpdater(model, torch.optim.SGD(model.parameters(), lr=0.1), max_grad_norm=1.0)
    assert all(hasattr(local, name) for name in protocol_members(Updater))
    methods = {name for name in vars(Updater) if not name.startswith("_")}
    assert all(callable(getattr(DeepSpeedUpdater, name)) for name in methods)
    assert local.all_reduce_sum([1.0, 2.0]) == local.all_reduce_max([1.0, 2.0]) == [1.0, 2.0]
