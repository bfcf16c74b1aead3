"""Every saved model folder loads back through one rule (evaluation.predictors): a student of any kind with torch
or its ONNX graph, and a baseline saved as a model (the lexical matcher), each predicting what it predicted
before it was saved."""

import json

import numpy as np
import pytest

from evaluation.lexical import LexicalMatcher
from evaluation.predictors import backend_of, load_predictor, model_kind
from student.export import GraphStudent, export_onnx
from student.model import RelevanceStudent, StudentConfig

QUERIES = ["red shoes", "desk lamp", "blue mug"]
ADS = ["Acme red shoes 42", "Zeta desk lamp", "Garden hose"]


def test_each_saved_folder_loads_as_the_model_it_was(tmp_path):
    student = RelevanceStudent.build(StudentConfig(kind="bi", tiny_hidden=32, tiny_vocab=300), texts=QUERIES + ADS)
    student.fit_head(QUERIES, ADS, [3, 3, 0])
    folder = student.save(tmp_path / "bi")
    export_onnx(student, folder)
    assert model_kind(folder) == "bi"
    torch_model = load_predictor(folder)
    assert isinstance(torch_model, RelevanceStudent)
    assert np.allclose(torch_model.predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS), atol=1e-6)
    assert backend_of(torch_model) == "torch"
    for backend in ("onnx", "openvino", "auto"):  # auto in a folder never measured: fp32 on OpenVINO
        graph = load_predictor(folder, backend=backend, threads=1)
        assert isinstance(graph, GraphStudent) and backend_of(graph) == backend.replace("auto", "openvino")
    matcher = LexicalMatcher(4).fit(QUERIES, ADS, [3, 3, 0])
    lexical = matcher.save(tmp_path / "lexical")
    assert model_kind(lexical) == "lexical"
    for backend in ("torch", "onnx"):  # a matcher has no backend: both load the matcher
        loaded = load_predictor(lexical, backend=backend)
        assert np.array_equal(loaded.predict_proba(QUERIES, ADS), matcher.predict_proba(QUERIES, ADS))
        assert backend_of(loaded) == "scikit-learn"
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps({"num_labels": 4}))
    assert model_kind(tmp_path / "old") == "cross"  # students saved before the kind was recorded
    with pytest.raises(FileNotFoundError, match=r"no config.json in .*: not a saved student or baseline model folder"):
        model_kind(tmp_path)
