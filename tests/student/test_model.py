"""The student model: a reproducible tokenizer, batch prediction, and ONNX export with torch parity."""

import json

import numpy as np
import pytest

from student.export import PARITY_ATOL, GraphStudent, export_onnx
from student.model import RelevanceStudent, StudentConfig, grade_names, train_pair_tokenizer

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "蓝色 手机壳 华为"] * 20
QUERIES = ["red shoes", "phone case for iphone 15 pro max in black", "蓝色手机壳", "x"]
ADS = ["nike running shoes, red, size 42", "apple silicone case", "华为 手机壳 蓝色 🙂", "earbuds sony wireless noise"]


def test_the_tokenizer_trains_to_the_same_vocabulary_every_time():
    first, second = train_pair_tokenizer(TEXTS, 300), train_pair_tokenizer(TEXTS, 300)
    assert first.get_vocab() == second.get_vocab()
    encoded = first("red shoes", "nike 红色 🙂")
    assert encoded["input_ids"][0] == first.cls_token_id and first.unk_token_id not in encoded["input_ids"]
    assert encoded["token_type_ids"][-1] == 1  # the ad is segment B


def test_predict_is_the_argmax_of_predict_proba_in_input_order_for_any_batch_size():
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=TEXTS)
    probs = student.predict_proba(QUERIES, ADS, batch_size=3)
    assert probs.shape == (4, 4) and np.allclose(probs.sum(1), 1, atol=1e-6)
    assert np.allclose(student.predict_proba(QUERIES, ADS, batch_size=1), probs, atol=1e-6)
    assert student.predict(QUERIES, ADS).tolist() == probs.argmax(1).tolist()
    assert student.predict_proba([], []).shape == (0, 4)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        student.predict_proba(QUERIES, ADS, batch_size=0)


def test_onnx_export_gives_the_torch_probabilities_within_the_stated_tolerance(tmp_path):
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=TEXTS)
    student.save(tmp_path)
    export_onnx(student, tmp_path)
    served = GraphStudent(tmp_path, max_length=student.max_length)
    # mixed lengths in one batch: padding and the attention mask must behave as in torch
    expected = student.predict_proba(QUERIES * 3, ADS * 3, batch_size=5)
    got = served.predict_proba(QUERIES * 3, ADS * 3, batch_size=5)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= PARITY_ATOL
    assert served.predict(QUERIES, ADS).tolist() == student.predict(QUERIES, ADS).tolist()


def test_onnx_student_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no student.onnx in .*export_onnx"):
        GraphStudent(tmp_path)


def test_the_saved_config_names_the_grades_and_the_tokenizer_keeps_the_max_length(tmp_path):
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=40), texts=TEXTS)
    student.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["id2label"] == {"0": "irrelevant", "1": "complement", "2": "substitute", "3": "exact"}
    assert config["label2id"] == {"irrelevant": 0, "complement": 1, "substitute": 2, "exact": 3}
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["model_max_length"] == 40
    assert RelevanceStudent.load(tmp_path).max_length == 40  # read back when not given
    assert RelevanceStudent.load(tmp_path, max_length=24).max_length == 24
    assert grade_names(2) == ("grade_0", "grade_1")


def test_the_bi_encoder_reads_minilm_as_sentence_transformers_does():
    from sentence_transformers import SentenceTransformer

    from student.model import packaged_dir

    student = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", kind="bi"))
    reference = SentenceTransformer(str(packaged_dir("all-minilm-l6-v2")), device="cpu")
    queries, ads = ["red running shoes", "iphone 15 case", "garden hose"], ["Nike running shoes, red"] * 3
    expected = (
        reference.encode(queries, normalize_embeddings=True) * reference.encode(ads, normalize_embeddings=True)
    ).sum(1)
    assert np.allclose(student.similarity(queries, ads), expected, atol=1e-5)


def test_a_bi_student_embeds_each_distinct_text_once_and_scores_as_its_network_does(monkeypatch):
    import torch

    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=TEXTS)
    student.fit_head(QUERIES, ADS, [0, 1, 2, 3])
    queries, ads = QUERIES * 3 + ["red shoes"], ADS[::-1] * 3 + ["red shoes"]  # repeats; a query that is also an ad
    embedded = []
    embed = student.embed
    monkeypatch.setattr(student, "embed", lambda texts, batch_size=256: embedded.append(list(texts)) or embed(texts))
    probs = student.predict_proba(queries, ads, batch_size=3)
    assert sorted(embedded[0]) == sorted(set(queries + ads))  # 8 texts embedded for 13 pairs
    student.model.eval()
    with torch.inference_mode():  # the network's own reading of the pairs, each text embedded per pair
        network = torch.softmax(student.logits(student.encode(queries, ads)), -1).numpy()
    assert np.allclose(probs, network, atol=1e-6)


def test_kinds_save_and_load_with_their_head_and_the_hybrid_starts_as_the_bi_encoder(tmp_path):
    grades = [0, 1, 2, 3]
    bi = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=TEXTS)
    hybrid = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="hybrid"), texts=TEXTS)
    for student in (bi, hybrid):
        student.fit_head(QUERIES, ADS, grades)
    # the same seed builds the same encoder, and the hybrid's pair term starts at 0
    assert np.allclose(hybrid.predict_proba(QUERIES, ADS), bi.predict_proba(QUERIES, ADS), atol=1e-6)
    hybrid.save(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["student_kind"] == "hybrid"
    loaded = RelevanceStudent.load(tmp_path)
    assert loaded.kind == "hybrid" and np.allclose(
        loaded.predict_proba(QUERIES, ADS), hybrid.predict_proba(QUERIES, ADS)
    )
    with pytest.raises(ValueError, match="a cross student has no ordinal head"):
        RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=TEXTS).fit_head(
            QUERIES, ADS, grades
        )


def test_kind_auto_is_cross_for_the_tiny_backbone_and_the_measured_default_for_a_pretrained_one():
    from student.kinds import DEFAULT_KINDS, resolved_kind

    assert resolved_kind("auto", "tiny") == "cross"
    assert resolved_kind("auto", "all-minilm-l6-v2") == DEFAULT_KINDS["pretrained"] == "bi"
    assert resolved_kind("cross", "all-minilm-l6-v2") == "cross"
    with pytest.raises(ValueError, match=r"kind must be one of \['cross', 'bi', 'hybrid', 'auto'\], got 'dual'"):
        StudentConfig(kind="dual")
