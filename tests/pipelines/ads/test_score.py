"""``agpo score``: every input row scored or quarantined, the student's own probabilities, a resume after a
crash identical to an uninterrupted run, and a rerun with another model refused naming the key."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from durable.fileio import sha256_file
from pipelines.ads.annotation.commits import FingerprintMismatch
from pipelines.ads.intake.ingest import InputConfig
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.serving.score import ScoreConfig, resolve_model
from pipelines.ads.serving.score import run as score
from student.model import RelevanceStudent, StudentConfig

pytestmark = pytest.mark.integration
FIELDS = ("pair_id", "query", "ad_title", "gold_grade", "split")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Two tiny students (other seeds) and a JSONL of 60 pairs plus 4 bad rows and 3 duplicate pair_ids."""
    work = tmp_path_factory.mktemp("score")
    rows = [{k: r[k] for k in FIELDS} for r in generate_pairs(SyntheticConfig(train=60, audit=0, unlabeled=0, test=0))]
    texts = [f"{r['query']} {r['ad_title']}" for r in rows]
    for seed in (0, 1):
        student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, seed=seed), texts=texts)
        student.save(work / f"student-{seed}")
    lines = [json.dumps(r) for r in rows]
    lines += [
        json.dumps({"pair_id": "bad-1", "query": "", "ad_title": "lamp"}),
        json.dumps({"pair_id": "bad-2", "query": "sofa"}),
        "{broken",
        json.dumps({"pair_id": "bad-3", "query": "sofa", "ad_title": "lamp", "gold_grade": 9}),
    ]
    lines += [json.dumps({**rows[i], "ad_title": "a later copy"}) for i in (0, 5, 9)]
    (work / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return work, rows, len(lines)


def config_for(work, out, seed=0, **overrides):
    source = InputConfig(path=str(work / "pairs.jsonl"))
    # one thread: runs compared to the bit must sum in the same order (the default follows the machine's load)
    settings = {"chunk_pairs": 16, "batch_size": 8, "threads": 1, **overrides}
    return ScoreConfig(input=source, model=str(work / f"student-{seed}"), out_dir=str(out), **settings)


def scores_of(out):
    return [row for path in sorted((out / "scores").glob("*.parquet")) for row in pq.read_table(path).to_pylist()]


@pytest.fixture(scope="module")
def finished(work, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished")
    paths = score(config_for(work[0], out))
    return out, paths


def test_every_row_is_scored_or_quarantined_with_the_students_probabilities(work, finished):
    folder, rows, lines = work
    out, paths = finished
    summary = json.loads(paths["summary"].read_text())
    scores = scores_of(out)
    quarantined = [r for p in sorted((out / "quarantine").glob("*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert summary["rows_in"] == lines == len(scores) + len(quarantined) and summary["skipped_other_splits"] == 0
    assert (summary["scored"], summary["quarantined"]) == (60, 7)
    assert sorted(r["reason"] for r in quarantined).count("duplicate_pair_id") == 3
    assert [r["pair_id"] for r in scores] == [r["pair_id"] for r in rows]  # once each, in input order (one shard)

    student = RelevanceStudent.load(folder / "student-0")
    expected = student.predict_proba([r["query"] for r in rows], [r["ad_title"] for r in rows])
    probs = np.array([r["probabilities"] for r in scores], dtype=np.float32)
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert [r["grade"] for r in scores] == probs.argmax(1).tolist()
    np.testing.assert_allclose([r["confidence"] for r in scores], probs.max(1))
    version = f"folder:{sha256_file(folder / 'student-0' / 'model.safetensors')[:12]}"
    assert {r["model_version"] for r in scores} == {version} == {summary["model_version"]}
    for name, sha in summary["files"].items():
        assert sha256_file(out / name) == sha
    assert not (out / "work").exists() and not (out / "leases").exists()


def test_a_run_that_died_mid_shard_resumes_to_identical_scores_and_a_rerun_scores_nothing(
    work, finished, tmp_path, monkeypatch
):
    calls, predict = [], RelevanceStudent.predict_proba

    def dies_on_the_second_chunk(self, queries, ads, batch_size=256):
        calls.append(len(queries))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the first chunk is committed, the second is not
        return predict(self, queries, ads, batch_size)

    crashed = config_for(work[0], tmp_path, num_shards=2)
    monkeypatch.setattr(RelevanceStudent, "predict_proba", dies_on_the_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        score(crashed)
    assert len(list((tmp_path / "work").glob("*/*.done"))) == 1
    monkeypatch.undo()
    score(crashed)
    by_id = {r["pair_id"]: r for r in scores_of(finished[0])}
    resumed = scores_of(tmp_path)
    assert len(resumed) == len(by_id) and {r["pair_id"] for r in resumed} == set(by_id)  # none lost or twice
    assert all(r == by_id[r["pair_id"]] for r in resumed)

    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "scores").iterdir()}
    monkeypatch.setattr(RelevanceStudent, "predict_proba", lambda *a, **k: pytest.fail("scored again"))
    score(crashed)  # a no-op
    assert {p: p.stat().st_mtime_ns for p in files} == files


def test_a_rerun_or_resume_with_another_model_is_refused_naming_the_key(work, finished, tmp_path, monkeypatch):
    folder = work[0]
    with pytest.raises(FingerprintMismatch, match=r"shard 0 .*model_version: \"folder:\w+\" -> \"folder:\w+\""):
        score(config_for(folder, finished[0], seed=1))
    with pytest.raises(FingerprintMismatch, match=r"shard 0 .*batch_size: 8 -> 4"):
        score(config_for(folder, finished[0], batch_size=4))
    monkeypatch.setattr(RelevanceStudent, "predict_proba", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        score(config_for(folder, tmp_path))
    monkeypatch.undo()
    with pytest.raises(FingerprintMismatch, match=r"work/00000 .*model_version"):
        score(config_for(folder, tmp_path, seed=1))


def test_config_is_checked_and_a_folder_without_weights_is_named(work, tmp_path):
    with pytest.raises(ValueError, match="backend must be one of"):
        replace(config_for(work[0], tmp_path), backend="tensorrt")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors does not exist"):
        resolve_model(replace(config_for(work[0], tmp_path), model=str(tmp_path)))


def test_the_onnx_backend_gives_the_torch_scores(work, finished, tmp_path):
    from student.export import PARITY_ATOL, export_onnx

    folder = tmp_path / "student"
    shutil.copytree(work[0] / "student-0", folder)
    export_onnx(RelevanceStudent.load(folder), folder)
    config = replace(config_for(work[0], tmp_path / "out"), model=str(folder), backend="onnx")
    summary = json.loads(score(config)["summary"].read_text())
    assert summary["backend"] == "onnx" and summary["scored"] == 60
    torch_scores = scores_of(finished[0])
    onnx_scores = scores_of(tmp_path / "out")
    assert [r["grade"] for r in onnx_scores] == [r["grade"] for r in torch_scores]
    np.testing.assert_allclose(
        [r["probabilities"] for r in onnx_scores], [r["probabilities"] for r in torch_scores], atol=PARITY_ATOL
    )


def test_a_registered_model_is_resolved_once_so_the_recorded_version_is_the_one_that_scored(
    work, finished, tmp_path, monkeypatch
):
    """The champion alias moves to version 2 right after the run resolved it to version 1 (a promotion while
    a scoring run starts): the run loads, scores with and records version 1 alone."""
    from pipelines.ads.serving import student_model
    from pipelines.ads.serving.registry import Evaluation, register_student
    from pipelines.tracking import CHAMPION, Tracker, TrackingConfig

    folder, name = work[0], "score-student"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # registering must leave no default store where it runs
    tracking = TrackingConfig(experiment="score", store_dir="mlflow", registered_model=name, champion_metric="macro_f1")
    tracker = Tracker(tracking, "dag/score")
    for seed, macro_f1 in ((0, 0.6), (1, 0.5)):  # version 1 (seed 0) is champion, version 2 (seed 1) is not
        with tracker.stage(f"register-{seed}", {}) as log:
            register_student(tracker, log, folder / f"student-{seed}", Evaluation({"macro_f1": macro_f1}))
    tracker.finish()
    resolve = student_model.registered_version

    def then_the_alias_moves(uri, tracking_uri=None):
        version = resolve(uri, tracking_uri)
        tracker.client.set_registered_model_alias(name, CHAMPION, "2")
        return version

    monkeypatch.setattr(student_model, "registered_version", then_the_alias_moves)
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    config = replace(config_for(folder, tmp_path / "out"), model=f"models:/{name}@{CHAMPION}", tracking_uri=uri)
    summary = json.loads(score(config)["summary"].read_text())
    assert str(tracker.client.get_model_version_by_alias(name, CHAMPION).version) == "2"  # the alias did move
    scores = scores_of(tmp_path / "out")
    assert {r["model_version"] for r in scores} == {f"{name}/1"} == {summary["model_version"]}
    version_1 = [r["probabilities"] for r in scores_of(finished[0])]  # student-0's scores, from its folder
    np.testing.assert_allclose([r["probabilities"] for r in scores], version_1, atol=1e-6)
