"""`agpo distil` end to end on a small teacher's labels: model, metrics on gold test pairs, plots."""

import json

import pytest

from pipelines.annotate import AnnotateConfig
from pipelines.annotate import run as annotate
from pipelines.config import load_config
from pipelines.distil_student import DistilConfig
from pipelines.distil_student import run as distil
from student.model import RelevanceStudent

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("source", ["teacher", "gold"])
def test_distil_stage_writes_a_student_and_its_gold_test_metrics(small_teacher, tmp_path, source):
    work, pairs, teacher = small_teacher
    labels = work / "annotate-for-distil"
    if not (labels / "summary.json").exists():
        gold = f"gold={work}/data/unlabeled_gold.parquet"
        sets = [f"teacher={teacher}", f"input.path={pairs}", f"out_dir={labels}", gold, "voting.votes=2"]
        annotate(load_config(AnnotateConfig, [], sets))
    config = load_config(
        DistilConfig,
        [],
        [f"labels={labels}/labels", f"pairs={pairs}", f"gold={work}/data/unlabeled_gold.parquet",
         f"out_dir={tmp_path}", f"label_source={source}", "distill.epochs=2"],
    )  # fmt: skip
    paths = distil(config)
    summary = json.loads(paths["metrics"].read_text())
    assert summary["label_source"] == source and summary["training_pairs"] > 0
    test = summary["test"]
    assert test["pairs"] == 40
    for key in ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece"):
        assert 0 <= test[key] <= 1, key
    assert sum(map(sum, test["confusion_gold_by_predicted"])) == 40
    assert paths["confusion"].stat().st_size > 0 and paths["reliability"].stat().st_size > 0
    probs = RelevanceStudent.load(paths["model"]).predict_proba(["red shoes"], ["nike shoes, red"])
    assert probs.shape == (1, 4)
