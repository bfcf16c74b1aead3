"""The student folder documents itself: a Hugging Face model card (README.md) with its gold test metrics beside
the baselines', intended use and limitations, and the folder still loads as a student and as a CrossEncoder."""

import json

import numpy as np

from pipelines.ads.serving.student_model import write_model_readme
from student.model import RelevanceStudent, StudentConfig

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony", "garden hose 20 m"] * 20


def test_the_model_card_names_metrics_beside_baselines_and_the_folder_still_loads(tmp_path):
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, max_length=40), texts=TEXTS)
    folder = student.save(tmp_path / "student" / "model")
    (tmp_path / "student" / "distil.json").write_text(json.dumps({"label_source": "gold+teacher"}))
    metrics = {"accuracy": 0.61, "macro_f1": 0.52, "pairs_per_s": 812.4}
    path = write_model_readme(folder, metrics, {"lexical": {"accuracy": 0.5, "macro_f1": 0.41}})
    card = path.read_text()
    assert path == folder / "README.md" and card.startswith("---\npipeline_tag: text-classification\n")
    for section in ("## Training", "## Gold test metrics", "## Intended use", "## Limitations"):
        assert section in card, section
    assert "| macro_f1 | 0.5200 | 0.4100 |" in card and "gold+teacher" in card
    assert "| pairs_per_s |" not in card and "812 pairs/s" in card  # a speed, not in the quality table
    loaded = RelevanceStudent.load(folder)
    queries, ads = ["red shoes", "phone case"], ["nike shoes", "garden hose"]
    assert np.allclose(loaded.predict_proba(queries, ads), student.predict_proba(queries, ads), atol=1e-6)
    from sentence_transformers import CrossEncoder

    assert CrossEncoder(str(folder), device="cpu").predict([("red shoes", "nike shoes")]).shape[0] == 1
