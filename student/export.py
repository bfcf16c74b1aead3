"""ONNX export of a student and a graph predictor (onnxruntime or OpenVINO) with the same ``predict_proba`` API.

The exported graph maps the student kind's feature tensors (student.pair_features: the pair's
``input_ids``, ``attention_mask`` and, for BERT-style models, ``token_type_ids`` for a cross-encoder; the
query's and the ad's ``query_*`` / ``ad_*`` tensors for a bi-encoder; both for a hybrid; batch and each
group's sequence length dynamic) to grade probabilities, softmax included.
It is traced with torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``), on the CPU in float32
wherever the student was placed. ``GraphStudent`` runs it on a backend of student.graph_runtimes (onnxruntime's
CPU provider, CUDA's with ``device``; OpenVINO's CPU plugin) with the
student's own tokenizer from the same folder, featurizing the groups its graph's input names ask for,
so a served model is one directory: ``save_pretrained`` files plus ``student.onnx`` (and the root ``model.onnx``, the
Hugging Face layout's graph: student.interchange). A network exported before is copied from the graph cache,
checked, instead of traced again (student.graph_cache).

Serving (``GraphStudent.predict_proba``): all pairs are featurized once, sorted by token count and cut into
length buckets of ``batch_size`` pairs, each padded only to its own longest pair
(``student.pair_features.bucketed_proba``). ``export_onnx(..., quantize=True)`` also writes ``student.int8.onnx``:
onnxruntime's dynamic quantization (weights of MatMul/Gemm as int8, per output channel; activations as
uint8 with one scale per batch, computed at run time), which ``GraphStudent(folder, "onnx-int8")`` serves.
The feed-forward output projections (the MatMuls fed by the block's activation function) stay fp32: a
GELU's output has a long tail that one uint8 scale per batch rounds coarsely, and the error grows through the
later blocks. Measured on three fine-tuned MiniLM students (benchmarks/bench_student_serving.py): keeping them
fp32 cut the mean probability error against fp32 by a third and the largest by half (1.2-3.4x per student), and the
accuracy change on the gold test from -0.27 +- 0.23 points to +0.07 +- 0.12 (docs/benchmarks.md); onnxruntime's
pre-processing and the classifier head in fp32 changed nothing, and static quantization calibrated on audit
pairs had 4x the error. Its grades still differ from fp32's on a few pairs, so fp32 stays the default.

Parity: probabilities from onnxruntime match the torch student's within ``PARITY_ATOL`` (absolute,
per probability), checked by the tests on padded batches of mixed lengths (fp32 only).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer

from compute.placement import ON_CPU
from student import graph_cache
from student.graph_runtimes import BACKENDS, PROBABILITIES, graph_runner
from student.interchange import HF_OUTPUTS, INTERCHANGE_ONNX
from student.model import DEFAULT_MAX_LENGTH, RelevanceStudent
from student.pair_features import GRAPHS, PREFIXES, bucketed_proba, featurize, graph_file, groups_of, prefix_of

ONNX_FILE, INT8_FILE = GRAPHS["fp32"], GRAPHS["int8"]
PARITY_ATOL = 1e-5
# what, besides the network and torch's version, decides the graphs: change it with _write_graph's exporter call
EXPORT_SETTINGS = "torch.onnx.export dynamo=True, dynamic batch and group lengths, external_data=False"
EXAMPLE_PAIR = (["example query"], ["an example ad title"])  # what the graphs are traced on
# ONNX op types of a transformer block's feed-forward activation (what its output projection reads)
FFN_ACTIVATIONS = ("Gelu", "FastGelu", "Relu")


# what a graph answers, by output name: the whole student's probabilities, or a kind's Hugging Face reading
# (student.interchange.HF_OUTPUTS) of the pair features under the tokenizer's own input names
READINGS = {
    PROBABILITIES: lambda net, features: torch.softmax(net(**features), -1),
    "logits": lambda net, features: net.backbone(**features).logits,
    "last_hidden_state": lambda net, features: net.backbone.base_model(**features).last_hidden_state,
}


class _Reading(torch.nn.Module):
    """The student network with positional tensor inputs (named ``input_names``) and one reading out."""

    def __init__(self, net: torch.nn.Module, input_names: Sequence[str], output: str) -> None:
        super().__init__()
        self.net, self.input_names, self.read = net, list(input_names), READINGS[output]

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.read(self.net, dict(zip(self.input_names, tensors, strict=True)))


def export_onnx(student: RelevanceStudent, directory: str | Path, quantize: bool = False) -> Path:
    """Write ``directory/student.onnx`` for ``student`` (in eval mode), with ``quantize`` its int8 copy
    ``student.int8.onnx`` beside it, and, for a kind with a Hugging Face task, ``model.onnx``
    (student.interchange); returns the fp32 path. A network exported before is copied from the graph cache
    (student.graph_cache), not traced again."""
    directory = Path(directory)
    path = directory / ONNX_FILE
    hf_task = student.model.spec.hf_task
    graphs = {ONNX_FILE: PROBABILITIES} | ({INTERCHANGE_ONNX: HF_OUTPUTS[hf_task]} if hf_task else {})
    cache = graph_cache.private_cache(graph_cache.cache_folder())
    settings = f"{EXPORT_SETTINGS}, max_length {student.max_length}"
    key = None if cache is None else graph_cache.graph_key(student.model, graphs, settings)  # no cache: no hashing
    if key is None or not graph_cache.restore(cache, key, directory, list(graphs)):
        _trace_graphs(student, directory, graphs)
        if key is not None:
            graph_cache.store(cache, key, directory, list(graphs))
    if quantize:
        quantize_onnx(path, path.with_name(INT8_FILE))
    return path


def _trace_graphs(student: RelevanceStudent, directory: Path, graphs: dict[str, str]) -> None:
    """Trace ``graphs`` ({file: reading}: ``student.onnx``, and ``model.onnx`` for a kind with a Hugging Face
    task) into ``directory``."""
    placement = student.placement
    student.place(ON_CPU)  # traced on the CPU in float32, as onnxruntime serves it on either device
    was_training = student.model.training
    student.model.eval()
    try:
        example = student.encode(*EXAMPLE_PAIR)
        lengths = {  # one sequence-length dimension per feature group
            prefix: torch.export.Dim(f"{group}_length", max=student.max_length) for group, prefix in PREFIXES.items()
        }
        _write_graph(student, example, graphs[ONNX_FILE], lengths, directory / ONNX_FILE)
        if INTERCHANGE_ONNX in graphs:
            pair = featurize(student.tokenizer, ("pair",), *EXAMPLE_PAIR, student.max_length)
            pair = {name: torch.from_numpy(values) for name, values in pair.items()}
            _write_graph(student, pair, graphs[INTERCHANGE_ONNX], lengths, directory / INTERCHANGE_ONNX)
    finally:
        student.model.train(was_training)
        student.place(placement)


def _write_graph(
    student: RelevanceStudent, example: dict[str, torch.Tensor], output: str, lengths: dict, path: Path
) -> None:
    """Trace ``student``'s ``output`` reading of the ``example`` features into ``path`` (batch and each group's
    length dynamic), written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names, batch = list(example), torch.export.Dim("batch")
    exporter_log = logging.getLogger("torch.onnx")  # it warns about absent torchvision ops we never use
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # the exporter's deprecation chatter is not the user's concern
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Reading(student.model, names, output),
                tuple(example[name] for name in names),
                str(path.with_suffix(".tmp")),
                dynamo=True,
                input_names=names,
                output_names=[output],
                # one entry: the *tensors tuple
                dynamic_shapes=(tuple({0: batch, 1: lengths[prefix_of(name)]} for name in names),),
                external_data=False,
                verbose=False,
            )
    finally:
        exporter_log.setLevel(level)
    path.with_suffix(".tmp").replace(path)


def ensure_onnx(directory: str | Path) -> Path:
    """``directory``'s probability graph (``graph_file``), exported from the saved student first when the folder has
    weights but no graph (the zero-shot baseline as ``agpo evaluate`` saves it, or a folder that lost its
    ``student.onnx``: its root ``model.onnx`` is then the Hugging Face graph, not one to serve); a folder with no
    weights, or one saved before the Hugging Face layout with its probability graph at the root, is left as it is."""
    directory = Path(directory)
    try:
        graph = graph_file(directory)
        if graph.name == ONNX_FILE or answers_probabilities(graph):
            return graph
    except FileNotFoundError:
        pass
    if (directory / "model.safetensors").is_file():
        export_onnx(RelevanceStudent.load(directory), directory)
    return directory / ONNX_FILE


def answers_probabilities(graph: Path) -> bool:
    """Whether an ONNX graph's output is the grade probabilities (student.graph_runtimes.PROBABILITIES)."""
    import onnx

    return onnx.load(str(graph), load_external_data=False).graph.output[0].name == PROBABILITIES


def quantize_onnx(source: Path, target: Path, ffn_output_fp32: bool = True) -> Path:
    """onnxruntime's dynamic int8 quantization of ``source`` into ``target``: MatMul/Gemm weights as signed
    int8 per output channel, activations as uint8 with a scale computed per batch at run time; with
    ``ffn_output_fp32`` the feed-forward output projections (``ffn_output_projections``) stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    kept = ffn_output_projections(onnx.load(source)) if ffn_output_fp32 else []
    temporary = target.with_suffix(".tmp")
    quantize_dynamic(source, temporary, weight_type=QuantType.QInt8, per_channel=True, nodes_to_exclude=kept)
    temporary.replace(target)
    return target


def ffn_output_projections(model) -> list[str]:
    """Names of the MatMul nodes of an ONNX ``model`` that read an activation function's output
    (``FFN_ACTIVATIONS``): in a transformer, each block's feed-forward output projection."""
    activations = {output for node in model.graph.node if node.op_type in FFN_ACTIVATIONS for output in node.output}
    return [node.name for node in model.graph.node if node.op_type == "MatMul" and activations & set(node.input)]


def saved_tokenizer(directory: Path, max_length: int | None = None) -> tuple[Any, int]:
    """A student folder's tokenizer and the max length to featurize with: ``max_length``, else the saved one."""
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
    saved = tokenizer.model_max_length  # what RelevanceStudent.save writes; else transformers' huge int
    return tokenizer, max_length or (saved if saved < 1_000_000 else DEFAULT_MAX_LENGTH)


class GraphStudent:
    """A saved student served by a graph backend (student.graph_runtimes.BACKENDS: onnxruntime or OpenVINO, fp32 or
    int8); the tokenizer comes from the same folder.

    ``device`` (``cpu``, ``cuda:N``) picks onnxruntime's execution provider (OpenVINO runs on the CPU); ``threads``
    sets the runtime's intra-op threads (None: its default, one per physical core) and ``graph_optimization``
    onnxruntime's graph optimization level (a key of student.graph_runtimes.GRAPH_OPTIMIZATIONS)."""

    def __init__(
        self,
        directory: str | Path,
        backend: str = "onnx",
        max_length: int | None = None,
        threads: int | None = None,
        graph_optimization: str = "all",
        device: str = "cpu",
    ) -> None:
        directory = Path(directory)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        graph = graph_file(directory, BACKENDS[backend][1])
        self.backend = backend
        self.runner = graph_runner(graph, backend, device, threads, graph_optimization)
        self.input_names, self.num_grades = self.runner.input_names, self.runner.num_grades
        self.groups = groups_of(self.input_names)
        self.tokenizer, self.max_length = saved_tokenizer(directory, max_length)

    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Grade probabilities [N, grades] for each (query, ad), in input order (``bucketed_proba``)."""
        return bucketed_proba(
            featurize(self.tokenizer, self.groups, queries, ads, self.max_length),
            batch_size,
            self.num_grades,
            self.runner.run,
        )

    def predict(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The most probable grade of each (query, ad)."""
        return self.predict_proba(queries, ads, batch_size).argmax(1)
