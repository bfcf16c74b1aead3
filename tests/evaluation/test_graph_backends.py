"""The graph backends (student.graph_runtimes) and ``backend: auto`` (evaluation.backend_choice): OpenVINO's fp32
answers the torch and onnxruntime probabilities, its static int8 is calibrated on exactly the pairs given, and auto
picks the fastest backend that keeps quality on the CPU that measured it, else fp32 on OpenVINO."""

import json

import nncf
import numpy as np
import pytest

from evaluation import backend_choice
from evaluation.backend_choice import (
    CHOICE_FILE,
    MAX_AUC_DROP,
    auto_backend,
    choose_backend,
    cpu_fingerprint,
    fastest_keeping_quality,
)
from pipelines.ads.distillation.distil_config import DistilConfig
from pipelines.ads.serving.score import ShardScorer
from pipelines.ads.serving.score_config import ScoreConfig
from student.export import GraphStudent, export_onnx
from student.graph_runtimes import cpu_has_bf16
from student.model import RelevanceStudent, StudentConfig
from student.openvino_int8 import STATIC_INT8_FILE, quantize_openvino

QUERIES = ["x", "phone case for iphone 15 pro max in black", "red shoes", "蓝色手机壳", "a b", "sony earbuds wireless"]
ADS = ["nike", "apple silicone case, black, fits every iphone 15 pro max", "nike red", "华为 手机壳 🙂", "c", "d e f"]
PAIRS = zip(QUERIES * 2, ADS[::-1] + ADS, [0, 1, 2, 3] * 3, strict=True)
ROWS = [{"query": query, "ad_title": ad, "gold_grade": grade} for query, ad, grade in PAIRS]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny cross-encoder student, saved and exported (every kind's graph runs alike: its input names say what to
    featurize, tests/student/test_export.py)."""
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=QUERIES + ADS)
    folder = student.save(tmp_path_factory.mktemp("student"))
    export_onnx(student, folder)
    return folder


def test_openvino_fp32_answers_what_torch_and_onnxruntime_answer(folder):
    torch_probs = RelevanceStudent.load(folder).predict_proba(QUERIES, ADS, 4)
    onnx = GraphStudent(folder, "onnx").predict_proba(QUERIES, ADS, 4)
    openvino = GraphStudent(folder, "openvino", threads=1).predict_proba(QUERIES, ADS, 4)
    assert np.abs(openvino - onnx).max() < 1e-5 and np.abs(openvino - torch_probs).max() < 1e-5


def test_static_int8_is_calibrated_on_exactly_the_pairs_given_and_stays_close(folder, monkeypatch):
    seen = []
    quantize = nncf.quantize

    def spy(model, dataset, **options):
        seen.extend(dataset.get_inference_data())
        return quantize(model, dataset, **options)

    monkeypatch.setattr(nncf, "quantize", spy)
    path = quantize_openvino(folder, QUERIES[:4], ADS[:4])
    assert path == folder / STATIC_INT8_FILE and path.with_suffix(".bin").is_file()
    assert len(seen) == 4  # one unpadded pair each, no other data
    masks = [values for pair in seen for name, values in pair.items() if name.endswith("attention_mask")]
    assert all(mask.shape[0] == 1 and mask.all() for mask in masks)
    int8 = GraphStudent(folder, "openvino-int8").predict_proba(QUERIES, ADS, 4)
    fp32 = GraphStudent(folder, "onnx").predict_proba(QUERIES, ADS, 4)
    assert np.abs(int8 - fp32).max() < 0.1
    with pytest.raises(ValueError, match="needs pairs: pass some of the team's audit pairs"):
        quantize_openvino(folder, [], [])


@pytest.mark.skipif(cpu_has_bf16(), reason="this CPU computes bf16: the backend is offered")
def test_bf16_where_the_cpu_lacks_it_says_what_to_use(folder):
    with pytest.raises(ValueError, match="needs a CPU with AVX512-BF16 or AMX, absent here: use openvino"):
        GraphStudent(folder, "openvino-bf16")


def test_the_rule_keeps_fp32_and_int8_within_the_auc_drop_and_takes_the_fastest():
    fast_but_worse = {"onnx": (0.0, 100.0), "openvino": (0.0, 120.0), "openvino-int8": (-2 * MAX_AUC_DROP, 300.0)}
    within = {**fast_but_worse, "onnx-int8": (-MAX_AUC_DROP, 200.0)}
    one_class = {"onnx": (float("nan"), 100.0), "openvino-int8": (float("nan"), 300.0)}
    for figures, winner in ((fast_but_worse, "openvino"), (within, "onnx-int8"), (one_class, "onnx")):
        measured = {b: {"roc_auc_change": change, "pairs_per_s": rate} for b, (change, rate) in figures.items()}
        assert fastest_keeping_quality(measured) == winner


def test_auto_is_the_measured_winner_on_the_cpu_that_measured_it_else_fp32_on_openvino(folder, tmp_path, monkeypatch):
    assert auto_backend(folder) == "openvino"  # never measured
    measured = choose_backend(folder, ROWS, batch_size=4, repeats=1, threads=1)
    assert set(measured["backends"]) >= {"onnx", "onnx-int8", "openvino", "openvino-int8"}
    assert measured["pairs"] == {"calibration": 6, "check": 6, "batch_size": 4}
    assert measured["backends"]["onnx"]["roc_auc_change"] == 0 and measured["machine"] == cpu_fingerprint()
    assert measured["choice"] == fastest_keeping_quality(measured["backends"]) == auto_backend(folder)
    config = ScoreConfig(model=str(folder), backend="auto", threads=1, out_dir=str(tmp_path))
    assert ShardScorer(config).backend == measured["choice"]  # what agpo score --set backend=auto runs
    elsewhere = {**measured, "machine": {"cpu": "another CPU", "flags": []}}
    (folder / CHOICE_FILE).write_text(json.dumps(elsewhere))
    assert auto_backend(folder) == "openvino"
    monkeypatch.setattr(backend_choice.importlib.util, "find_spec", lambda name: None)  # no runtime installed
    assert auto_backend(folder) == "torch"
    (folder / CHOICE_FILE).unlink()


def test_distil_measures_the_backends_only_of_graphs_it_exports():
    with pytest.raises(ValueError, match="serving_backends measures the exported graphs: set export_onnx: true"):
        DistilConfig(serving_backends=True, export_onnx=False)
