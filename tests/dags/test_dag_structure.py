"""The DAG files: they import without errors, parse fast, and wire the stages as documented; their Airflow
conventions (assets, fail-fast errors, the algorithm enum, timeouts, tz-aware start dates, queues) and operations
(pools, retries sized per task with backoff, the failure notifier, the run's deadline)."""

import itertools
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, ParamValidationError
from airflow.sdk.execution_time.context import OutletEventAccessors

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def test_the_dag_folder_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"ads_relevance_agpo", "math_rlvr", "ads_scoring"} <= set(dagbag.dag_ids)


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_a_dag_file_parses_in_under_two_seconds_and_imports_no_heavy_library(path):
    file = str(path)
    code = (
        "import sys, time, airflow.sdk\n"
        f"sys.path.append({str(ROOT / 'dags')!r})\n"  # a DAG bundle's root, as Airflow adds it
        "started = time.perf_counter()\n"
        f"exec(compile(open({file!r}).read(), {file!r}, 'exec'), {{'__name__': 'dagfile', '__file__': {file!r}}})\n"
        "print(time.perf_counter() - started)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'mlflow', 'pipelines') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    seconds, heavy = out.stdout.strip().splitlines()[-2:]
    assert float(seconds) < 2.0
    assert heavy == "[]"


def test_ads_dag_structure(dagbag):
    dag = dagbag.dags["ads_relevance_agpo"]
    chain = [
        "validate",
        "teacher",
        "train",
        "gate",
        "partition",
        "annotate_shard",
        "merge",
        "distil",
        "evaluate",
        "register",
    ]
    assert set(dag.task_ids) == set(chain)
    for upstream, downstream in itertools.pairwise(chain):
        assert dag.get_task(downstream).upstream_task_ids == {upstream}, downstream
    assert type(dag.get_task("annotate_shard")).__name__ == "DecoratedMappedOperator"  # one task per shard
    assert dag.timetable.expression in ("@weekly", "0 0 * * 0")
    assert {"presets", "algorithm", "pairs", "base_teacher", "min_audit_accuracy", "overrides"} <= set(dag.params)
    assert "registered_model" in dag.params


def test_math_dag_structure(dagbag):
    dag = dagbag.dags["math_rlvr"]
    assert set(dag.task_ids) == {"train", "evaluate"}
    assert dag.get_task("evaluate").upstream_task_ids == {"train"}
    assert all(task.retries >= 2 for task in dag.tasks)
    assert {"presets", "algorithm", "dataset", "path", "samples", "overrides", "run_name"} <= set(dag.params)


TRAIN_PRESETS = sorted(p.stem for p in (ROOT / "configs" / "train").glob("*.yaml"))
ACCELERATOR_TASKS = {"teacher", "train", "annotate_shard", "distil", "evaluate"}  # training, annotation, eval
CHAMPION = Asset(name="ads_relevance_champion", uri="x-agpo://ads-relevance/champion", group="ads-relevance")


def dag_module(dag):
    """The module a DAG file was loaded as (its tasks' globals)."""
    return sys.modules[dag.tasks[0].python_callable.__module__]


@pytest.mark.parametrize("dag_id", ["ads_relevance_agpo", "math_rlvr"])
def test_the_algorithm_param_is_an_enum_of_the_train_presets(dagbag, dag_id):
    param = dagbag.dags[dag_id].params.get_param("algorithm")
    assert param.schema["enum"] == TRAIN_PRESETS and {"agpo", "grpo", "dapo"} <= set(TRAIN_PRESETS)
    assert param.resolve("grpo") == "grpo"
    with pytest.raises(ParamValidationError, match="ppo"):
        param.resolve("ppo")


def test_every_dag_starts_tz_aware_and_long_tasks_have_timeouts_and_queues(dagbag):
    for dag_id in ("ads_relevance_agpo", "math_rlvr", "ads_scoring"):
        dag = dagbag.dags[dag_id]
        assert dag.start_date.utcoffset() == timedelta(0), dag_id
        assert all(t.execution_timeout is not None for t in dag.tasks), dag_id
    ads = dagbag.dags["ads_relevance_agpo"]
    assert {t.task_id for t in ads.tasks if t.queue == "accelerator"} == ACCELERATOR_TASKS
    assert {t.queue for t in ads.tasks if t.task_id not in ACCELERATOR_TASKS} == {"default"}
    for long in ("teacher", "train", "annotate_shard", "distil"):
        assert ads.get_task(long).execution_timeout >= timedelta(hours=6), long
    assert ads.get_task("validate").execution_timeout == timedelta(hours=1)
    assert {t.queue for t in dagbag.dags["math_rlvr"].tasks} == {"accelerator"}
    assert dagbag.dags["ads_scoring"].get_task("score").queue == "default"


QUICK_TASKS = {"validate", "gate", "partition", "merge", "register"}  # CPU, seconds to minutes


def test_the_ads_dags_run_in_pools_with_retries_sized_per_task(dagbag):
    """Accelerator work in its pool (the annotation shards in theirs), the rest in Airflow's default pool; every
    task backs off exponentially to a cap; quick tasks retry soon and often, hour-long ones late and less, the
    day-long train once."""
    ads, score = dagbag.dags["ads_relevance_agpo"], dagbag.dags["ads_scoring"].get_task("score")
    pools = {t.task_id: t.pool for t in ads.tasks}
    assert pools == {
        **dict.fromkeys(QUICK_TASKS, "default_pool"),
        **dict.fromkeys(ACCELERATOR_TASKS - {"annotate_shard"}, "agpo_accelerator"),
        "annotate_shard": "agpo_annotation",
    }
    assert score.pool == "agpo_accelerator"
    retries = {t.task_id: (t.retries, t.retry_delay, t.max_retry_delay) for t in [*ads.tasks, score]}
    quick, hours = (3, timedelta(seconds=10), timedelta(minutes=5)), (2, timedelta(minutes=5), timedelta(hours=1))
    assert retries == {
        **dict.fromkeys(QUICK_TASKS, quick),
        **dict.fromkeys(["teacher", "annotate_shard", "distil", "evaluate", "score"], hours),
        "train": (1, timedelta(minutes=5), timedelta(hours=1)),
    }
    assert {t.retry_exponential_backoff for t in [*ads.tasks, score]} == {2.0}  # a multiplier: True would be 1.0


def test_pool_names_come_from_the_environment():
    """The deployment names the pools; the DAG's tasks then run in them (their sizes: the stack test below)."""
    env = {**os.environ, "AGPO_ACCELERATOR_POOL": "gpus", "PYTHONPATH": str(ROOT / "dags")}
    code = (
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"dag = DagBag(dag_folder={str(ROOT / 'dags' / 'ads_relevance_agpo.py')!r}).dags['ads_relevance_agpo']\n"
        "print(dag.get_task('train').pool, dag.get_task('annotate_shard').pool)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=env)
    assert out.stdout.split()[-2:] == ["gpus", "agpo_annotation"]


def test_every_task_alerts_on_failure_and_each_run_has_a_deadline(dagbag):
    from agpo_operations import AlertNotifier
    from airflow.sdk import DeadlineReference

    for dag_id, hours in (("ads_relevance_agpo", 48), ("ads_scoring", 8)):
        dag = dagbag.dags[dag_id]
        for task in dag.tasks:
            assert [type(c) for c in task.on_failure_callback] == [AlertNotifier], (dag_id, task.task_id)
        [deadline] = dag.deadline
        assert deadline.reference == DeadlineReference.DAGRUN_QUEUED_AT
        assert deadline.interval == timedelta(hours=hours)
        assert deadline.callback.path == "agpo_operations.AlertNotifier"  # imported where it runs, by this path


def test_airflow_dags_test_runs_without_the_deadline_it_would_fail_on(dagbag, monkeypatch):
    from agpo_operations import run_deadline

    monkeypatch.setattr(sys, "argv", ["/venv/bin/airflow", "dags", "test", "ads_relevance_agpo"])
    assert run_deadline("AGPO_ADS_DEADLINE_HOURS", 48) is None  # Airflow 3.3.2's dags test: see run_deadline
    monkeypatch.setattr(sys, "argv", ["/venv/bin/airflow", "dag-processor"])
    assert run_deadline("AGPO_ADS_DEADLINE_HOURS", 48) is not None


# each accelerator-queue task of the ads DAG -> the stage config its step runs (pipelines.ads.pipeline)
ACCELERATOR_STAGES = {
    "teacher": "teacher",
    "train": "train",
    "annotate_shard": "annotate",
    "distil": "distil",
    "evaluate": "evaluate",
}


def test_the_accelerator_queue_tasks_use_the_accelerator_when_the_worker_has_one():
    """With the pipeline's defaults each such step's stage resolves to the worker's GPU in bf16, and to the CPU in
    float32 on a worker without one (tests/pipelines/test_devices.py shows the stages run where they resolve)."""
    from pipelines.ads.pipeline_config import AdsPipelineConfig
    from pipelines.devices import Accelerators, use_device

    assert set(ACCELERATOR_STAGES) == ACCELERATOR_TASKS
    config = AdsPipelineConfig()
    for task, stage in ACCELERATOR_STAGES.items():
        on_gpu = use_device(getattr(config, stage), Accelerators(cuda_devices=1, bf16=True))
        on_cpu = use_device(getattr(config, stage), Accelerators(cuda_devices=0, bf16=False))
        chosen = (on_gpu.device, on_gpu.precision, on_cpu.device, on_cpu.precision)
        assert chosen == ("cuda:0", "bf16", "cpu", "fp32"), task


def test_queue_names_come_from_the_environment(dagbag, monkeypatch):
    loaded = dag_module(dagbag.dags["ads_relevance_agpo"])
    monkeypatch.setitem(sys.modules, loaded.__name__, loaded)  # the load below replaces it; put back after
    monkeypatch.setenv("AGPO_ACCELERATOR_QUEUE", "gpu")
    monkeypatch.setenv("AGPO_CPU_QUEUE", "cpu")
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(ROOT / "dags" / "ads_relevance_agpo.py")).dags["ads_relevance_agpo"]
    assert dag.get_task("train").queue == "gpu" and dag.get_task("merge").queue == "cpu"


def test_the_ads_dag_declares_pairs_labels_student_and_the_champion_as_assets(dagbag):
    ads = dagbag.dags["ads_relevance_agpo"]
    outlets = {t.task_id: [(o.name, getattr(o, "uri", None)) for o in t.outlets] for t in ads.tasks if t.outlets}
    assert outlets == {
        "validate": [("ads_relevance_pairs", "x-agpo://ads-relevance/pairs")],
        "merge": [("ads_relevance_labels", "x-agpo://ads-relevance/labels")],
        "distil": [("ads_relevance_student", "x-agpo://ads-relevance/student")],
        "register": [("ads_relevance_champion_changes", None)],  # an alias: an event only on a promotion
    }
    assert dag_module(ads).CHAMPION == CHAMPION


def run_register(dagbag, monkeypatch, tmp_path, decision):
    ads = dagbag.dags["ads_relevance_agpo"]
    module = dag_module(ads)
    registration = tmp_path / "registration.json"
    registration.write_text(json.dumps(decision))
    events = OutletEventAccessors()
    monkeypatch.setattr(module, "_run", lambda step: {"registration": str(registration)})
    monkeypatch.setattr(module, "get_current_context", lambda: {"outlet_events": events})
    ads.get_task("register").python_callable({})
    return events[AssetAlias("ads_relevance_champion_changes")].asset_alias_events


def test_register_emits_a_champion_event_only_when_it_promoted(dagbag, monkeypatch, tmp_path):
    [event] = run_register(dagbag, monkeypatch, tmp_path, {"promoted": True, "version": "3", "reason": "beats 2"})
    assert event.dest_asset_key.uri == CHAMPION.uri and event.extra["version"] == "3"
    assert run_register(dagbag, monkeypatch, tmp_path, {"promoted": False, "version": "4", "reason": "-"}) == []
    assert run_register(dagbag, monkeypatch, tmp_path, {}) == []  # tracking off: nothing registered


def fake_context(params, outlet_events=None):
    class TaskInstance:
        try_number = 1

    class Dag:
        dag_id = "ads_relevance_agpo"

    return {"params": params, "dag": Dag(), "run_id": "manual__1", "ti": TaskInstance(), "outlet_events": outlet_events}


def test_config_and_contract_errors_fail_without_retry_and_transient_errors_retry(dagbag, monkeypatch):
    from pipelines.ads import pipeline as ads_pipeline
    from pipelines.ads.intake.contracts import ContractError
    from pipelines.errors import StepSkipped

    module = dag_module(dagbag.dags["ads_relevance_agpo"])
    params = {"presets": [], "algorithm": "agpo", "overrides": []}
    monkeypatch.setattr(module, "get_current_context", lambda: fake_context({**params, "run_name": "../escape"}))
    with pytest.raises(AirflowFailException, match=r"no valid config.*run_name"):
        module._run("validate")
    monkeypatch.setattr(
        module, "get_current_context", lambda: fake_context({**params, "overrides": ["data.synthetic.seed"]})
    )
    with pytest.raises(AirflowFailException, match="key=value"):
        module._run("validate")

    monkeypatch.setattr(module, "get_current_context", lambda: fake_context(params))
    for permanent in (ContractError("pairs.parquet has no 'test' rows"), ads_pipeline.GateFailed("audit 0.2 < 0.5")):
        monkeypatch.setattr(ads_pipeline, "validate", lambda config, caller, err=permanent: (_ for _ in ()).throw(err))
        with pytest.raises(AirflowFailException, match=str(permanent)):
            module._run("validate")
    # a teacher below its gate skips the task and its branch (distil runs on none_failed), it does not fail the run
    skipped = StepSkipped("SFT teacher: the teacher answers at its class prior")
    monkeypatch.setattr(ads_pipeline, "build_teacher", lambda config, caller: (_ for _ in ()).throw(skipped))
    with pytest.raises(AirflowSkipException, match="answers at its class prior"):
        module._run("build_teacher")
    dag = dagbag.dags["ads_relevance_agpo"]
    assert dag.get_task("distil").trigger_rule == "none_failed"
    assert {dag.get_task(t).trigger_rule for t in ("train", "gate", "merge", "evaluate")} == {"all_success"}
    for transient in (OSError("stale NFS handle"), ConnectionError("MLflow server unreachable")):
        monkeypatch.setattr(ads_pipeline, "validate", lambda config, caller, err=transient: (_ for _ in ()).throw(err))
        with pytest.raises(type(transient)):  # not AirflowFailException: Airflow retries it
            module._run("validate")


def test_the_scoring_dag_runs_on_each_new_champion_and_scores_with_it(dagbag, monkeypatch, tmp_path):
    from pipelines.ads.serving import score as score_stage

    dag = dagbag.dags["ads_scoring"]
    assert list(dag.timetable.asset_condition.objects) == [CHAMPION]
    assert dag.params["model"] == "models:/ads-relevance-student@champion"
    assert [(o.name, o.uri) for o in dag.get_task("score").outlets] == [
        ("ads_relevance_scores", "x-agpo://ads-relevance/scores")
    ]
    module = dag_module(dag)
    score = dag.get_task("score").python_callable
    params = {k: dag.params[k] for k in dag.params}
    monkeypatch.delenv("AGPO_SCORING_PAIRS", raising=False)
    monkeypatch.setattr(module, "get_current_context", lambda: fake_context(params))
    with pytest.raises(AirflowSkipException, match="no pairs"):
        score()

    seen = []
    monkeypatch.setattr(score_stage, "run", lambda config: seen.append(config) or {"summary": tmp_path / "s.json"})
    monkeypatch.setenv("AGPO_SCORING_PAIRS", str(tmp_path / "new.parquet"))
    monkeypatch.setenv("AGPO_OUTPUT_ROOT", str(tmp_path))  # the worker's, not the run's
    events = OutletEventAccessors()
    overrides = ["batch_size=64"]
    monkeypatch.setattr(module, "get_current_context", lambda: fake_context({**params, "overrides": overrides}, events))
    assert score() == {"summary": str(tmp_path / "s.json")}
    [config] = seen
    assert config.input.path == str(tmp_path / "new.parquet") and config.model == params["model"]
    assert (config.out_dir, config.batch_size) == (f"{tmp_path}/scoring/manual__1", 64)
    assert events[module.SCORES].extra["model"] == params["model"]

    monkeypatch.setattr(module, "get_current_context", lambda: fake_context({**params, "overrides": ["batch_size=0"]}))
    with pytest.raises(AirflowFailException, match="batch_size"):
        score()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"run_name": "../escape"}, r"run_name '\.\./escape' holds the path separator"),
        ({"overrides": ["out_dir=/tmp/elsewhere"]}, r"override 'out_dir' is not a key a DAG run may set"),
        ({"overrides": ["tracking_uri=http://127.0.0.1:1/"]}, r"override 'tracking_uri' is not a key a DAG run"),
        ({"overrides": ["input.path=/etc/shadow"]}, r"override 'input.path' is not a key a DAG run may set"),
        ({"presets": ["/etc/passwd"]}, r"preset '/etc/passwd' is not a YAML file in .*configs"),
    ],
)
def test_the_scoring_dag_keeps_its_run_folder_and_presets_to_the_path_rules(
    dagbag, monkeypatch, tmp_path, change, message
):
    from pipelines.ads.serving import score as score_stage

    dag = dagbag.dags["ads_scoring"]
    module, score = dag_module(dag), dag.get_task("score").python_callable
    params = {**{k: dag.params[k] for k in dag.params}, "pairs": str(tmp_path / "new.parquet"), **change}
    monkeypatch.setattr(module, "get_current_context", lambda: fake_context(params, OutletEventAccessors()))
    monkeypatch.setattr(score_stage, "run", lambda config: {"summary": tmp_path / "s.json"})
    with pytest.raises(AirflowFailException, match=message):
        score()


def test_a_deployment_can_refuse_runs_that_tasks_trigger(monkeypatch):
    """AGPO_ADS_RUN_TYPES becomes the DAG's allowed_run_types: with "scheduled,manual", a TriggerDagRunOperator's
    run (operator_triggered) is refused by Airflow itself (airflow.api.common.trigger_dag), whatever its conf."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.types import DagRunType

    monkeypatch.setenv("AGPO_ADS_RUN_TYPES", "scheduled, manual")
    dag = DagBag(dag_folder=str(ROOT / "dags" / "ads_relevance_agpo.py")).dags["ads_relevance_agpo"]
    assert set(dag.allowed_run_types) == {DagRunType.SCHEDULED, DagRunType.MANUAL}
    monkeypatch.delenv("AGPO_ADS_RUN_TYPES")
    assert (
        DagBag(dag_folder=str(ROOT / "dags" / "ads_relevance_agpo.py")).dags["ads_relevance_agpo"].allowed_run_types
        is None
    )


@pytest.mark.integration
def test_the_stack_creates_the_pools_the_dags_name_sized_by_its_environment(airflow_home, tmp_path):
    """``deploy.stack up`` imports the pools that ``python dags/agpo_operations.py`` prints (as ``make demo`` does)
    into Airflow's metadata DB before it starts the scheduler (which queues no task of a missing pool), named and
    sized by the environment."""
    import sqlite3

    from deploy.airflow_services import create_pools
    from deploy.stack_config import StackConfig

    home, env = airflow_home
    sizes = {"AGPO_ACCELERATOR_POOL": "gpus", "AGPO_ACCELERATOR_POOL_SLOTS": "5", "AGPO_PARALLEL_SHARDS": "3"}
    create_pools(StackConfig(home=tmp_path), {**env, **sizes})
    with sqlite3.connect(home / "airflow.db") as db:
        pools = dict(db.execute("SELECT pool, slots FROM slot_pool"))
    assert pools["gpus"] == 5 and pools["agpo_annotation"] == 3  # the shards' pool: as many as may run at once
