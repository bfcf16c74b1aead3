"""The student as an MLflow model: registered with its card, loaded back through ``models:/name@champion``
with the probabilities ``agpo evaluate`` computes (torch and onnx), and served over REST by ``agpo serve`` (its
scoring app, pipelines.ads.serving.serve_app)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evaluation.bm25 import Bm25Matcher
from evaluation.lexical import LexicalMatcher
from pipelines.ads.serving.registry import Evaluation, register_student
from pipelines.ads.serving.student_model import load_registered_student
from pipelines.ads.serving.student_pyfunc import BACKEND_ENV
from pipelines.tracking import Tracker, TrackingConfig
from student.export import PARITY_ATOL, GraphStudent, export_onnx
from student.model import RelevanceStudent, StudentConfig

pytestmark = pytest.mark.integration

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose 20 m"] * 20
QUERIES = ["red shoes", "phone case for iphone 15 pro max in black", "蓝色手机壳", "x"] * 8
ADS = ["nike running shoes, red, size 42", "apple silicone case", "华为 手机壳 蓝色 🙂", "earbuds sony wireless"] * 8
METRICS = {"accuracy": 0.61, "macro_f1": 0.52, "roc_auc_relevant": 0.7, "ndcg@10": 0.8}
BASELINES = {"lexical": {"accuracy": 0.5, "macro_f1": 0.41}}
MODEL = "unit-student"


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny hybrid student (ONNX exported, distil.json beside it) registered and promoted in a SQLite store: the
    hybrid reads every feature group (the pair, the query alone, the ad alone), so the served model must
    featurize all three as torch does."""
    root = tmp_path_factory.mktemp("registry")
    config = StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=40, kind="hybrid")
    student = RelevanceStudent.build(config, texts=TEXTS)
    student.fit_head(QUERIES, ADS, [0, 1, 2, 3] * 8)
    folder = student.save(root / "student" / "model")
    export_onnx(student, folder)
    (root / "student" / "distil.json").write_text(json.dumps({"label_source": "teacher", "training_pairs": 80}))
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.chdir(root)  # registering must leave no default store (mlruns/, mlflow.db) where it runs
        tracking = TrackingConfig(experiment="unit", store_dir=str(root / "mlflow"), registered_model=MODEL)
        tracker = Tracker(tracking, "dag/run-serve")
        with tracker.stage("register", {}) as log:
            figure = root / "ranking_curves.png"
            figure.write_bytes(b"\x89PNG a figure")
            decision = register_student(tracker, log, folder, Evaluation(METRICS, BASELINES, figures=[figure]))
        tracker.finish()
    assert decision["promoted"] and not (root / "mlruns").exists() and not (root / "mlflow.db").exists()
    return {"student": student, "folder": folder, "uri": f"sqlite:///{root / 'mlflow' / 'mlflow.db'}"}


def test_the_champion_loads_as_pyfunc_with_the_probabilities_evaluate_computes(registered, monkeypatch, tmp_path):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered["uri"])
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    got = model.predict(pd.DataFrame({"query": QUERIES, "ad_title": ADS}))
    assert list(got.columns) == ["grade", "label", "p_0", "p_1", "p_2", "p_3"]
    probs = got[[f"p_{k}" for k in range(4)]].to_numpy()
    torch_probs = registered["student"].predict_proba(QUERIES, ADS)  # agpo evaluate's default backend
    onnx_probs = GraphStudent(registered["folder"], "onnx", max_length=40).predict_proba(QUERIES, ADS)  # backend=onnx
    assert np.allclose(probs, onnx_probs, atol=1e-6)
    assert np.abs(probs - torch_probs).max() <= PARITY_ATOL
    assert got["grade"].tolist() == torch_probs.argmax(1).tolist()
    assert set(got["label"]) <= {"irrelevant", "complement", "substitute", "exact"}
    monkeypatch.setenv(BACKEND_ENV, "openvino")  # what agpo serve --set backend=openvino sets
    on_openvino = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion").predict(
        pd.DataFrame({"query": QUERIES, "ad_title": ADS})
    )
    assert np.allclose(on_openvino[[f"p_{k}" for k in range(4)]].to_numpy(), onnx_probs, atol=1e-5)

    info = model.metadata
    assert [c["name"] for c in info.signature.inputs.to_dict()] == ["query", "ad_title"]
    assert info.saved_input_example_info is not None
    requirements = Path(mlflow.artifacts.download_artifacts(f"models:/{MODEL}@champion/requirements.txt"))
    pins = requirements.read_text().split()
    assert {p.split("==")[0] for p in pins} >= {"onnxruntime", "transformers", "tokenizers", "numpy", "pandas"}
    assert all("==" in p for p in pins) and not any(p.startswith("torch") for p in pins)

    # the model card is the version's description and an artifact of the model
    version = mlflow.MlflowClient().get_model_version_by_alias(MODEL, "champion")
    facts = ("0 irrelevant", "3 exact", "Max length: 40", "teacher", "hybrid encoder", "| macro_f1 | 0.5200 | 0.4100 |")
    for fact in facts:
        assert fact in version.description, fact

    # the version is the register run's LoggedModel: its params, linked test metrics and card, through the client
    logged = mlflow.MlflowClient().get_logged_model(version.source.removeprefix("models:/"))
    assert logged.params == {"kind": "hybrid", "max_length": "40", "grades": "4"}
    linked = {f"student/test_{k.replace('@', '_at_')}": v for k, v in METRICS.items()}
    assert {m.key: m.value for m in logged.metrics} == linked
    files = {f.path for f in mlflow.MlflowClient().list_logged_model_artifacts(logged.model_id)}
    assert {"MLmodel", "model_card.md", "artifacts", "figures"} <= files
    figures = mlflow.MlflowClient().list_logged_model_artifacts(logged.model_id, "figures")
    assert [f.path for f in figures] == ["figures/ranking_curves.png"]  # the evaluation's plot, on the model

    # other code (agpo score) gets the student folder back and loads it as a RelevanceStudent
    folder = load_registered_student(f"models:/{MODEL}@champion", registered["uri"], tmp_path / "dl")
    loaded = RelevanceStudent.load(folder)
    assert loaded.max_length == 40 and loaded.kind == "hybrid" and (folder / "student.onnx").is_file()
    assert np.allclose(loaded.predict_proba(QUERIES, ADS), torch_probs, atol=1e-6)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_predictions(target: str, uri: str, tmp_path: Path) -> tuple[list[dict], str]:
    """``agpo serve --set model=<target>`` as a newcomer types it (the venv not activated: its bin/ is not on
    PATH; the store from MLFLOW_TRACKING_URI), asked once for QUERIES x ADS, then stopped with SIGTERM, leaving
    no server behind; returns its predictions and what it said."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PATH": "/usr/bin:/bin"}
    agpo = Path(sys.executable).parent / "agpo"
    command = [str(agpo), "serve", "--set", f"model={target}", "--set", f"port={port}"]
    command += ["--set", f"out_dir={tmp_path / 'serve'}"]
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "agpo serve did not answer /ping within 90 s"
            time.sleep(0.5)
        body = {
            "dataframe_split": {
                "columns": ["query", "ad_title"],
                "data": [list(p) for p in zip(QUERIES, ADS, strict=True)],
            }
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            predictions = json.loads(response.read())["predictions"]
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
        log.close()
    said = (tmp_path / "serve.log").read_text()
    assert code == 0, said[-2000:]
    assert f"at http://127.0.0.1:{port}/invocations" in said
    with pytest.raises(OSError):  # the server and its workers are gone
        urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
    return predictions, said


@pytest.mark.parametrize("model", ["champion", "folder"])
def test_agpo_serve_answers_a_rest_request_with_the_grades(registered, tmp_path, model):
    target = f"models:/{MODEL}@champion" if model == "champion" else str(registered["folder"])
    predictions, said = served_predictions(target, registered["uri"], tmp_path)
    assert ("(version 1, files verified)" in said) if model == "champion" else ("the student folder" in said)
    expected = registered["student"].predict_proba(QUERIES, ADS)
    assert [p["grade"] for p in predictions] == expected.argmax(1).tolist()
    served = np.array([[p[f"p_{k}"] for k in range(4)] for p in predictions])
    assert np.abs(served - expected).max() <= PARITY_ATOL


def scored_probabilities(uri: str, model: str, tmp_path: Path) -> tuple[np.ndarray, set[str]]:
    """``agpo score`` of QUERIES x ADS with ``model``: the probabilities in input order and the versions recorded."""
    from pipelines.ads.serving.score import ScoreConfig
    from pipelines.ads.serving.score import run as score
    from pipelines.config import load_config

    pairs = tmp_path / "pairs.jsonl"
    rows = [{"pair_id": f"p{i}", "query": q, "ad_title": a} for i, (q, a) in enumerate(zip(QUERIES, ADS, strict=True))]
    pairs.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    sets = [f"input.path={pairs}", "input.split=null", f"model={model}"]
    sets += [f"tracking_uri={uri}", f"out_dir={tmp_path / 'score'}", "max_length=40"]
    paths = score(load_config(ScoreConfig, [], sets))
    scored = pd.read_parquet(paths["scores"]).set_index("pair_id").loc[[r["pair_id"] for r in rows]]
    return np.stack(scored["probabilities"].to_numpy()), set(scored["model_version"])


def test_agpo_score_scores_with_the_champion_and_records_its_version(registered, tmp_path):
    probs, versions = scored_probabilities(registered["uri"], f"models:/{MODEL}@champion", tmp_path)
    assert versions == {f"{MODEL}/1"}  # the alias resolved to the version it points at
    assert np.abs(probs - registered["student"].predict_proba(QUERIES, ADS)).max() <= 1e-5


def test_a_baseline_registered_as_the_champion_loads_serves_and_scores_like_a_student(tmp_path):
    """What the champion rule registers when no student beats the baselines: the lexical matcher from its saved
    state, the zero-shot encoder (a bi student) from a folder with no ONNX graph yet, exported on the way, and the
    opt-in BM25 baseline (evaluation/bm25.py) through the same registry seam."""
    import mlflow

    lexical = LexicalMatcher(4).fit(QUERIES, ADS, [0, 1, 2, 3] * 8)
    lexical_dir = lexical.save(tmp_path / "baselines" / "lexical")
    encoder = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=TEXTS)
    encoder.fit_head(QUERIES, ADS, [0, 1, 2, 3] * 8)
    encoder_dir = encoder.save(tmp_path / "baselines" / "zero_shot")
    bm25 = Bm25Matcher(4).fit(QUERIES, ADS, [0, 1, 2, 3] * 8)
    bm25_dir = bm25.save(tmp_path / "baselines" / "bm25")
    # a store of its own: the module's store keeps one registered model for the tests that list them
    tracking = TrackingConfig(experiment="unit", store_dir=str(tmp_path / "mlflow"), registered_model="unit-baseline")
    uri = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    for name, folder in (("lexical", lexical_dir), ("zero_shot", encoder_dir), ("bm25", bm25_dir)):
        tracker = Tracker(tracking, f"dag/run-{name}")
        with tracker.stage("register", {}) as log:
            register_student(tracker, log, folder, Evaluation({"macro_f1": 0.4, "roc_auc_relevant": 0.7}), name=name)
        tracker.finish()
    assert (encoder_dir / "student.onnx").is_file()  # exported when it was registered
    expected = {1: lexical.predict_proba(QUERIES, ADS), 2: encoder.predict_proba(QUERIES, ADS)}
    expected[3] = bm25.predict_proba(QUERIES, ADS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for version, probs in expected.items():
            got = mlflow.pyfunc.load_model(f"models:/unit-baseline/{version}").predict(
                pd.DataFrame({"query": QUERIES, "ad_title": ADS})
            )
            assert np.abs(got[[f"p_{k}" for k in range(4)]].to_numpy() - probs).max() <= PARITY_ATOL
        pins = Path(mlflow.artifacts.download_artifacts("models:/unit-baseline/1/requirements.txt")).read_text()
        assert "scikit-learn==" in pins and "onnxruntime" not in pins  # the matcher needs no graph runtime
        pins = Path(mlflow.artifacts.download_artifacts("models:/unit-baseline/3/requirements.txt")).read_text()
        assert "rank-bm25==" in pins and "onnxruntime" not in pins
    # version 1 (the matcher) stayed the champion: the encoder's equal figure does not beat it
    predictions, said = served_predictions("models:/unit-baseline@champion", uri, tmp_path)
    assert "(version 1, files verified)" in said
    served = np.array([[p[f"p_{k}"] for k in range(4)] for p in predictions])
    assert np.abs(served - expected[1]).max() <= 1e-6
    probs, versions = scored_probabilities(uri, "models:/unit-baseline@champion", tmp_path)
    assert versions == {"unit-baseline/1"} and np.abs(probs - expected[1]).max() <= 1e-6


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (f"models:/{MODEL}@prod", rf"models:/{MODEL}@prod: .*alias prod.* \{{'{MODEL}': \['champion'\]\}}"),
        ("models:/no-such-model@champion", r"models:/no-such-model@champion: .*no-such-model"),
    ],
    ids=["unknown-alias", "unknown-model"],
)
def test_an_unknown_model_or_alias_is_one_line_naming_what_is_registered(
    registered, tmp_path, capsys, monkeypatch, model, message
):
    from pipelines.cli import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"pair_id": "p0", "query": "red shoes", "ad_title": "nike shoes"}) + "\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registered["uri"])
    sets = [f"input.path={pairs}", "input.split=null", f"model={model}", f"out_dir={tmp_path / 'score'}"]
    assert main(["score", *[a for s in sets for a in ("--set", s)]]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err) and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("stage", ["serve", "score"])
def test_a_registry_uri_without_version_or_alias_is_one_line_saying_what_to_give(stage, tmp_path, capsys):
    """``models:/name`` used to end agpo serve in a traceback (IndexError); it is refused before any store opens."""
    from pipelines.cli import main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"pair_id": "p0", "query": "red shoes", "ad_title": "nike shoes"}) + "\n")
    sets = ["model=models:/ads-relevance-student", f"out_dir={tmp_path / stage}"]
    sets += [f"input.path={pairs}", "input.split=null"] if stage == "score" else []
    assert main([stage, *[a for s in sets for a in ("--set", s)]]) == 1
    err = capsys.readouterr().err
    assert "names neither a version nor an alias: give models:/<name>/<version>" in err and "Traceback" not in err


def test_without_a_store_the_registry_says_so_and_creates_none(tmp_path, capsys, monkeypatch):
    from pipelines.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # a fresh folder: no work/mlflow
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"pair_id": "p0", "query": "red", "ad_title": "red"}) + "\n")
    sets = ["input.path=pairs.jsonl", "input.split=null", f"model=models:/{MODEL}@champion"]
    assert main(["score", *[a for s in sets for a in ("--set", s)]]) == 1
    err = capsys.readouterr().err
    assert "no MLflow store at" in err and "work/mlflow/mlflow.db" in err and "Traceback" not in err, err
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlruns").exists()
    assert not (tmp_path / "work").exists()  # no store, and no partition of a run that cannot score
