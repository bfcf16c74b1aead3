"""The ``agpo`` command: help without torch, --version, config printing, exit codes and messages (fast), and
the toy stage end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.cli import HELP_CATALOGUE, STAGES, help_catalogue, main


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


@pytest.mark.parametrize("value", ["!!python/object:os.system ls", "!foo 1"])
def test_a_yaml_tag_in_set_is_a_config_error_naming_key_and_value(capsys, value):
    assert main(["toy", "--set", f"toy.group_size={value}"]) == 2
    err = capsys.readouterr().err
    assert f"agpo toy: config error: override 'toy.group_size': value {value!r} is not valid YAML" in err
    assert "Traceback" not in err


def test_print_config_hides_passwords_and_secret_keys(capsys):
    uri = "postgresql://mlflow:s3cret@db:5432/mlflow?password=s3cret2&sslmode=require"
    overrides = [f"tracking.tracking_uri={uri}", "annotate.engine=vllm", "annotate.engine_options.hf_token=hf_abc"]
    assert main(["pipeline", "--print-config", *[arg for o in overrides for arg in ("--set", o)]]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["tracking"]["tracking_uri"] == "postgresql://***@db:5432/mlflow?password=***&sslmode=require"
    assert printed["annotate"]["engine_options"]["hf_token"] == "***"
    assert "s3cret" not in out and "hf_abc" not in out


def test_missing_inputs_exit_1_with_a_hint_and_no_traceback(tmp_path, capsys):
    assert main(["train", "--set", f"pairs={tmp_path / 'none.parquet'}"]) == 1
    err = capsys.readouterr().err
    assert "does not exist; run `agpo data` first" in err and "Traceback" not in err
    assert main(["teacher", "--set", f"pairs={tmp_path / 'none.parquet'}"]) == 1


def test_a_file_that_breaks_its_contract_exits_1_naming_the_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"pair_id": ["p1"], "query": ["red shoes"]}), tmp_path / "pairs.parquet")
    agpo = [sys.executable, "-m", "pipelines.cli"]
    done = subprocess.run(
        [*agpo, "train", "--set", f"pairs={tmp_path / 'pairs.parquet'}"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and "ad_title" in done.stderr and "Traceback" not in done.stderr


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-stage"])
    assert exit_info.value.code == 2 and "invalid choice: 'no-such-stage'" in capsys.readouterr().err
    assert main(["toy", "--set", "toy.group_size=zero"]) == 2


def test_help_and_version_import_no_torch():
    """Help is read from the catalogue, so it prints in a fraction of a second (no stage module, no torch)."""
    script = (
        "import sys, contextlib, io\n"
        "from pipelines.cli import main\n"
        "for argv in (['--help'], ['train', '--help'], ['math-train', '--help'], ['--version']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "        main(argv)\n"
        "    assert out.getvalue(), argv\n"
        "print(sorted(m for m in ('torch', 'transformers', 'pyarrow', 'agpo') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_version_names_the_installed_package(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("agpo 0.")


def test_the_help_catalogue_lists_every_config_key_of_every_stage():
    stored = json.loads(HELP_CATALOGUE.read_text(encoding="utf-8"))
    assert stored == help_catalogue(), "a config changed: run `python -m pipelines.cli --write-help` and commit"


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
    from pipelines.ads.teacher.train import TrainTeacherConfig
    from pipelines.config import load_config

    root = Path(__file__).resolve().parents[2] / "configs"
    config = load_config(TrainTeacherConfig, [root / "cpu-tiny.yaml", root / "train" / preset])
    # presets named for a variant train one of the registered algorithms
    variants = {"dapo": "grpo", "gspo": "grpo", "cispo": "grpo", "clip_higher": "grpo", "grpo_two_epochs": "grpo"}
    assert config.trainer.algorithm == {**variants, "agpo_always": "agpo"}.get(preset[:-5], preset[:-5])
    assert config.trainer.max_steps == 100


def test_default_paths_follow_the_current_run(capsys, monkeypatch):
    monkeypatch.delenv("AGPO_RUN", raising=False)
    assert main(["review", "export", "--print-config"]) == 0
    assert "review: work/runs/demo/annotate/review\n" in capsys.readouterr().out  # what `make demo` wrote
    monkeypatch.setenv("AGPO_RUN", "weekly-3")
    assert main(["score", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert (
        "model: work/runs/weekly-3/student/model\n" in printed
        and "path: work/runs/weekly-3/data/pairs.parquet" in printed
    )
    assert main(["annotate", "--run", "other", "--set", "teacher=x", "--print-config"]) == 0
    printed = capsys.readouterr().out  # --run wins over AGPO_RUN; a --set value is used as given
    assert "out_dir: work/runs/other/annotate\n" in printed and "teacher: x\n" in printed
    assert main(["distil", "--run", "../up", "--print-config"]) == 2
    assert "--run '../up' holds the path separator" in capsys.readouterr().err


def test_the_pipeline_run_id_follows_run(capsys, monkeypatch):
    monkeypatch.delenv("AGPO_RUN", raising=False)  # main sets AGPO_RUN from --run: monkeypatch restores it
    assert main(["pipeline", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run_id"] == "local"  # neither --run nor AGPO_RUN: the old default
    assert main(["pipeline", "--run", "heldout-cli", "--set", "pairs=p.parquet", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run_id"] == "heldout-cli"  # work/runs/heldout-cli, not local
    assert main(["pipeline", "--run", "same", "--set", "run_id=same", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run_id"] == "same"
    monkeypatch.setenv("AGPO_RUN", "weekly-3")
    assert main(["math-pipeline", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["run_id"] == "weekly-3"


def test_run_and_another_run_id_is_a_config_error_naming_both(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("AGPO_RUN", raising=False)
    assert main(["pipeline", "--run", "a", "--set", "run_id=b", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agpo pipeline: config error: --run 'a' and run_id 'b'")
    assert "drop the run_id setting" in err and "drop --run" in err
    path = tmp_path / "run.yaml"
    path.write_text("run_id: from-file\n")
    assert main(["pipeline", "--run", "a", "--config", str(path)]) == 2
    assert "--run 'a' and run_id 'from-file'" in capsys.readouterr().err
