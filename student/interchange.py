"""What other libraries load from a saved student folder, beside ``RelevanceStudent.load``.

- Every kind: ``tokenizer_config.json`` as transformers 4 reads it too (``portable_tokenizer_config``).
- A kind whose ``hf_task`` (student.kinds) is ``feature-extraction`` (bi, hybrid): the folder is also a
  sentence-transformers model (``write_sentence_transformers_files``: the encoder at the folder root, mean
  pooling, unit length), so ``SentenceTransformer(folder).encode`` gives the embeddings the student's cosine
  reads (``RelevanceStudent.embed``): a retrieval team precomputes ad embeddings from it.
- A kind whose ``hf_task`` is ``sequence-classification`` (cross): the folder already is a transformers
  sequence-classification model, which ``CrossEncoder(folder)`` loads; its ``predict`` answers grade logits.
- ``INTERCHANGE_ONNX`` (the root ``model.onnx``, written by ``student.export.export_onnx``): the graph of the kind's
  ``hf_task`` where sentence-transformers' ONNX backend and Optimum look first (``CrossEncoder(folder,
  backend="onnx")``, ``SentenceTransformer(folder, backend="onnx")``, ``ORTModelFor...``), so they load it without
  being told which of the folder's graphs to read: the tokenizer's input names in, ``logits`` or
  ``last_hidden_state`` out. The probability step stays outside it: softmax over a
  cross student's logits; for a bi student, pooling, the cosine of query and ad, and the ordinal head
  (student.ordinal, ``ordinal_head.safetensors``). ``student.onnx`` (student.pair_features.GRAPHS) is the whole student,
  probabilities out, for every kind: what ``agpo serve`` and the MLflow model run.

The model card names the library, the Hub's pipeline tag, the class that loads the folder and how to load it from
here too (``HF_LIBRARIES``, ``HF_PIPELINE_TAGS``, ``LOADS_AS``, ``HOW_TO_LOAD``). Folders saved before 2026-12-07
hold this graph as ``onnx/model.onnx`` (the loaders need ``model_kwargs={"file_name": "onnx/model.onnx"}`` there),
and folders saved before 2026-12-05 hold the probability graph as the root ``model.onnx``
(student.pair_features.LEGACY_GRAPH; the graph runners tell the two apart by their output's name).
Imports nothing heavy (JSON files only).
"""

from __future__ import annotations

import json
from pathlib import Path

INTERCHANGE_ONNX = "model.onnx"
# what a kind's hf_task graph answers (the output name the loaders read)
HF_OUTPUTS = {"sequence-classification": "logits", "feature-extraction": "last_hidden_state"}
# the library a folder loads in, by its kind's Hugging Face task (a model card's library_name)
HF_LIBRARIES = {"sequence-classification": "transformers", "feature-extraction": "sentence-transformers"}
# the Hub's pipeline tag of what the folder is, by its kind's Hugging Face task (a model card's pipeline_tag)
HF_PIPELINE_TAGS = {"sequence-classification": "text-classification", "feature-extraction": "sentence-similarity"}
# the class that loads the folder as what it is, by its kind's Hugging Face task: a model card's first lines
LOADS_AS = {
    "sequence-classification": "`CrossEncoder(folder)` of sentence-transformers (a transformers "
    "sequence-classification model: grade logits)",
    "feature-extraction": "`SentenceTransformer(folder)` (an embedding model; `CrossEncoder(folder)` would convert it "
    "into a new, untrained cross-encoder without a word)",
}
# the model card's section on loading the folder with those libraries, by the kind's Hugging Face task
HOW_TO_LOAD = {
    "sequence-classification": f"""## How to load

A transformers sequence-classification model (a cross-encoder): `CrossEncoder(folder)` of sentence-transformers,
or `CrossEncoder(folder, backend="onnx")` / Optimum's `ORTModelForSequenceClassification` for `{INTERCHANGE_ONNX}`.
Both answer grade logits: their softmax is the grade probabilities. `student.onnx` is the whole model with the
softmax inside, what `agpo serve` runs.
""",
    "feature-extraction": f"""## How to load

A sentence-transformers model: `SentenceTransformer(folder).encode(texts)` (or `backend="onnx"` for
`{INTERCHANGE_ONNX}`, token embeddings that the folder's mean pooling and normalization turn into sentence embeddings)
gives the embeddings whose query-ad cosine the student grades, so ad embeddings can be computed ahead of queries.
The grade probabilities: that cosine through `ordinal_head.safetensors` (the cumulative-logit head of
`student/ordinal.py`), plus, for a hybrid student, its pair logits (the classifier layers in the same file, on the
encoder's pair reading); or `student.onnx`, the whole model, what `agpo serve` runs.
""",
}
SENTENCE_MODULES = (
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
)
# transformers 5's name for a tokenizer read from tokenizer.json alone, and the class transformers 4 reads it as
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def portable_tokenizer_config(directory: Path) -> None:
    """Rewrite ``directory/tokenizer_config.json`` so transformers 4 tokenizes as transformers 5 does: a class it
    has (``PORTABLE_TOKENIZER_CLASSES``), and the byte-level pre-tokenizer's ``add_prefix_space`` stated (unstated,
    transformers 4 resets it to False, and "red" becomes another token than " red")."""
    config_file = directory / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    name = config.get("tokenizer_class")
    config["tokenizer_class"] = PORTABLE_TOKENIZER_CLASSES.get(name, name)
    pre_tokenizer = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer")
    if pre_tokenizer and "add_prefix_space" in pre_tokenizer:
        config["add_prefix_space"] = pre_tokenizer["add_prefix_space"]
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_sentence_transformers_files(directory: Path, hidden_size: int, max_length: int) -> None:
    """The files that make ``directory`` a sentence-transformers model: ``modules.json`` (``SENTENCE_MODULES``),
    ``sentence_bert_config.json``, ``config_sentence_transformers.json`` (cosine similarity), ``1_Pooling``
    (mean of the unmasked tokens) and ``2_Normalize``: ``RelevanceNet.embedding``'s reading of a text."""
    files = {
        "modules.json": list(SENTENCE_MODULES),
        "sentence_bert_config.json": {"max_seq_length": max_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"model_type": "SentenceTransformer", "similarity_fn_name": "cosine"},
        "1_Pooling/config.json": {"word_embedding_dimension": hidden_size, "pooling_mode_mean_tokens": True},
    }
    (directory / "2_Normalize").mkdir(exist_ok=True)
    for name, content in files.items():
        (directory / name).parent.mkdir(exist_ok=True)
        (directory / name).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
