"""The student folder documents itself: a Hugging Face model card (README.md) with its gold test metrics beside
the baselines', intended use and limitations, and the folder still loads as a student and as a CrossEncoder."""

import json

import numpy as np

from pipelines.ads.serving.student_model import write_model_readme
from student.model import RelevanceStudent, StudentConfig

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose 20 m"] * 20


def first_lines(card: str) -> str:
    """The card's first five lines after its front matter: what a reader sees first."""
    return "\n".join(card.split("\n---\n", 1)[1].strip().splitlines()[:5])


def test_the_model_card_names_metrics_beside_baselines_and_the_folder_still_loads(tmp_path):
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=40), texts=TEXTS)
    folder = student.save(tmp_path / "student" / "model")
    (tmp_path / "student" / "distil.json").write_text(json.dumps({"label_source": "gold+teacher"}))
    metrics = {"accuracy": 0.61, "macro_f1": 0.52, "pairs_per_s": 812.4}
    path = write_model_readme(folder, metrics, {"lexical": {"accuracy": 0.5, "macro_f1": 0.41}})
    card = path.read_text()
    assert path == folder / "README.md" and card.startswith("---\n")
    for section in ("## Training", "## Gold test metrics", "## Intended use", "## How to load", "## Limitations"):
        assert section in card, section
    assert "| macro_f1 | 0.5200 | 0.4100 |" in card and "gold+teacher" in card
    assert "Loads as: `CrossEncoder(folder)`" in first_lines(card)  # a cross student: the class that loads it
    assert "| pairs_per_s |" not in card and "812 pairs/s" in card  # a speed, not in the quality table
    loaded = RelevanceStudent.load(folder)
    queries, ads = ["red shoes", "phone case"], ["nike shoes", "garden hose"]
    assert np.allclose(loaded.predict_proba(queries, ads), student.predict_proba(queries, ads), atol=1e-6)
    from huggingface_hub import ModelCard
    from sentence_transformers import CrossEncoder

    data = ModelCard.load(path).data  # the front matter, read back as the Hub reads it
    assert data.pipeline_tag == "text-classification" and data.library_name == "transformers"
    assert data.license == "apache-2.0" and "ads-relevance" in data.tags and data.base_model is None  # tiny
    figures = {(r.dataset_name, r.metric_type): r.metric_value for r in data.eval_results}
    assert figures == {("gold test pairs", "accuracy"): 0.61, ("gold test pairs", "macro_f1"): 0.52}  # no speed

    assert CrossEncoder(str(folder), device="cpu").predict([("red shoes", "nike shoes")]).shape[0] == 1


def test_a_student_grown_from_a_packaged_encoder_names_it_as_its_base_model(tmp_path):
    from huggingface_hub import ModelCard

    student = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", kind="bi"))
    folder = student.save(tmp_path / "student" / "model")
    path = write_model_readme(folder, {"roc_auc_relevant": 0.9}, {})
    data = ModelCard.load(path).data
    assert data.base_model == "sentence-transformers/all-MiniLM-L6-v2"
    assert data.library_name == "sentence-transformers" and data.pipeline_tag == "sentence-similarity"  # an encoder
    assert "Loads as: `SentenceTransformer(folder)`" in first_lines(path.read_text())  # not CrossEncoder's conversion
