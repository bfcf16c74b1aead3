"""Any saved relevance model folder back as a predictor (``predict_proba(queries, ads, batch_size)`` ->
[N, grades]): a student of any kind (torch, or its ONNX graph), or a baseline saved as its own kind of model
(evaluation.baseline_registry: the lexical matcher, BM25; the zero-shot encoder is a bi student already). The kind
is read from the folder's ``config.json`` (``student_kind``), so every reader (evaluate, score, serve) loads
alike."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from compute.placement import ON_CPU, Placement
from evaluation.baseline_registry import saved_baseline


class Predictor(Protocol):
    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = ...) -> np.ndarray: ...


def model_kind(folder: str | Path) -> str:
    """The ``student_kind`` of a saved model folder (cross when its config.json names none)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {folder}: not a saved student or baseline model folder")
    return json.loads(path.read_text(encoding="utf-8")).get("student_kind", "cross")


def load_predictor(
    folder: str | Path,
    backend: str = "torch",
    max_length: int | None = None,
    threads: int | None = None,
    placement: Placement = ON_CPU,
) -> Predictor:
    """The model saved in ``folder``: a baseline saved as its own kind by its ``load`` (it has no graph backend); a
    student with torch, or with a graph backend (student.graph_runtimes.BACKENDS: onnxruntime or OpenVINO, fp32 or
    int8) its graph, on ``placement``'s device (default: the CPU; a graph runs as exported, whatever the autocast
    dtype); ``auto``: the backend evaluation.backend_choice picks for the folder on this machine. The predictor's
    ``backend`` says which ran."""
    baseline = saved_baseline(folder)
    if baseline is not None:
        return baseline.load(Path(folder))
    if backend == "auto":
        from evaluation.backend_choice import auto_backend

        backend = auto_backend(folder)
    if backend != "torch":
        from student.export import GraphStudent

        return GraphStudent(folder, backend, max_length=max_length, threads=threads, device=placement.device)
    from student.model import RelevanceStudent

    return RelevanceStudent.load(folder, max_length=max_length).place(placement)


def backend_of(predictor: Predictor) -> str:
    """The backend a loaded predictor runs on: a graph's or a baseline's own (its ``backend``: ``scikit-learn`` for
    the lexical matcher), ``torch`` for a torch student."""
    return getattr(predictor, "backend", "torch")
