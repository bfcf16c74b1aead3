"""Crash injection at the register step: a run whose evaluation is done registers over a worse champion; the step
is killed with SIGKILL right after each of its registration writes in turn (the LoggedModel, the version, each
version tag, the alias move, registration.json, the step marker, the runs it ends: register_fault_child.py), then
run again. Every series ends in the state of the uninterrupted run: one version for the run, the alias on it,
the same tags, registration.json and step marker, one READY LoggedModel. And a model folder changed after
evaluate is refused at register, naming the file."""

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from evaluation.lexical import LexicalMatcher
from pipelines.ads import pipeline as ads_pipeline
from pipelines.ads.distillation.evidence import scored_pairs_digest, write_evidence
from pipelines.ads.intake.contracts import pairs_table, write_table
from pipelines.ads.serving.registry import Evaluation, register_student
from pipelines.ads.serving.student_model import FILES_TAG, download_registered_model
from pipelines.errors import StageFailed
from pipelines.tracking import Tracker, tracking_uri

pytestmark = [pytest.mark.integration, pytest.mark.minutes(3)]
CHILD = Path(__file__).with_name("register_fault_child.py")


def helper(path: Path):
    """A helper module next to this file (the tests' folders are no packages)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


register_config = helper(CHILD).register_config  # the run the child registers, and the state this test reads
fork_server = helper(CHILD.with_name("fork_server.py"))
# numpy's OpenBLAS and pyarrow's jemalloc start no thread at import: the server forks from one thread
SERVER_ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
FIGURES = {"accuracy": 0.5, "macro_f1": 0.4, "roc_auc_relevant": 0.7, "ndcg@10": 0.8, "ece": 0.1}


def evaluated_run(out_dir: Path, store_dir: Path) -> None:
    """A run folder whose evaluate step is done (the lexical matcher is the candidate: no torch model to train),
    and a store whose champion (version 1, ROC-AUC 0.6) it beats."""
    rows = [
        {"pair_id": f"p{i}", "query": q, "ad_title": a, "split": s, "gold_grade": g}
        for i, (q, a, s, g) in enumerate(
            [("red shoes", "red shoes nike", "train", 3), ("mug", "blue hat", "train", 0), ("mug", "mug", "test", 3)]
        )
    ]
    pairs = write_table(pairs_table(rows), out_dir / "pairs.parquet")
    config = register_config(str(out_dir), str(store_dir))
    eval_dir = ads_pipeline.layout(config).student / "eval"
    lexical = LexicalMatcher(4).fit(["red shoes", "mug"], ["red shoes nike", "blue hat"], [3, 0])
    folder = lexical.save(eval_dir / "baselines" / "lexical")
    report = {**FIGURES, "models": {"lexical": FIGURES}, "differences": {}, "baseline_models": {"lexical": str(folder)}}
    (eval_dir / "metrics.json").write_text(json.dumps(report))
    (eval_dir / "ranking_curves.png").write_bytes(b"\x89PNG the curves")  # attached to the registered model
    test_pairs = scored_pairs_digest(pairs, "test")
    write_evidence(eval_dir, {"lexical": folder}, test_pairs)
    tracker = Tracker(config.tracking, "seed/champion")
    with tracker.stage("register", {}) as log:  # on the same test pairs: its recorded figure compares
        evaluation = Evaluation({"roc_auc_relevant": 0.6}, test_pairs=test_pairs)
        register_student(tracker, log, folder, evaluation, name="lexical")
    tracker.finish()


def end_state(out_dir: Path, store_dir: Path) -> dict:
    """What a registration leaves, without what differs between any two runs (ids, times, file digests that
    hold MLflow's creation time): checked instead to match the stored files."""
    config = register_config(str(out_dir), str(store_dir))
    root, tracker = ads_pipeline.layout(config), Tracker(config.tracking, "reader/state")
    client, model = tracker.client, config.tracking.registered_model
    versions = sorted(client.search_model_versions(f"name = '{model}'"), key=lambda v: int(v.version))
    for version in versions:  # the digest each version carries is the digest of its stored files
        download_registered_model(f"models:/{model}/{version.version}", tracking_uri(config.tracking), out_dir / "dl")
    stage = client.search_runs([tracker.experiment_id], filter_string="tags.`agpo.stage` = 'register'")
    mine = [run for run in stage if run.data.tags["agpo.run_key"].endswith("/run")]
    logged = client.search_logged_models(
        [tracker.experiment_id, tracker.registry_experiment_id()], f"source_run_id = '{mine[0].info.run_id}'"
    )
    marker = json.loads((root.steps / "register_SUCCESS.json").read_text())
    return {
        "versions": [(v.version, {k: t for k, t in v.tags.items() if k != FILES_TAG}, v.description) for v in versions],
        "aliases": client.get_registered_model(model).aliases,
        "registration": json.loads((root.student / "registration.json").read_text()),
        "marker": {k: marker[k] for k in ("step", "params_sha256")},
        "stage runs": [
            (run.info.status, {k: v for k, v in run.data.metrics.items() if k != "step_seconds"}) for run in mine
        ],
        "logged models": [(m.name, str(m.status)) for m in logged],
    }


@pytest.fixture
def run_child():
    """``run_child(kill_at, log, out_dir, store_dir)``: the exit code of register_fault_child.py (-9: killed), its
    stdout and stderr kept next to ``log``; each run a fork of one server that imported mlflow and torch once, not
    a fresh interpreter (which spends most of a run's seconds importing them)."""
    with fork_server.started(CHILD, SERVER_ENV, timeout=300) as send:
        yield lambda kill_at, log, out_dir, store_dir: send([str(kill_at), str(log), str(out_dir), str(store_dir)], log)


def test_a_register_step_killed_after_any_write_ends_like_an_uninterrupted_one_on_its_retry(
    tmp_path, run_child, monkeypatch
):
    # Every series starts from one evaluated run, copied back into the same folder (the store holds absolute
    # artifact paths): seeding a store costs more than the two register steps a series runs. This process then
    # opens the store afresh on each use: a pooled connection would go on reading the database file replaced.
    monkeypatch.setenv("MLFLOW_SQLALCHEMYSTORE_POOLCLASS", "NullPool")
    case, seeded = tmp_path / "case", tmp_path / "seeded"
    evaluated_run(case / "runs", case / "mlflow")
    shutil.copytree(case, seeded)
    assert run_child(0, tmp_path / "points.log", case / "runs", case / "mlflow") == 0
    points = (tmp_path / "points.log").read_text().splitlines()
    expected = end_state(case / "runs", case / "mlflow")
    assert expected["aliases"] == {"champion": 2} and expected["registration"]["promoted"]
    assert [name for name, _ in expected["logged models"]] == ["lexical"]
    names = [line.split("\t")[1] for line in points]
    for point in ("create_model_version", "set_registered_model_alias", "write_json_atomic"):
        assert point in names, names
    for kill_at, point in enumerate(names, start=1):
        shutil.rmtree(case)
        shutil.copytree(seeded, case)
        logs = tmp_path / f"kill-{kill_at}"
        logs.mkdir()
        assert run_child(kill_at, logs / "points.log", case / "runs", case / "mlflow") == -9, point
        assert run_child(0, logs / "retry.log", case / "runs", case / "mlflow") == 0, point
        assert end_state(case / "runs", case / "mlflow") == expected, f"killed after write {kill_at} ({point})"


def test_a_model_folder_changed_after_evaluate_is_not_registered(tmp_path):
    evaluated_run(tmp_path / "runs", tmp_path / "mlflow")
    config = register_config(str(tmp_path / "runs"), str(tmp_path / "mlflow"))
    state = ads_pipeline.layout(config).student / "eval" / "baselines" / "lexical" / "lexical.json"
    state.write_text(state.read_text().replace("]", ", 0]", 1))
    with pytest.raises(StageFailed, match=r"lexical: lexical\.json \(changed\); nothing is registered"):
        ads_pipeline.register(config)
    client = Tracker(config.tracking, "reader/state").client
    assert len(client.search_model_versions("name = 'unit-student'")) == 1  # the seeded champion only


def test_a_plot_changed_after_evaluate_is_not_attached_to_a_registered_model(tmp_path):
    evaluated_run(tmp_path / "runs", tmp_path / "mlflow")
    config = register_config(str(tmp_path / "runs"), str(tmp_path / "mlflow"))
    (ads_pipeline.layout(config).student / "eval" / "ranking_curves.png").write_bytes(b"\x89PNG other curves")
    with pytest.raises(StageFailed, match=r"ranking_curves\.png \(changed\); nothing is registered"):
        ads_pipeline.register(config)
