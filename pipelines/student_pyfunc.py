"""The served student: an MLflow ``python_function`` model that runs the student's ``model.onnx`` with its
own tokenizer, logged as *code* (MLflow 3's models-from-code: this file is copied into the model and run
at load time, ``mlflow.models.set_model`` at the bottom names the model), so loading it needs neither
this repository nor torch, only ``pipelines.student_model.REQUIREMENTS``.

``predict(DataFrame[query, ad_title])`` -> ``DataFrame[grade, label, p_0 .. p_{K-1}]``: the most probable
grade, its name (the config's ``id2label``) and the grade probabilities. It tokenises as
``student.export.OnnxStudent`` does (pair, truncation at the saved ``model_max_length``, padding, int64)
and is checked against it and against the torch student by tests/pipelines/test_student_model.py, so the
two copies cannot drift apart unseen.

``StudentPyfunc`` subclasses ``mlflow.pyfunc.PythonModel``: like HF's ``LogitsProcessor``, a framework
hook that has to be a subclass, and the only one here.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd

BATCH = 256


class StudentPyfunc(mlflow.pyfunc.PythonModel):
    """The ONNX student behind MLflow's pyfunc API; ``context.artifacts["student"]`` is its folder."""

    def load_context(self, context) -> None:
        import onnxruntime
        from transformers import AutoTokenizer

        folder = Path(context.artifacts["student"])
        if not (folder / "model.onnx").is_file():
            raise FileNotFoundError(f"no model.onnx in {folder}: register a student exported by agpo distil")
        self.session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False, local_files_only=True)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.names = {int(k): v for k, v in config.get("id2label", {}).items()}
        self.max_length = self.tokenizer.model_max_length

    def probabilities(self, queries: list[str], ads: list[str]) -> np.ndarray:
        batch = self.tokenizer(
            queries, ads, truncation=True, max_length=self.max_length, padding=True, return_tensors="np"
        )
        return self.session.run(None, {name: batch[name].astype(np.int64) for name in self.input_names})[0]

    def predict(self, context, model_input, params=None) -> pd.DataFrame:
        frame = pd.DataFrame(model_input)
        queries, ads = frame["query"].astype(str).tolist(), frame["ad_title"].astype(str).tolist()
        parts = [self.probabilities(queries[i : i + BATCH], ads[i : i + BATCH]) for i in range(0, len(queries), BATCH)]
        probs = np.concatenate(parts) if parts else np.zeros((0, len(self.names)), dtype=np.float32)
        grades = probs.argmax(1)
        out = pd.DataFrame(
            {"grade": grades.astype(np.int64), "label": [self.names.get(int(g), str(g)) for g in grades]}
        )
        for k in range(probs.shape[1]):
            out[f"p_{k}"] = probs[:, k].astype(np.float32)
        return out


mlflow.models.set_model(StudentPyfunc())
