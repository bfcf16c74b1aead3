"""OpenVINO static int8 of a student's graph, calibrated on the team's own pairs: ``student.openvino-int8.xml``
(OpenVINO IR, its weights in the ``.bin`` beside it), which the ``openvino-int8`` backend serves
(student.graph_runtimes).

Static quantization fixes every activation's int8 scale ahead of time from calibration pairs, where onnxruntime's
dynamic int8 (student.export.quantize_onnx) computes one per batch at run time: no scale to compute while serving,
int8 kernels end to end. NNCF (OpenVINO's quantizer) does it with its transformer recipe (``ModelType.TRANSFORMER``:
SmoothQuant, the attention's softmax and layer norms kept in float, bias correction), the recipe
sentence-transformers' ``export_static_quantized_openvino_model`` runs through optimum-intel. That function
calibrates on GLUE downloaded from the Hub; here the pairs are the caller's (``agpo distil`` passes half of its gold
audit split: evaluation.backend_choice), each featurized alone, unpadded, so padding never enters a scale. Nothing is
downloaded: the graph, the tokenizer and the pairs are local.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from student.export import ensure_onnx, saved_tokenizer
from student.pair_features import GRAPHS, featurize, groups_of

STATIC_INT8_FILE = GRAPHS["static-int8"]


def calibration_features(
    folder: Path, input_names: list[str], queries: Sequence[str], ads: Sequence[str]
) -> list[dict]:
    """One feature dict per (query, ad) pair, featurized alone (no padding) as the folder's graph reads it (its
    ``input_names``)."""
    tokenizer, max_length = saved_tokenizer(folder)
    groups = groups_of(input_names)
    return [featurize(tokenizer, groups, [query], [ad], max_length) for query, ad in zip(queries, ads, strict=True)]


def quantize_openvino(folder: str | Path, queries: Sequence[str], ads: Sequence[str]) -> Path:
    """``folder``'s fp32 graph quantized to static int8 by NNCF, calibrated on exactly the given (query, ad) pairs,
    written as ``folder/student.openvino-int8.xml`` (+ ``.bin``, whole or not at all); returns its path."""
    if not queries:
        raise ValueError("calibrating the int8 graph needs pairs: pass some of the team's audit pairs")
    import nncf
    import openvino

    folder = Path(folder)
    nncf.set_log_level(logging.ERROR)  # its progress bars are not the user's concern
    model = openvino.Core().read_model(str(ensure_onnx(folder)))
    pairs = calibration_features(folder, [port.get_any_name() for port in model.inputs], queries, ads)
    quantized = nncf.quantize(model, nncf.Dataset(pairs), model_type=nncf.ModelType.TRANSFORMER, subset_size=len(pairs))
    target = folder / STATIC_INT8_FILE
    temporary = target.with_suffix(".tmp.xml")
    openvino.save_model(quantized, str(temporary), compress_to_fp16=False)
    temporary.with_suffix(".bin").replace(target.with_suffix(".bin"))
    temporary.replace(target)
    return target
