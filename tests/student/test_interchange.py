"""A saved student folder loads in the Hugging Face tools a serving or retrieval team already has
(student.interchange): a cross student in sentence-transformers' ``CrossEncoder``, a bi student in
``SentenceTransformer``, and each kind's root ``model.onnx`` answers the reading those tools expect. These run the
torch loaders of .venv, each without a warning or a load report (a bi student's folder holds its encoder alone:
no classifier keys for ``SentenceTransformer`` to call unexpected); the ONNX backends' check is
tests/student/test_interchange_optimum.py."""

import json
import warnings

import numpy as np
import onnxruntime
import pytest
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer

from student.export import ONNX_FILE, GraphStudent, ensure_onnx, export_onnx
from student.interchange import INTERCHANGE_ONNX, portable_tokenizer_config
from student.model import RelevanceStudent, StudentConfig
from student.pair_features import LEGACY_GRAPH, featurize, graph_file

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose green"] * 20
QUERIES, ADS = ["red shoes", "phone case", "hose"], ["nike running shoes, red", "garden hose 20 m", "green garden hose"]


def saved(kind: str, folder) -> RelevanceStudent:
    student = RelevanceStudent.build(StudentConfig(kind=kind, tiny_hidden=32, tiny_vocab=300), texts=TEXTS)
    if student.model.head is not None:
        student.fit_head(QUERIES, ADS, [3, 0, 3])
    student.save(folder)
    export_onnx(student, folder)
    student.model.eval()
    return student


def loaded_quietly(capfd, load):
    """``load()``'s result, after checking it warned nothing and printed no load report (transformers logs one to
    stderr naming unexpected or missing keys)."""
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load()
    stderr = capfd.readouterr().err
    assert not [str(w.message) for w in caught] and not any(word in stderr for word in ("UNEXPECTED", "MISSING")), (
        stderr
    )
    return loaded


def interchange_session(folder) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(folder / INTERCHANGE_ONNX), providers=["CPUExecutionProvider"])


def test_a_cross_student_is_a_cross_encoder_and_its_hf_graph_answers_its_logits(tmp_path, capfd):
    student = saved("cross", tmp_path)
    with torch.no_grad():
        logits = student.logits(student.encode(QUERIES, ADS)).numpy()
    reference = loaded_quietly(capfd, lambda: CrossEncoder(str(tmp_path), device="cpu"))
    assert np.allclose(reference.predict(list(zip(QUERIES, ADS, strict=True))), logits, atol=1e-5)
    session = interchange_session(tmp_path)
    assert [o.name for o in session.get_outputs()] == ["logits"]
    features = featurize(student.tokenizer, ("pair",), QUERIES, ADS, student.max_length)
    assert {i.name for i in session.get_inputs()} == set(features) == {"input_ids", "token_type_ids", "attention_mask"}
    assert np.allclose(session.run(None, features)[0], logits, atol=1e-5)
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)  # the step after the graph: softmax
    assert np.allclose(GraphStudent(tmp_path).predict_proba(QUERIES, ADS), probabilities, atol=1e-5)


@pytest.mark.parametrize("kind", ["bi", "hybrid"])
def test_a_bi_or_hybrid_student_is_a_sentence_transformer_and_its_hf_graph_answers_token_embeddings(
    kind, tmp_path, capfd
):
    student = saved(kind, tmp_path)
    texts = [*QUERIES, *ADS]
    embeddings = student.embed(texts)
    reference = loaded_quietly(capfd, lambda: SentenceTransformer(str(tmp_path), device="cpu"))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertModel"]  # the encoder
    again = loaded_quietly(capfd, lambda: RelevanceStudent.load(tmp_path))  # the pair layers from the head file
    assert np.array_equal(again.predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS))
    assert reference.max_seq_length == student.max_length
    assert np.allclose(reference.encode(texts), embeddings, atol=1e-5)
    session = interchange_session(tmp_path)
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
    features = student.tokenizer(texts, padding=True, return_tensors="np")
    hidden = session.run(None, {i.name: features[i.name].astype(np.int64) for i in session.get_inputs()})[0]
    mask = features["attention_mask"][..., None]
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    assert np.allclose(pooled / np.linalg.norm(pooled, axis=1, keepdims=True), embeddings, atol=1e-5)
    if kind == "bi":  # the steps after the graph: the cosine, then the ordinal head, give the student's grades
        cosine = reference.similarity_pairwise(reference.encode(QUERIES), reference.encode(ADS))
        with torch.no_grad():
            grades = torch.softmax(student.model.head(cosine.float()), -1).numpy()
        assert np.allclose(grades, student.predict_proba(QUERIES, ADS), atol=1e-5)


def test_the_tokenizer_config_names_a_class_and_prefix_space_transformers_4_reads(tmp_path):
    saved("cross", tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # transformers 5 wrote TokenizersBackend
    assert config["add_prefix_space"] is True  # the pre-tokenizer's; transformers 4 assumes False
    config["tokenizer_class"] = "BertTokenizer"  # a class both versions have is kept
    del config["add_prefix_space"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    portable_tokenizer_config(tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {**config, "add_prefix_space": True}


def test_a_folder_saved_before_the_hf_layout_still_serves_its_root_graph_and_the_hf_graph_is_never_served(tmp_path):
    student = saved("cross", tmp_path / "new")
    assert graph_file(tmp_path / "new") == tmp_path / "new" / ONNX_FILE
    old = tmp_path / "old"  # saved before the Hugging Face layout: its probability graph was the root model.onnx
    student.save(old)
    (tmp_path / "new" / ONNX_FILE).rename(old / LEGACY_GRAPH)
    assert graph_file(old) == old / LEGACY_GRAPH
    files = sorted(p.name for p in old.iterdir())
    assert ensure_onnx(old) == old / LEGACY_GRAPH and sorted(p.name for p in old.iterdir()) == files  # left as it is
    assert np.allclose(GraphStudent(old).predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS), atol=1e-5)
    with pytest.raises(FileNotFoundError, match=r"no student.int8.onnx in .*quantize=True"):
        graph_file(old, "int8")
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'int8', 'static-int8'\], got 'fp16'"):
        graph_file(old, "fp16")
    # the new folder, its student.onnx gone: the root model.onnx is now the Hugging Face graph, logits out, and no
    # runtime serves it as probabilities
    for backend in ("onnx", "openvino"):
        with pytest.raises(ValueError, match=r"model.onnx answers \['logits'\], not grade probabilities"):
            GraphStudent(tmp_path / "new", backend)
    assert ensure_onnx(tmp_path / "new") == tmp_path / "new" / ONNX_FILE  # exported again from its weights
    assert np.allclose(
        GraphStudent(tmp_path / "new").predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS), atol=1e-5
    )
