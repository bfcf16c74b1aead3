"""Pipeline steps: names that become paths, Airflow run ids made into run ids, and step markers that
remember their params (a finished step is answered only for the params it ran with)."""

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

from pipelines import steps
from pipelines import threads as threads_module
from pipelines.steps import CLI, SUCCESS, check_run_id, config_from_params, run_step, safe_run_id
from pipelines.threads import CpuBudget, use_threads


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "is empty"),
        (".", "is the folder it would go in"),
        ("..", "is the parent folder"),
        ("../other-run", "holds the path separator '/'"),
        ("runs\\demo", r"holds the path separator '\\\\'"),
        ("demo\x00", "holds the control character U\\+0000"),
        ("demo\nrun", "holds the control character U\\+000A"),
        (".hidden", "starts with '.'"),
        ("-rf", "starts with '-'"),
        ("it's", 'holds "\'"'),
        ("two words", "holds ' '"),
        ("x" * 129, "is 129 characters long"),
        (7, r"is not a string \(int\)"),
    ],
)
def test_run_ids_that_are_not_one_plain_name_are_refused(value, problem):
    with pytest.raises(ValueError, match=rf"run_id .* {problem}; it names a folder or file: use 1-128 letters"):
        check_run_id(value)


@pytest.mark.parametrize("value", ["demo", "s18", "small-lm-2", "_scratch", "v1.2", "manual__2026-11-30T10-00-00"])
def test_plain_names_pass(value):
    check_run_id(value)
    steps.check_path_name("algorithm", value)


def test_safe_run_id_always_gives_a_valid_name():
    assert safe_run_id("manual__2026-11-30T10:00:00+00:00") == "manual__2026-11-30T10-00-00-00-00"
    assert safe_run_id("...hidden") == "hidden"
    odd = ["..", "./..", "///", "", "-.-", "x" * 300, "x" * 299 + "y"]
    for airflow_run_id in odd:
        check_run_id(safe_run_id(airflow_run_id))
        assert safe_run_id(airflow_run_id) == safe_run_id(airflow_run_id)
    assert len({safe_run_id(airflow_run_id) for airflow_run_id in odd}) == len(odd)  # one folder each


@dataclass(frozen=True)
class RunConfig:
    run_id: str = "local"

    def __post_init__(self) -> None:
        check_run_id(self.run_id)


def test_dag_params_that_become_paths_are_checked_before_use():
    with pytest.raises(ValueError, match=r"run_name '\.\.' is the parent folder"):
        config_from_params(RunConfig, {"run_name": ".."}, "manual__1", {})
    with pytest.raises(ValueError, match=r"algorithm '\.\./\.\./secrets' holds the path separator '/'"):
        config_from_params(RunConfig, {"algorithm": "../../secrets"}, "manual__1", {})
    # a run name YAML would read as a number or a boolean stays the string it was given
    assert config_from_params(RunConfig, {"run_name": "2026"}, "manual__1", {}).run_id == "2026"
    assert config_from_params(RunConfig, {}, "..", {}).run_id == safe_run_id("..")


@dataclass(frozen=True)
class Unchecked:
    """A config that checks none of its folders itself: what config_from_params must check."""

    run_id: str = "local"
    out_dir: str = "work/runs"


@pytest.mark.parametrize(
    "entry",
    ["/etc/passwd", "configs/../pyproject.toml", "train=../../etc/shadow", "configs/train", "configs/missing.yaml"],
)
def test_dag_presets_are_yaml_files_in_the_configs_folder_only(entry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=rf"preset '{re.escape(entry)}'"):
        config_from_params(Unchecked, {"presets": [entry]}, "manual__1", {})


def test_a_dag_preset_outside_the_configs_folder_is_refused_also_through_a_link(tmp_path, monkeypatch):
    outside = tmp_path / "outside.yaml"
    outside.write_text("run_id: stolen\n")
    (tmp_path / "project" / "configs").mkdir(parents=True)
    (tmp_path / "project" / "configs" / "link.yaml").symlink_to(outside)
    (tmp_path / "project" / "configs" / "mine.yaml").write_text("run_id: mine\n")
    monkeypatch.setattr(steps, "PROJECT_ROOT", tmp_path / "project")
    monkeypatch.chdir(tmp_path)  # a file of the working folder is not a preset either
    for entry in ("configs/link.yaml", str(outside), "outside.yaml"):
        with pytest.raises(ValueError, match=r"is not a YAML file in .*: a DAG run reads presets from there only"):
            config_from_params(Unchecked, {"presets": [entry]}, "manual__1", {})
    assert config_from_params(Unchecked, {"presets": ["configs/mine.yaml"]}, "manual__1", {}).run_id == "manual__1"
    assert (
        config_from_params(Unchecked, {"presets": ["configs/mine.yaml"]}, "manual__1", {}, "x").out_dir == "work/runs"
    )


def test_the_shipped_presets_load_from_any_working_folder(tmp_path, monkeypatch):
    from pipelines.ads.pipeline_config import AdsPipelineConfig

    monkeypatch.chdir(tmp_path)
    params = {"presets": ["train=configs/cpu-tiny.yaml"], "algorithm": "grpo"}
    assert config_from_params(AdsPipelineConfig, params, "manual__1", {}).train.trainer.algorithm == "grpo"


@pytest.mark.parametrize(
    ("root", "problem"),
    [
        ("../..", r"out_dir '\.\./\.\./runs': part '\.\.' is the parent folder"),
        ("work/.ssh", r"out_dir 'work/\.ssh/runs': part '\.ssh' starts with '\.'"),
        ("work//x", r"out_dir 'work//x/runs': part '' is empty"),
        ("/srv/runs/x\ny", r"part 'x\\ny' holds the control character U\+000A"),
    ],
)
def test_the_workers_output_root_follows_the_path_rules(root, problem, monkeypatch):
    monkeypatch.setenv(steps.OUTPUT_ROOT_ENV, root)
    with pytest.raises(ValueError, match=problem):
        config_from_params(Unchecked, {}, "manual__1", {})


def test_a_dag_runs_folder_is_the_workers_relative_or_absolute(tmp_path, monkeypatch):
    monkeypatch.delenv(steps.OUTPUT_ROOT_ENV, raising=False)
    assert config_from_params(Unchecked, {}, "manual__1", {}).out_dir == "work/runs"
    for root in (str(tmp_path), f"{tmp_path}/", "stack/outputs"):
        monkeypatch.setenv(steps.OUTPUT_ROOT_ENV, root)
        assert config_from_params(Unchecked, {}, "manual__1", {}).out_dir == f"{root.rstrip('/')}/runs"


@pytest.mark.parametrize("override", ["run_id=../other", "out_dir=/tmp/x", "tracking.tracking_uri=http://x/"])
def test_a_config_that_declares_no_run_choices_takes_no_override(override):
    with pytest.raises(ValueError, match=rf"override '{override.partition('=')[0]}' is not a key a DAG run may set"):
        config_from_params(Unchecked, {"overrides": [override]}, "manual__1", {})


@dataclass(frozen=True)
class Scoring:
    run_choices: ClassVar[steps.RunChoices] = steps.RunChoices(("batch_size",))

    model: str = "student"
    out_dir: str = "work/scoring"
    batch_size: int = 256


def test_the_scoring_dags_folder_is_the_workers_and_its_overrides_an_allow_list(tmp_path, monkeypatch):
    monkeypatch.delenv(steps.OUTPUT_ROOT_ENV, raising=False)
    params = {"presets": [], "run_name": None, "overrides": ["batch_size=64"]}

    def config(params, root="work/scoring"):
        return steps.run_folder_config(Scoring, params, "manual__1", ["model=m"], root)

    scored = steps.run_folder_config(Scoring, params, "manual__2026-01-01T00:00:00+00:00", ["model=m"], "work/scoring")
    assert (scored.out_dir, scored.model, scored.batch_size) == (
        "work/scoring/manual__2026-01-01T00-00-00-00-00",
        "m",
        64,
    )
    monkeypatch.setenv(steps.OUTPUT_ROOT_ENV, f"{tmp_path}/")
    assert config({**params, "run_name": "2026"}).out_dir == f"{tmp_path}/scoring/2026"
    monkeypatch.setenv(steps.OUTPUT_ROOT_ENV, "/srv/.hidden")
    with pytest.raises(ValueError, match=r"out_dir '/srv/\.hidden/scoring/manual__1': part '\.hidden' starts with"):
        config(params)
    monkeypatch.delenv(steps.OUTPUT_ROOT_ENV)
    with pytest.raises(ValueError, match=r"override 'out_dir' is not a key a DAG run may set.* may set batch_size"):
        config({**params, "overrides": ["out_dir=/tmp/elsewhere"]})
    with pytest.raises(ValueError, match=r"run_name '\.\.' is the parent folder"):
        config({**params, "run_name": ".."})
    with pytest.raises(ValueError, match=r"preset '/etc/passwd'"):
        config({**params, "presets": ["/etc/passwd"]})


@dataclass(frozen=True)
class Stage:
    lr: float = 0.1
    out_dir: str = "runs/demo/train"
    hf_token: str | None = None
    tracking_uri: str = "postgresql://mlflow:s3cret@db:5432/mlflow"
    seeds: tuple[int, ...] = field(default=(0, 1))


class Steps:
    """run_step with an in-memory tracker, counting the times the work ran."""

    def __init__(self, steps_dir):
        self.steps_dir, self.calls = steps_dir, 0

    def tracker(self):
        class Tracker:
            @contextmanager
            def stage(self, name, params, try_number=1):
                yield None

        return Tracker()

    def run(self, params, name="train"):
        def work(log):
            self.calls += 1
            return {"model": self.steps_dir.parent / "train" / "model"}

        return run_step(self.steps_dir, self.tracker, CLI, name, params, work)


def test_a_finished_step_answers_the_same_params_and_refuses_others(tmp_path):
    run = Steps(tmp_path / "demo" / "steps")
    outputs = run.run(Stage(hf_token="hf_abc"))
    assert run.run(Stage(hf_token="hf_rotated")) == outputs and run.calls == 1  # secrets are not params
    marker = tmp_path / "demo" / "steps" / f"train{SUCCESS}"
    with pytest.raises(steps.StepParamsChanged) as refused:
        run.run(Stage(lr=0.2, seeds=(0, 1, 2)))
    assert run.calls == 1
    message = str(refused.value)
    assert f"step 'train' of this run already finished with other params ({marker})" in message
    assert "lr: 0.1 -> 0.2; seeds: [0,1] -> [0,1,2]" in message
    assert "pick a new run name" in message and f"delete the run folder {tmp_path / 'demo'}" in message


def test_the_marker_records_the_params_hash_without_secrets(tmp_path):
    Steps(tmp_path / "steps").run(Stage(hf_token="hf_abc"))
    text = (tmp_path / "steps" / f"train{SUCCESS}").read_text()
    marker = json.loads(text)
    assert len(marker["params_sha256"]) == 64
    assert marker["params"] == {
        "lr": 0.1,
        "out_dir": "runs/demo/train",
        "seeds": [0, 1],
        "tracking_uri": "postgresql://***@db:5432/mlflow",
    }
    assert "hf_abc" not in text and "s3cret" not in text


def test_a_marker_from_before_params_were_recorded_is_trusted_with_a_warning(tmp_path):
    run = Steps(tmp_path / "steps")
    run.steps_dir.mkdir()
    old = {"step": "train", "outputs": {"model": "old/model"}, "try_number": 1}
    (run.steps_dir / f"train{SUCCESS}").write_text(json.dumps(old))
    with pytest.warns(UserWarning, match="records no params"):
        assert run.run(Stage(lr=0.5)) == {"model": "old/model"}
    assert run.calls == 0


def test_step_names_are_path_names(tmp_path):
    with pytest.raises(ValueError, match=r"step name '\.\./escape' holds the path separator"):
        Steps(tmp_path / "steps").run(Stage(), name="../escape")


def test_stage_configs_check_their_folder_names_and_engine_options_when_loaded():
    from pipelines.ads.annotation.annotate import AnnotateConfig
    from pipelines.ads.studies.compare_students import StudentProtocolConfig
    from pipelines.math.math_compare import MathCompareConfig

    with pytest.raises(ValueError, match=r"label_sets name '\.\./up'"):
        StudentProtocolConfig(label_sets={"../up": "work/annotate/labels"})
    with pytest.raises(ValueError, match=r"algorithms entry 'grpo/\.\./\.\./x'"):
        MathCompareConfig(algorithms=("grpo/../../x",))
    with pytest.raises(ValueError, match="trust_remote_code"):
        AnnotateConfig(engine="vllm", engine_options={"trust_remote_code": True})


@dataclass(frozen=True)
class TorchStage:
    lr: float = 0.1
    threads: int | None = None


def test_a_torch_stage_logs_the_threads_it_runs_with_but_a_rerun_elsewhere_is_the_same_step(tmp_path, monkeypatch):
    logged = []

    class Tracker:
        @contextmanager
        def stage(self, name, params, try_number=1):
            logged.append(params)
            yield None

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("AGPO_TASK_SLOTS", "64")  # more slots than CPUs: one thread
    outputs = run_step(tmp_path / "steps", Tracker, CLI, "train", TorchStage(), lambda log: {"model": tmp_path})
    assert logged[0]["threads"] is None and logged[0]["threads_used"] == 1
    assert "64 task slot(s)" in logged[0]["threads_source"]
    monkeypatch.setenv("AGPO_TASK_SLOTS", "1")  # another machine or slot count: the finished step still answers
    assert run_step(tmp_path / "steps", Tracker, CLI, "train", TorchStage(), lambda log: {}) == outputs
    logged.clear()
    run_step(tmp_path / "other", Tracker, CLI, "train", Stage(), lambda log: {})
    assert "threads_used" not in logged[0]  # a stage without a threads key runs no torch


def test_the_stage_runs_with_the_thread_count_its_mlflow_params_name(tmp_path, monkeypatch):
    logged, used = [], []

    class Tracker:
        @contextmanager
        def stage(self, name, params, try_number=1):
            logged.append(params)
            yield None

    # the machine's load changes between two samples: a second choice would differ from the first
    budgets = iter([CpuBudget(affinity=2, quota=None, cores=2), CpuBudget(affinity=2, quota=None, cores=2, busy=1.0)])
    monkeypatch.setattr(threads_module, "cpu_budget", lambda: next(budgets))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("AGPO_TASK_SLOTS", "1")
    torch_threads = torch.get_num_threads()

    def work(log):
        used.append(use_threads(None))
        return {}

    run_step(tmp_path / "steps", Tracker, CLI, "train", TorchStage(), work)
    assert logged[0]["threads_used"] == used[0].threads == 2
    assert logged[0]["threads_source"] == used[0].source
    assert use_threads(None).threads == 1  # outside the step: a choice of its own, from the next sample
    torch.set_num_threads(torch_threads)


def test_the_ads_pipelines_run_choices_let_a_run_pick_its_data_and_models_and_nothing_of_the_workers(
    tmp_path, monkeypatch
):
    from pipelines.ads.pipeline_config import AdsPipelineConfig

    monkeypatch.delenv(steps.OUTPUT_ROOT_ENV, raising=False)
    chosen = ["data.synthetic.seed=3", "teacher.sft.epochs=1", "distil.training.epochs=2", "gold_student=false"]
    config = config_from_params(AdsPipelineConfig, {"overrides": chosen}, "manual__1", {})
    assert (config.data.synthetic.seed, config.teacher.sft.epochs, config.gold_student) == (3, 1, False)
    refused = {
        "tracking.tracking_uri=http://127.0.0.1:1/": "tracking.tracking_uri",
        "tracking.store_dir=/tmp/store": "tracking.store_dir",
        "tracking.registered_model=other": "tracking.registered_model",
        "tracking={tracking_uri: 'http://127.0.0.1:1/'}": "tracking",
        "run_id=other": "run_id",
        "out_dir=/tmp/elsewhere": "out_dir",
        "annotate.lease_seconds=1": "annotate.lease_seconds",
    }
    for override, key in refused.items():
        with pytest.raises(ValueError, match=rf"override '{re.escape(key)}' is not a key a DAG run may set"):
            config_from_params(AdsPipelineConfig, {"overrides": [override]}, "manual__1", {})
    # a whole section that holds a key the worker decides cannot be set at once
    with pytest.raises(ValueError, match=r"override 'annotate' .* holds annotate.lease_seconds: set its other keys"):
        config_from_params(AdsPipelineConfig, {"overrides": ["annotate={lease_seconds: 1}"]}, "manual__1", {})
    # the named param may choose the registered model's name, held to its pattern
    named = config_from_params(
        AdsPipelineConfig,
        {"registered_model": "team-a"},
        "manual__1",
        {"registered_model": "tracking.registered_model"},
    )
    assert named.tracking.registered_model == "team-a"


def test_a_dag_runs_tracking_uri_is_the_workers_even_when_a_preset_names_one(tmp_path, monkeypatch):
    from pipelines.ads.pipeline_config import AdsPipelineConfig

    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "elsewhere.yaml").write_text("tracking:\n  tracking_uri: http://user:pw@127.0.0.1:1/\n")
    (tmp_path / "configs" / "lock.yaml").write_text("tracking:\n  lock_dir: /tmp/locks\n")
    monkeypatch.setattr(steps, "PROJECT_ROOT", tmp_path)
    with pytest.raises(ValueError, match=r"tracking.tracking_uri is set \('http://\*\*\*@127.0.0.1:1/'\), but a DAG"):
        config_from_params(AdsPipelineConfig, {"presets": ["configs/elsewhere.yaml"]}, "manual__1", {})
    with pytest.raises(ValueError, match=r"tracking.lock_dir is set \('/tmp/locks'\), but a DAG run takes"):
        config_from_params(AdsPipelineConfig, {"presets": ["configs/lock.yaml"]}, "manual__1", {})
