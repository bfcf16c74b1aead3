"""Run by tests/student/test_interchange_optimum.py inside .venv-optimum (transformers 4, sentence-transformers 5,
Optimum): load a student folder through sentence-transformers' ONNX backend, as its model card says (the graph named:
``file_name``), and with its default torch backend, and print the ONNX answers, and every warning and log record
both loads gave, as JSON.

    python optimum_load.py FOLDER cross|sentence QUERIES_AND_ADS_JSON ONNX_FILE
"""

import json
import logging
import sys
import warnings

import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer

folder, reading, pairs, onnx_file = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]


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
    model = loader(folder, backend="onnx", device="cpu", model_kwargs={"file_name": onnx_file})
    loader(folder, device="cpu")  # the torch backend: what the folder is, loaded as it is
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
