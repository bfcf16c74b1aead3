"""Run by tests/student/test_interchange_optimum.py inside .venv-optimum (transformers 4, sentence-transformers 5,
Optimum): load a student folder through sentence-transformers' ONNX backend and print its answers as JSON.

    python optimum_load.py FOLDER cross|sentence QUERIES_AND_ADS_JSON
"""

import json
import sys
import warnings

from sentence_transformers import CrossEncoder, SentenceTransformer

warnings.simplefilter("ignore")  # the loaders' version chatter is not what the test reads
folder, reading, pairs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if reading == "cross":
    model = CrossEncoder(folder, backend="onnx", device="cpu")
    answer = model.predict([tuple(pair) for pair in pairs]).tolist()
else:
    model = SentenceTransformer(folder, backend="onnx", device="cpu")
    answer = model.encode([text for pair in pairs for text in pair]).tolist()
print(
    json.dumps(
        {
            "loader": type(model[0].auto_model).__name__ if reading != "cross" else type(model.model).__name__,
            "answer": answer,
        }
    )
)
