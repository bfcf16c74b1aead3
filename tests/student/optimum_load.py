"""Run by tests/student/test_interchange_optimum.py inside .venv-optimum (transformers 4, sentence-transformers 5,
Optimum): load a student folder as its model card says, told nothing more: through sentence-transformers' ONNX
backend, with its default torch backend and with Optimum's ORTModel class, and print the ONNX answers, and every
warning and log record the loads gave, as JSON.

    python optimum_load.py FOLDER cross|sentence QUERIES_AND_ADS_JSON
"""

import json
import logging
import sys
import warnings

import transformers
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTModelForSequenceClassification
from sentence_transformers import CrossEncoder, SentenceTransformer

folder, reading, pairs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])


class Kept(logging.Handler):
    """Every record of WARNING and above, kept to print."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


kept = Kept()
logging.getLogger().addHandler(kept)  # sentence-transformers' and Optimum's loggers propagate to the root
transformers.logging.add_handler(kept)  # transformers' does not
loader = CrossEncoder if reading == "cross" else SentenceTransformer
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    model = loader(folder, backend="onnx", device="cpu")  # finds the folder's model.onnx among its graphs
    loader(folder, device="cpu")  # the torch backend: what the folder is, loaded as it is
    (ORTModelForSequenceClassification if reading == "cross" else ORTModelForFeatureExtraction).from_pretrained(folder)
if reading == "cross":
    answer = model.predict([tuple(pair) for pair in pairs]).tolist()
else:
    answer = model.encode([text for pair in pairs for text in pair]).tolist()
print(
    json.dumps(
        {
            "loader": type(model[0].auto_model).__name__ if reading != "cross" else type(model.model).__name__,
            "answer": answer,
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught] + kept.messages,
        }
    )
)
