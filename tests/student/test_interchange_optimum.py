"""The exported student loads where a serving team of today loads ONNX models: sentence-transformers' ONNX
backend, which reads the root ``model.onnx`` through Optimum (``CrossEncoder(folder, backend="onnx")`` for a cross
student, ``SentenceTransformer(folder, backend="onnx")`` for a bi student), in .venv-optimum (`make venv-optimum`:
optimum-onnx pins transformers<4.58, so that venv also checks that a folder transformers 5 saved tokenizes the same
under transformers 4). Each answer is compared with the torch student's own, and each folder loads there (as the
model card says, told no file name; with the torch backend; with Optimum's ORTModel class) without a warning or a log
record: no unexpected keys, no choice between the folder's ONNX files left to the loader. Without the venv the test
skips, except in CI (CI=true), where it fails."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from student.export import export_onnx
from student.model import RelevanceStudent, StudentConfig

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-optimum" / "bin" / "python"
TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose green"] * 20
PAIRS = [("red shoes", "Nike running shoes, red"), ("iphone 15 case", "garden hose 20 m"), ("hose", "Green hose")]


def optimum_answer(folder: Path, reading: str) -> tuple[str, np.ndarray]:
    if not PYTHON.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{PYTHON} is missing: make venv-optimum")
        pytest.skip(f"{PYTHON} is missing: make venv-optimum")
    done = subprocess.run(
        [
            *(str(PYTHON), str(Path(__file__).with_name("optimum_load.py")), str(folder), reading),
            json.dumps(PAIRS),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["warnings"] == [], result["warnings"]  # e.g. unexpected classifier keys, two ONNX files
    return result["loader"], np.asarray(result["answer"])


@pytest.mark.parametrize("backbone", ["tiny", "all-minilm-l6-v2"])
def test_a_cross_student_loads_in_cross_encoder_onnx_and_answers_its_logits(backbone, tmp_path):
    student = RelevanceStudent.build(StudentConfig(kind="cross", backbone=backbone, tiny_hidden=32), texts=TEXTS)
    export_onnx(student, student.save(tmp_path), quantize=True)  # three graphs: the loaders must pick model.onnx
    loader, logits = optimum_answer(tmp_path, "cross")
    assert loader == "ORTModelForSequenceClassification"
    student.model.eval()
    with torch.no_grad():
        expected = student.logits(student.encode(*zip(*PAIRS, strict=True))).numpy()
    assert np.allclose(logits, expected, atol=1e-4)


@pytest.mark.parametrize(("kind", "backbone"), [("bi", "tiny"), ("bi", "all-minilm-l6-v2"), ("hybrid", "tiny")])
def test_a_bi_or_hybrid_student_loads_in_sentence_transformer_onnx_and_answers_its_embeddings(kind, backbone, tmp_path):
    student = RelevanceStudent.build(StudentConfig(kind=kind, backbone=backbone, tiny_hidden=32), texts=TEXTS)
    export_onnx(student, student.save(tmp_path), quantize=True)  # three graphs: the loaders must pick model.onnx
    loader, embeddings = optimum_answer(tmp_path, "sentence")
    assert loader == "ORTModelForFeatureExtraction"
    assert np.allclose(embeddings, student.embed([text for pair in PAIRS for text in pair]), atol=1e-4)
