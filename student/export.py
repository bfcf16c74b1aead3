"""ONNX export of a student and an onnxruntime predictor with the same ``predict_proba`` / ``predict`` API.

The exported graph maps the tokenizer's tensors (``input_ids``, ``attention_mask`` and, for BERT-style
models, ``token_type_ids``; batch and sequence length dynamic) to grade probabilities, softmax included.
It is traced with torch's dynamo exporter (``torch.onnx.export(..., dynamo=True)``). ``OnnxStudent``
runs it on onnxruntime's CPU provider with the student's own tokenizer from the same folder, so a served
model is one directory: ``save_pretrained`` files plus ``model.onnx``.

Parity: probabilities from onnxruntime match the torch student's within ``PARITY_ATOL`` (absolute,
per probability), checked by the tests on padded batches of mixed lengths.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer

from student.model import DEFAULT_MAX_LENGTH, RelevanceStudent, batched_proba

ONNX_FILE = "model.onnx"
PARITY_ATOL = 1e-5


class _Probabilities(torch.nn.Module):
    """The student's forward with named tensor inputs and softmax probabilities out (what ONNX serves)."""

    def __init__(self, model: torch.nn.Module, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.input_names = model, list(input_names)

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.model(**dict(zip(self.input_names, tensors, strict=True))).logits, -1)


def export_onnx(student: RelevanceStudent, directory: str | Path) -> Path:
    """Write ``directory/model.onnx`` for ``student`` (in eval mode); returns its path."""
    path = Path(directory) / ONNX_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    example = student.encode(["example query"], ["an example ad title"])
    names = [name for name in student.tokenizer.model_input_names if name in example]
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length", max=student.max_length)
    was_training = student.model.training
    student.model.eval()
    try:
        exporter_log = logging.getLogger("torch.onnx")  # it warns about absent torchvision ops we never use
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)
        with warnings.catch_warnings():  # the exporter's deprecation chatter is not the user's concern
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Probabilities(student.model, names),
                tuple(example[name] for name in names),
                str(path.with_suffix(".tmp")),
                dynamo=True,
                input_names=names,
                output_names=["probabilities"],
                dynamic_shapes=(tuple({0: batch, 1: length} for _ in names),),  # one entry: the *tensors tuple
                external_data=False,
                verbose=False,
            )
    finally:
        exporter_log.setLevel(level)
        student.model.train(was_training)
    path.with_suffix(".tmp").replace(path)
    return path


class OnnxStudent:
    """A saved student served by onnxruntime (CPU); the tokenizer comes from the same folder."""

    def __init__(self, directory: str | Path, max_length: int | None = None, threads: int | None = None) -> None:
        import onnxruntime  # imported here: training and evaluation do not need it

        directory = Path(directory)
        if not (directory / ONNX_FILE).is_file():
            raise FileNotFoundError(f"no {ONNX_FILE} in {directory}; export it with student.export.export_onnx")
        options = onnxruntime.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = onnxruntime.InferenceSession(
            str(directory / ONNX_FILE), options, providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.num_grades = int(self.session.get_outputs()[0].shape[-1])
        self.tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
        saved = self.tokenizer.model_max_length  # what RelevanceStudent.save writes; else transformers' huge int
        self.max_length = max_length or (saved if saved < 1_000_000 else DEFAULT_MAX_LENGTH)

    def _proba(self, queries: Sequence[str], ads: Sequence[str]) -> np.ndarray:
        batch = self.tokenizer(
            list(queries), list(ads), truncation=True, max_length=self.max_length, padding=True, return_tensors="np"
        )
        return self.session.run(None, {name: batch[name].astype(np.int64) for name in self.input_names})[0]

    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Grade probabilities [N, grades] for each (query, ad), in input order."""
        return batched_proba(queries, ads, batch_size, self.num_grades, self._proba)

    def predict(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The most probable grade of each (query, ad)."""
        return self.predict_proba(queries, ads, batch_size).argmax(1)
