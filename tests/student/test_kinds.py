"""A student kind is one class in a registry: the network, saving and loading, ONNX export and the served model's
card all read the kind from it, so adding a kind is a class and ``register_kind``."""

import numpy as np
import pytest
import torch

from student.export import GraphStudent, export_onnx
from student.interchange import INTERCHANGE_ONNX
from student.kinds import AUTO, KINDS, BiEncoder, CrossEncoder, HybridEncoder, kind_of, register_kind
from student.model import RelevanceStudent, StudentConfig
from student.pair_features import groups_of

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose green"] * 20
QUERIES, ADS = ["red shoes", "phone case"], ["nike running shoes, red", "garden hose 20 m"]


class ScaledCross:
    """A kind made up for this test: the cross-encoder's logits doubled (sharper grade probabilities)."""

    name, groups, ordinal_head, title = "scaled-cross", ("pair",), False, "cross-encoder, doubled logits"
    hf_task = None  # the classification model's logits are not its own

    @staticmethod
    def logits(net, features):
        return 2 * net.pair_logits(features)


@pytest.fixture
def scaled_cross():
    register_kind(ScaledCross)
    yield ScaledCross
    del KINDS[ScaledCross.name]


def test_the_registry_holds_the_three_kinds_and_refuses_unknown_or_repeated_names():
    assert {"cross": CrossEncoder, "bi": BiEncoder, "hybrid": HybridEncoder} == KINDS
    assert [kind_of(n).groups for n in KINDS] == [("pair",), ("query", "ad"), ("pair", "query", "ad")]
    with pytest.raises(ValueError, match=r"kind must be one of \['cross', 'bi', 'hybrid'\], got 'mlp'"):
        kind_of("mlp")
    auto = type("Auto", (CrossEncoder,), {"name": AUTO})
    for taken in (CrossEncoder, auto):
        with pytest.raises(ValueError, match="already registered"):
            register_kind(taken)
    unfinished = type("NoTask", (), {k: getattr(ScaledCross, k) for k in ("name", "groups", "ordinal_head", "title")})
    with pytest.raises(ValueError, match=r"student kind NoTask lacks \['hf_task'\]"):
        register_kind(unfinished)


def test_a_new_kind_is_one_class_and_a_registry_entry(scaled_cross, tmp_path):
    config = StudentConfig(kind=scaled_cross.name, tiny_hidden=32, tiny_vocab=300)
    student = RelevanceStudent.build(config, texts=TEXTS)
    plain = RelevanceStudent.build(StudentConfig(kind="cross", tiny_hidden=32, tiny_vocab=300), texts=TEXTS)
    features = student.encode(QUERIES, ADS)
    student.model.eval(), plain.model.eval()  # no dropout
    with torch.no_grad():  # the same seed and backbone: the new kind's logits are the cross-encoder's, doubled
        assert torch.allclose(student.logits(features), 2 * plain.logits(features), atol=1e-6)
    folder = student.save(tmp_path / "model")
    export_onnx(student, folder)
    assert not (folder / INTERCHANGE_ONNX).exists()  # no Hugging Face task: no interchange graph (student.interchange)
    loaded = RelevanceStudent.load(folder)
    assert loaded.kind == scaled_cross.name
    assert np.allclose(loaded.predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS), atol=1e-6)
    assert groups_of(GraphStudent(folder).input_names) == scaled_cross.groups
    assert np.allclose(GraphStudent(folder).predict_proba(QUERIES, ADS), student.predict_proba(QUERIES, ADS), atol=1e-4)


def test_a_config_names_only_a_registered_kind_or_auto():
    with pytest.raises(ValueError, match=r"kind must be one of \['cross', 'bi', 'hybrid', 'auto'\], got 'mlp'"):
        StudentConfig(kind="mlp")
