"""The tensors a student reads for (query, ad) pairs, and length-bucketed batch prediction over them.

A student kind reads one or more *groups* of token tensors (its ``groups``, student.kinds):

- ``pair``: query and ad as one sequence pair (``[CLS] q [SEP] a [SEP]``, segment ids included), under
  the tokenizer's own input names (``input_ids``, ``token_type_ids``, ``attention_mask``): a cross-encoder;
- ``query`` and ``ad``: each text alone, as a sentence encoder reads it, named ``query_input_ids``,
  ``query_attention_mask``, ``ad_input_ids``, ``ad_attention_mask``: a bi-encoder.

The names are the contract between the torch student, its ONNX graph and the served MLflow model: a
graph's input names say which groups to build (``groups_of``), so every reader featurizes alike.

This module imports numpy only: ``pipelines.ads.serving.student_model`` logs it beside the served model as code (with
student.graph_runtimes, which runs the graph), so the MLflow pyfunc model tokenizes with these very functions, with no
torch and no copy of the rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

PREFIXES = {"pair": "", "query": "query_", "ad": "ad_"}
# a student folder's graphs of these features, grade probabilities out (student.export), by precision; not named
# model.onnx, the Hugging Face layout's graph (student.interchange) that sentence-transformers and Optimum read first;
# folders saved before that layout hold the fp32 probability graph under that name (LEGACY_GRAPH: the graph runners
# refuse a graph whose output is not the probabilities); static-int8 is OpenVINO IR (its weights in the .bin beside
# it: student.openvino_int8)
GRAPHS = {"fp32": "student.onnx", "int8": "student.int8.onnx", "static-int8": "student.openvino-int8.xml"}
LEGACY_GRAPH = "model.onnx"
SINGLE_INPUTS = ("input_ids", "attention_mask")  # a text alone has one segment: no segment ids


def prefix_of(name: str) -> str:
    """The group prefix of an input name (``""``: the pair group)."""
    return next((prefix for prefix in PREFIXES.values() if prefix and name.startswith(prefix)), "")


def groups_of(input_names: Iterable[str]) -> tuple[str, ...]:
    """The groups a set of input names reads, in ``PREFIXES`` order."""
    found = {prefix_of(name) for name in input_names}
    return tuple(group for group, prefix in PREFIXES.items() if prefix in found)


def featurize(
    tokenizer, groups: Sequence[str], queries: Sequence[str], ads: Sequence[str], max_length: int
) -> dict[str, np.ndarray]:
    """Every (query, ad) in one fast-tokenizer call per group, truncated to ``max_length`` tokens and
    right-padded to the group's longest row: int64 arrays [N, L_group] by input name."""
    if len(queries) != len(ads):
        raise ValueError(f"mismatched lengths: {len(queries)} queries, {len(ads)} ads")
    unknown = sorted(set(groups) - set(PREFIXES))
    if unknown:
        raise ValueError(f"unknown feature groups {unknown}; known: {list(PREFIXES)}")
    if not len(queries):
        return {}
    options = {"truncation": True, "max_length": max_length, "padding": "longest", "padding_side": "right"}
    features = {}
    for group in groups:
        if group == "pair":
            encoded = tokenizer(list(queries), list(ads), return_tensors="np", **options)
            names = [n for n in tokenizer.model_input_names if n in encoded]
        else:
            encoded = tokenizer(list(queries if group == "query" else ads), return_tensors="np", **options)
            names = list(SINGLE_INPUTS)
        features.update({PREFIXES[group] + n: np.asarray(encoded[n], dtype=np.int64) for n in names})
    return features


def graph_file(folder: Path, precision: str = "fp32") -> Path:
    """The probability graph of ``precision`` (a key of ``GRAPHS``) in a student ``folder``: ``GRAPHS``' file, or
    for fp32 in a folder saved before the Hugging Face layout, its root ``model.onnx``."""
    if precision not in GRAPHS:
        raise ValueError(f"precision must be one of {list(GRAPHS)}, got {precision!r}")
    for name in (GRAPHS[precision], *((LEGACY_GRAPH,) if precision == "fp32" else ())):
        if (folder / name).is_file():
            return folder / name
    how = {
        "int8": "export.export_onnx(..., quantize=True)",
        "static-int8": "openvino_int8.quantize_openvino (agpo distil with serving_backends: true does)",
    }.get(precision, "export.export_onnx (agpo distil does)")
    raise FileNotFoundError(f"no {GRAPHS[precision]} in {folder}; export it with student.{how}")


def _group_masks(features: dict[str, np.ndarray]) -> dict[str, str]:
    """Prefix -> the name of that group's attention mask."""
    return {prefix: prefix + "attention_mask" for prefix in PREFIXES.values() if prefix + "attention_mask" in features}


def bucketed_proba(
    features: dict[str, np.ndarray],
    batch_size: int,
    num_grades: int,
    proba: Callable[[dict[str, np.ndarray]], np.ndarray],
) -> np.ndarray:
    """``proba`` over length-bucketed batches of featurized pairs (``featurize``), rows in input order.

    Rows are sorted by their total token count over the groups, longest first (stable, so ties keep input
    order); each run of ``batch_size`` rows is one batch, every group's columns cut to that group's longest
    row in the batch, so a batch pads only to similar lengths and the hot loop is slicing and the forward
    pass. Right padding under the attention mask leaves each row's probabilities as they are alone (within
    float error); the rows are put back in input order at the end."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not features:
        return np.zeros((0, num_grades), dtype=np.float32)
    masks = _group_masks(features)
    lengths = {prefix: features[mask].sum(1) for prefix, mask in masks.items()}
    order = np.argsort(-sum(lengths.values()), kind="stable")
    result = np.empty((len(order), num_grades), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = {prefix: max(1, int(length[rows].max())) for prefix, length in lengths.items()}
        result[rows] = proba({name: values[rows, : width[prefix_of(name)]] for name, values in features.items()})
    return result
