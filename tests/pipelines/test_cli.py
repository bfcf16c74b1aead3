"""The ``agpo`` command: help, config printing and errors (fast), and the toy stage end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.cli import STAGES, main


def test_help_lists_stages_and_config_keys(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "toy" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["toy", "--help"])
    out = capsys.readouterr().out
    assert "--config [SECTION=]FILE.yaml" in out and "toy.group_size (8)" in out


def test_every_stage_takes_a_config_file(tmp_path, capsys):
    for name in STAGES:
        path = tmp_path / f"{name}.yaml"
        path.write_text("out_dir: somewhere\n")
        assert main([name, "--config", str(path), "--print-config"]) == 0
        assert yaml.safe_load(capsys.readouterr().out)["out_dir"] == "somewhere"


def test_print_config_applies_overrides(capsys):
    assert main(["toy", "--print-config", "--set", "toy.group_size=4", "--set", "toy.seeds=[5]"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["toy"]["group_size"] == 4 and printed["toy"]["seeds"] == [5]


def test_config_errors_exit_2_with_the_key(capsys):
    assert main(["toy", "--set", "toy.group_sise=4"]) == 2
    assert "unknown config key(s) ['toy.group_sise']" in capsys.readouterr().err


def test_missing_inputs_exit_2_with_a_hint(tmp_path, capsys):
    assert main(["train", "--set", f"pairs={tmp_path / 'none.parquet'}"]) == 2
    assert "does not exist; run `agpo data` first" in capsys.readouterr().err
    assert main(["teacher", "--set", f"pairs={tmp_path / 'none.parquet'}"]) == 2


@pytest.mark.integration
def test_toy_stage_end_to_end(tmp_path):
    preset = Path(__file__).resolve().parents[2] / "configs" / "toy_quick.yaml"
    agpo = [sys.executable, "-c", "import sys; from pipelines.cli import main; sys.exit(main())"]
    done = subprocess.run(
        [*agpo, "toy", "--config", str(preset), "--set", f"out_dir={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "| agpo |" in done.stdout and "pass_at_k_plot:" in done.stdout

    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert list(results["summary"]) == ["grpo", "dr_grpo", "rloo", "w_reinforce", "agpo", "adaptive_agpo"]
    assert len(results["runs"]) == 12
    base = results["base"]["1"]
    for algorithm, entry in results["summary"].items():
        assert entry["pass_at_k"]["1"]["mean"] > base + 0.05, algorithm
        assert entry["generated"] <= 8192
    for name in ("pass_at_k.png", "learning_curves.png"):
        data = (tmp_path / "out" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
    assert "| base policy |" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "configs/train").glob("*.yaml"))
)
def test_every_training_preset_is_a_valid_config(preset):
    from pipelines.ads.train import TrainTeacherConfig
    from pipelines.config import load_config

    root = Path(__file__).resolve().parents[2] / "configs"
    config = load_config(TrainTeacherConfig, [root / "cpu-tiny.yaml", root / "train" / preset])
    assert config.trainer.algorithm == {"dapo": "grpo"}.get(preset[:-5], preset[:-5])
    assert config.trainer.max_steps == 100
