"""`agpo evaluate` reports the lexical baseline beside the student: trained on the labels recorded in
distil.json (abstained pairs skipped), scored on the same gold pairs with the same metrics (fast: an
untrained tiny student, hand-written labels)."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from durable.fileio import sha256_file
from pipelines.ads.contracts import ContractError
from pipelines.ads.data import DataConfig
from pipelines.ads.data import run as prepare
from pipelines.ads.evaluate import EvaluateConfig, LexicalBaselineConfig
from pipelines.ads.evaluate import run as evaluate
from pipelines.ads.synthetic import SyntheticConfig
from student.model import RelevanceStudent, StudentConfig


@pytest.fixture(scope="module")
def student_run(tmp_path_factory):
    """Pairs, teacher-like labels (the hidden gold, every fifth pair abstained) and an untrained student."""
    work = tmp_path_factory.mktemp("evaluate")
    synthetic = SyntheticConfig(train=40, audit=20, unlabeled=200, test=60)
    paths = prepare(DataConfig(out_dir=str(work / "data"), synthetic=synthetic))
    gold = pq.read_table(paths["unlabeled_gold"]).to_pylist()
    rows = [
        {
            "pair_id": r["pair_id"],
            "grade": None if i % 5 == 0 else r["gold_grade"],
            "votes": [int(g == r["gold_grade"]) * 2 for g in range(4)],
            "confidence": 1.0,
        }
        for i, r in enumerate(gold)
    ]
    (work / "labels").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), work / "labels" / "part-00000.parquet")
    merged = {"files": {"labels/part-00000.parquet": sha256_file(work / "labels" / "part-00000.parquet")}}
    (work / "summary.json").write_text(json.dumps(merged))  # as an annotation run's merge records them
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=["red shoes", "lamp"] * 20)
    student.save(work / "student" / "model")
    summary = {"label_source": "teacher", "labels": str(work / "labels")}
    (work / "student" / "distil.json").write_text(json.dumps(summary))
    return work, paths["pairs"], sum(r["grade"] is not None for r in rows)


def test_metrics_json_holds_the_lexical_baseline_beside_the_student(student_run, tmp_path):
    work, pairs, usable = student_run
    config = EvaluateConfig(model=str(work / "student" / "model"), pairs=str(pairs), out_dir=str(tmp_path))
    paths = evaluate(config)
    report = json.loads(paths["metrics"].read_text())
    lexical = report["lexical_baseline"]
    assert lexical["label_source"] == "teacher" and lexical["training_pairs"] == usable
    assert lexical["pairs"] == report["pairs"] == 60
    for key in ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece"):
        assert 0 <= lexical[key] <= 1 and 0 <= report[key] <= 1, key
    # gold-quality labels: the baseline learns the easy part of the task; the untrained student cannot
    assert lexical["macro_f1"] > report["macro_f1"]
    table = paths["comparison"].read_text()
    assert "| lexical baseline |" in table and "| student - baseline |" in table


def test_the_baseline_can_be_switched_off_and_needs_to_know_the_labels(student_run, tmp_path):
    work, pairs, _ = student_run
    model = str(work / "student" / "model")
    off = EvaluateConfig(
        model=model,
        pairs=str(pairs),
        out_dir=str(tmp_path / "off"),
        lexical_baseline=LexicalBaselineConfig(enabled=False),
    )
    paths = evaluate(off)
    assert "lexical_baseline" not in json.loads(paths["metrics"].read_text()) and "comparison" not in paths
    moved = tmp_path / "elsewhere" / "model"  # a student folder with no distil.json beside it
    RelevanceStudent.load(model).save(moved)
    with pytest.raises(ContractError, match=r"lexical_baseline\.labels="):
        evaluate(EvaluateConfig(model=str(moved), pairs=str(pairs), out_dir=str(tmp_path / "x")))
