"""The graph backends a student is served on, and one runner per backend: a callable from a batch of pair features
(student.pair_features) to grade probabilities, on onnxruntime or OpenVINO.

A backend is a runtime and the graph of the student folder it runs (``BACKENDS``):

- ``onnx``: ``student.onnx`` (fp32) on onnxruntime; ``onnx-int8``: ``student.int8.onnx``, onnxruntime's dynamic int8
  (student.export.quantize_onnx);
- ``openvino``: ``student.onnx`` compiled by OpenVINO's CPU plugin in fp32 (its inference precision pinned: on a CPU
  with AVX512-BF16 or AMX the plugin's default is bf16); ``openvino-bf16``: the same graph in bf16, offered only where
  the CPU has it (``cpu_has_bf16``); ``openvino-int8``: ``student.openvino-int8.xml``, OpenVINO IR quantized
  statically by NNCF on the team's own pairs (student.openvino_int8).

Which one ``backend: auto`` picks is evaluation.backend_choice's rule. This module imports numpy only (a runtime when a
runner is built): pipelines.ads.serving.student_model logs it beside the served model as code, so the MLflow model
runs a graph with this very code; so it takes a graph's path and imports nothing of the project.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# backend -> (runtime, graph precision: a key of student.pair_features.GRAPHS, OpenVINO's inference precision)
BACKENDS = {
    "onnx": ("onnxruntime", "fp32", None),
    "onnx-int8": ("onnxruntime", "int8", None),
    "openvino": ("openvino", "fp32", "f32"),
    "openvino-bf16": ("openvino", "fp32", "bf16"),
    "openvino-int8": ("openvino", "static-int8", None),
}
PROBABILITIES = "probabilities"  # the output every probability graph names (student.export)
# onnxruntime.GraphOptimizationLevel member of each graph_optimization name
GRAPH_OPTIMIZATIONS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@dataclass(frozen=True)
class GraphRunner:
    """A compiled graph: its input names, grades, and ``run(batch) -> probabilities [rows, grades]``."""

    input_names: list[str]
    num_grades: int
    run: Callable[[dict[str, np.ndarray]], np.ndarray]


def check_probability_graph(graph: Path, output_names: set[str]) -> None:
    """Refuse a graph that does not answer grade probabilities: a root ``model.onnx`` is the Hugging Face layout's
    graph (student.interchange, logits or token embeddings), the probability graph only in folders saved before it."""
    if PROBABILITIES not in output_names:
        raise ValueError(
            f"{graph} answers {sorted(output_names)}, not grade probabilities ({PROBABILITIES!r}): a student folder's "
            "probability graph is student.onnx (a root model.onnx is the Hugging Face layout's graph); export it "
            "with student.export.export_onnx (agpo distil does)"
        )


def cpu_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin computes in bf16 natively here (AVX512-BF16 or AMX)."""
    import openvino

    return "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def graph_runner(
    graph: Path, backend: str, device: str = "cpu", threads: int | None = None, graph_optimization: str = "all"
) -> GraphRunner:
    """``graph`` (the file of ``backend``'s precision) compiled for ``backend`` (a key of ``BACKENDS``); ``threads``:
    the runtime's intra-op threads (None: its default, one per physical core); ``device`` (onnxruntime's execution
    providers follow it: ``onnx_providers``; OpenVINO runs on the CPU only) and ``graph_optimization`` (a key of
    ``GRAPH_OPTIMIZATIONS``, onnxruntime's)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    runtime, _, inference_precision = BACKENDS[backend]
    if runtime == "openvino":
        if device != "cpu":
            raise ValueError(f"backend {backend} runs on the CPU: set device=cpu, or backend=onnx for {device}")
        return _openvino_runner(graph, inference_precision, threads)
    return _onnxruntime_runner(graph, device, threads, graph_optimization)


def _onnxruntime_runner(graph: Path, device: str, threads: int | None, graph_optimization: str) -> GraphRunner:
    import onnxruntime

    if graph_optimization not in GRAPH_OPTIMIZATIONS:
        levels = list(GRAPH_OPTIMIZATIONS)
        raise ValueError(f"graph_optimization must be one of {levels}, got {graph_optimization!r}")
    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = getattr(
        onnxruntime.GraphOptimizationLevel, GRAPH_OPTIMIZATIONS[graph_optimization]
    )
    session = onnxruntime.InferenceSession(str(graph), options, providers=onnx_providers(device))
    check_probability_graph(graph, {session.get_outputs()[0].name})
    names = [i.name for i in session.get_inputs()]
    return GraphRunner(
        names,
        int(session.get_outputs()[0].shape[-1]),
        lambda batch: session.run(None, {name: batch[name] for name in names})[0],
    )


def _openvino_runner(graph: Path, inference_precision: str | None, threads: int | None) -> GraphRunner:
    try:
        import openvino
    except ImportError:
        raise ImportError(
            "the openvino backends need OpenVINO: pip install -c constraints.txt openvino (make venv installs it), "
            "or set backend=onnx"
        ) from None
    if inference_precision == "bf16" and not cpu_has_bf16():
        raise ValueError("backend openvino-bf16 needs a CPU with AVX512-BF16 or AMX, absent here: use openvino")
    core = openvino.Core()
    model = core.read_model(str(graph))
    check_probability_graph(graph, model.outputs[0].get_names())
    settings = {"PERFORMANCE_HINT": "LATENCY"}  # one stream on all the threads: each batch as fast as it goes
    if inference_precision is not None:
        settings["INFERENCE_PRECISION_HINT"] = inference_precision
    if threads is not None:
        settings["INFERENCE_NUM_THREADS"] = threads
    request = core.compile_model(model, "CPU", settings).create_infer_request()
    names = [port.get_any_name() for port in model.inputs]
    return GraphRunner(
        names,
        int(model.outputs[0].get_partial_shape()[-1].get_length()),
        lambda batch: request.infer({name: batch[name] for name in names})[0].copy(),
    )


def onnx_providers(device: str) -> list:
    """onnxruntime's execution providers for a torch device name: the CPU's, or CUDA's on GPU N (then the CPU's
    for any node CUDA lacks); a CUDA device needs the onnxruntime-gpu build, and says so when it is not there."""
    if device == "cpu":
        return ["CPUExecutionProvider"]
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise ImportError(
            f"device {device} needs onnxruntime's CUDA provider, which this onnxruntime build lacks: install "
            "onnxruntime-gpu in place of onnxruntime, or set device=cpu (or backend=torch)"
        )
    return [("CUDAExecutionProvider", {"device_id": int(device.partition(":")[2] or 0)}), "CPUExecutionProvider"]
