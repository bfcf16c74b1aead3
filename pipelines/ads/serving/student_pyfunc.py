"""The served student: an MLflow ``python_function`` model that runs the student's graph with its own tokenizer,
logged as *code* (MLflow 3's models-from-code: this file is copied into the model and run at load time,
``mlflow.models.set_model`` at the bottom names the model), so loading it needs neither this repository nor torch,
only ``pipelines.ads.serving.student_model.REQUIREMENTS`` (and openvino for an OpenVINO backend).

``predict(DataFrame[query, ad_title])`` -> ``DataFrame[grade, label, p_0 .. p_{K-1}]``: the most probable
grade, its name (the config's ``id2label``) and the grade probabilities. It featurizes with
``student/pair_features.py`` itself, logged beside this file as code (``code_paths``: importable as
``pair_features``), building the groups the graph's input names ask for (pair, query, ad: any student
kind), so it tokenizes exactly as ``student.export.GraphStudent`` and the torch student do;
tests/pipelines/test_student_model.py checks the three against each other. A folder whose config.json names a
baseline saved as its own kind (``evaluation/baseline_registry.py``: the lexical matcher, BM25; logged with its
modules as the packages ``evaluation``, ``student`` and ``compute``) predicts with that baseline's ``load``, the same
probabilities ``agpo evaluate`` scored. The graph runs on the device
``AGPO_SERVE_DEVICE`` names (``cpu`` when unset; ``agpo serve`` sets it from its ``device`` key), on the backend
``AGPO_SERVE_BACKEND`` names (``onnx`` when unset: ``student.onnx`` on onnxruntime; ``agpo serve`` sets it from its
``backend`` key), with ``student/graph_runtimes.py``, logged beside this file as code too.

``StudentPyfunc`` subclasses ``mlflow.pyfunc.PythonModel``: like HF's ``LogitsProcessor``, a framework
hook that has to be a subclass, and the only one here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

BATCH = 256
DEVICE_ENV = "AGPO_SERVE_DEVICE"  # cpu or cuda:N: where onnxruntime runs the graph (agpo serve's device key)
BACKEND_ENV = "AGPO_SERVE_BACKEND"  # a key of graph_runtimes.BACKENDS (agpo serve's backend key, auto resolved)


class StudentPyfunc(mlflow.pyfunc.PythonModel):
    """The student's graph behind MLflow's pyfunc API; ``context.artifacts["student"]`` is its folder."""

    def load_context(self, context) -> None:
        folder = Path(context.artifacts["student"])
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.names = {int(k): v for k, v in config.get("id2label", {}).items()}
        baseline = saved_baseline(folder)
        if baseline is not None:  # a baseline saved as its own kind: no graph, no tokenizer
            self.matcher = baseline.load(folder)
            return
        self.matcher = None
        from graph_runtimes import BACKENDS, graph_runner  # logged beside this file (code_paths)
        from pair_features import graph_file, groups_of
        from transformers import AutoTokenizer

        backend = os.environ.get(BACKEND_ENV, "onnx")
        graph = graph_file(folder, BACKENDS[backend][1])
        self.runner = graph_runner(graph, backend, os.environ.get(DEVICE_ENV, "cpu"))
        self.groups = groups_of(self.runner.input_names)
        self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
        self.max_length = self.tokenizer.model_max_length

    def probabilities(self, queries: list[str], ads: list[str]) -> np.ndarray:
        if self.matcher is not None:
            return self.matcher.predict_proba(queries, ads, BATCH)
        from pair_features import bucketed_proba, featurize

        return bucketed_proba(
            featurize(self.tokenizer, self.groups, queries, ads, self.max_length),
            BATCH,
            len(self.names),
            self.runner.run,
        )

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)
        queries, ads = frame["query"].astype(str).tolist(), frame["ad_title"].astype(str).tolist()
        probs = self.probabilities(queries, ads)
        grades = probs.argmax(1)
        out = pd.DataFrame(
            {"grade": grades.astype(np.int64), "label": [self.names.get(int(g), str(g)) for g in grades]}
        )
        for k in range(probs.shape[1]):
            out[f"p_{k}"] = probs[:, k].astype(np.float32)
        return out


def saved_baseline(folder: Path):
    """The baseline class ``folder`` holds, when the package ``evaluation`` was logged with this file (only a
    baseline's model carries it: evaluation.baseline_registry); None for a student's graph."""
    if importlib.util.find_spec("evaluation") is None:
        return None
    from evaluation.baseline_registry import saved_baseline as registered  # logged beside this file (code_paths)

    return registered(folder)


mlflow.models.set_model(StudentPyfunc())
