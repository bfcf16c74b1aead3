"""Serving path, for every student kind: length-bucketed batches equal one-pair-at-a-time predictions in torch
and in the exported ONNX graph; int8 export and session options."""

import numpy as np
import onnx
import pytest
import torch

from student.export import INT8_FILE, ONNX_FILE, GraphStudent, export_onnx, ffn_output_projections, quantize_onnx
from student.graph_runtimes import onnx_providers
from student.kinds import kind_of
from student.model import RelevanceStudent, StudentConfig
from student.model_config import KINDS
from student.pair_features import bucketed_proba, featurize, groups_of

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "蓝色 手机壳 华为"] * 20
# lengths from 1 to many tokens, in no order, so buckets reorder them and trim their padding differently
QUERIES = ["x", "phone case for iphone 15 pro max in black", "red shoes", "蓝色手机壳", "a b", "sony earbuds wireless"]
ADS = ["nike", "apple silicone case, black, fits every iphone 15 pro max", "nike red", "华为 手机壳 🙂", "c", "d e f"]


def build_and_export(kind: str, folder):
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind=kind), texts=TEXTS)
    if kind != "cross":
        student.fit_head(QUERIES, ADS, [0, 1, 2, 3, 3, 0])
    student.save(folder)
    export_onnx(student, folder, quantize=True)
    return student, folder


@pytest.fixture(scope="module", params=KINDS)
def exported_kind(request, tmp_path_factory):
    """A tiny student of each kind, saved and exported (fp32 and int8)."""
    return build_and_export(request.param, tmp_path_factory.mktemp(f"student-{request.param}"))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny cross-encoder, saved and exported: what the serving options are checked on."""
    return build_and_export("cross", tmp_path_factory.mktemp("student"))


def one_at_a_time(student: RelevanceStudent) -> np.ndarray:
    """The unsorted, unpadded reference: each pair alone through the torch model (eval mode: no dropout)."""
    student.model.eval()
    with torch.inference_mode():
        alone = [student.logits(student.encode([q], [a])) for q, a in zip(QUERIES, ADS, strict=True)]
    return torch.softmax(torch.cat(alone), -1).numpy()


def test_bucketed_batches_give_each_pair_its_own_probabilities_in_input_order(exported_kind):
    student, folder = exported_kind
    expected = one_at_a_time(student)
    assert groups_of(GraphStudent(folder).input_names) == kind_of(student.kind).groups
    for batch_size in (1, 2, 4, 64):
        assert np.allclose(student.predict_proba(QUERIES, ADS, batch_size=batch_size), expected, atol=1e-5)
        served = GraphStudent(folder).predict_proba(QUERIES, ADS, batch_size=batch_size)
        assert np.allclose(served, expected, atol=1e-5), batch_size


def test_buckets_are_cut_longest_first_and_each_group_trimmed_to_its_longest_row(exported):
    student, _ = exported
    tokens = featurize(student.tokenizer, ("pair", "query", "ad"), QUERIES, ADS, student.max_length)
    pair, single = ["input_ids", "token_type_ids", "attention_mask"], ["input_ids", "attention_mask"]
    assert sorted(tokens) == sorted(pair + [f"query_{n}" for n in single] + [f"ad_{n}" for n in single])
    lengths = sum(tokens[name].sum(1) for name in tokens if name.endswith("attention_mask"))
    seen = []

    def record(batch: dict[str, np.ndarray]) -> np.ndarray:
        seen.append(sum(batch[n].sum(1) for n in batch if n.endswith("attention_mask")).tolist())
        for prefix in ("", "query_", "ad_"):  # every group padded only to its own longest row in the bucket
            assert batch[prefix + "input_ids"].shape[1] == batch[prefix + "attention_mask"].sum(1).max()
        return np.tile(np.asarray(seen[-1])[:, None], (1, 4)).astype(np.float32)

    result = bucketed_proba(tokens, 4, 4, record)
    assert [n for batch in seen for n in batch] == sorted(lengths.tolist(), reverse=True)
    assert result[:, 0].tolist() == lengths.tolist()  # rows back in input order
    assert bucketed_proba(featurize(student.tokenizer, ("pair",), [], [], 8), 4, 4, record).shape == (0, 4)
    with pytest.raises(ValueError, match="mismatched lengths: 1 queries, 0 ads"):
        featurize(student.tokenizer, ("pair",), ["a"], [], 8)
    with pytest.raises(ValueError, match=r"unknown feature groups \['title'\]"):
        featurize(student.tokenizer, ("title",), ["a"], ["b"], 8)


def test_int8_export_serves_close_to_fp32(exported_kind):
    _, folder = exported_kind
    assert (folder / INT8_FILE).stat().st_size < (folder / ONNX_FILE).stat().st_size
    fp32 = GraphStudent(folder).predict_proba(QUERIES * 4, ADS * 4, batch_size=5)
    int8 = GraphStudent(folder, "onnx-int8").predict_proba(QUERIES * 4, ADS * 4, batch_size=5)
    assert np.allclose(int8.sum(1), 1, atol=1e-5) and np.abs(int8 - fp32).max() < 0.05


def float_matmuls_with_weights(path) -> set[str]:
    """Names of the fp32 MatMul nodes of an ONNX file whose second input is a weight (an initializer)."""
    model = onnx.load(path)
    weights = {tensor.name for tensor in model.graph.initializer}
    return {node.name for node in model.graph.node if node.op_type == "MatMul" and node.input[1] in weights}


def test_int8_keeps_exactly_the_feed_forward_output_projections_fp32(exported, tmp_path):
    _, folder = exported
    projections = ffn_output_projections(onnx.load(folder / ONNX_FILE))
    # the tiny student has 2 blocks, each with one output projection reading its GELU
    assert len(projections) == 2
    assert float_matmuls_with_weights(folder / INT8_FILE) == set(projections)
    every_matmul = quantize_onnx(folder / ONNX_FILE, tmp_path / INT8_FILE, ffn_output_fp32=False)
    assert float_matmuls_with_weights(every_matmul) == set()
    assert len(float_matmuls_with_weights(folder / ONNX_FILE)) > 2  # the fp32 graph: all of them


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_session_settings_do_not_change_the_probabilities(exported, threads, level):
    student, folder = exported
    served = GraphStudent(folder, threads=threads, graph_optimization=level)
    assert np.allclose(served.predict_proba(QUERIES, ADS, batch_size=3), one_at_a_time(student), atol=1e-5)


def test_bad_settings_say_what_to_do(exported, tmp_path):
    student, folder = exported
    with pytest.raises(ValueError, match=r"backend must be one of \[.*'onnx-int8'.*\], got 'onnx-fp16'"):
        GraphStudent(folder, "onnx-fp16")
    with pytest.raises(ValueError, match=r"graph_optimization must be one of .*got 'max'"):
        GraphStudent(folder, graph_optimization="max")
    export_onnx(student, tmp_path)
    with pytest.raises(FileNotFoundError, match=r"no student.int8.onnx in .*export_onnx\(\.\.\., quantize=True\)"):
        GraphStudent(tmp_path, "onnx-int8")


def test_onnxruntime_runs_on_the_cpu_or_says_what_a_gpu_needs():
    import onnxruntime

    assert onnx_providers("cpu") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        assert onnx_providers("cuda:1")[0] == ("CUDAExecutionProvider", {"device_id": 1})
        return
    with pytest.raises(ImportError, match="install onnxruntime-gpu in place of onnxruntime, or set device=cpu"):
        onnx_providers("cuda:0")
