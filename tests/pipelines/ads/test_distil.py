"""`agpo distil` then `agpo evaluate` end to end on a small teacher's labels: model, ONNX, checkpoints,
metrics on gold test pairs, plots; a rerun is a no-op that writes the same model."""

import json

import numpy as np
import pytest
from safetensors.torch import load_file

from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.distillation.distil import DistilConfig
from pipelines.ads.distillation.distil import run as distil
from pipelines.ads.distillation.evaluate import EvaluateConfig
from pipelines.ads.distillation.evaluate import run as evaluate
from pipelines.config import load_config

pytestmark = pytest.mark.integration


def distil_config(small_teacher, out_dir, source: str, *extra: str) -> DistilConfig:
    """The distil config of ``source`` on the small teacher's labels (annotated once per module)."""
    work, pairs, teacher = small_teacher
    labels = work / "annotate-for-distil"
    if not (labels / "summary.json").exists():
        gold = f"gold={work}/data/unlabeled_gold.parquet"
        sets = [f"teacher={teacher}", f"input.path={pairs}", f"out_dir={labels}", gold, "voting.votes=2"]
        annotate(load_config(AnnotateConfig, [], sets))
    sets = [f"labels={labels}/labels", f"pairs={pairs}", f"gold={work}/data/unlabeled_gold.parquet"]
    return load_config(DistilConfig, [], [*sets, f"out_dir={out_dir}", f"label_source={source}", *extra])


@pytest.mark.parametrize(
    ("source", "by_source"), [("teacher", {"teacher"}), ("gold", {"gold"}), ("train-gold", {"gold"})]
)
def test_each_label_source_trains_on_its_own_pairs(small_teacher, tmp_path, source, by_source):
    """The other label sources' training sets, at the least work (one epoch, no ONNX, no zero-shot floor): the
    whole stage and its evaluation run once, on gold+teacher, below."""
    least = ("training.epochs=1", "export_onnx=false", "zero_shot_floor=false")
    summary = json.loads(distil(distil_config(small_teacher, tmp_path, source, *least))["summary"].read_text())
    assert summary["label_source"] == source and summary["training_pairs"] > 0
    assert set(summary["training_pairs_by_source"]) == by_source, summary["training_pairs_by_source"]
    if source == "train-gold":  # the 300 gold-graded train pairs of the small set, no teacher labels
        assert summary["training_pairs"] == 300 and summary["training_pairs_by_source"] == {"gold": 300}


def test_distil_and_evaluate_stages_write_a_student_and_its_gold_test_metrics(small_teacher, tmp_path):
    source, pairs = "gold+teacher", small_teacher[1]
    config = distil_config(small_teacher, tmp_path, source, "training.epochs=2")
    paths = distil(config)
    summary = json.loads(paths["summary"].read_text())
    assert summary["label_source"] == source and summary["training_pairs"] > 0 and len(summary["history"]) == 2
    assert summary["resumed_from_epoch"] is None
    # the 300 gold train pairs and the teacher's labels of the unlabeled pairs
    by_source = summary["training_pairs_by_source"]
    assert by_source["gold"] == 300 and by_source["teacher"] == summary["training_pairs"] - 300
    assert summary["shipped"] in ("student", "zero-shot") and summary["zero_shot_floor"]["checked"]
    assert (paths["model"] / "student.onnx").stat().st_size > 0
    weights = load_file(paths["model"] / "model.safetensors")
    assert distil(config)["model"] == paths["model"]  # rerun: resumes the finished checkpoint, trains nothing
    rerun = load_file(paths["model"] / "model.safetensors")
    assert all(np.array_equal(weights[k].numpy(), rerun[k].numpy()) for k in weights)
    assert json.loads(paths["summary"].read_text())["resumed_from_epoch"] == 2  # the rerun's seconds are a reload

    scored = {}
    for backend in ("torch", "onnx"):
        sets = [f"model={paths['model']}", f"pairs={pairs}", f"out_dir={tmp_path}/eval-{backend}", f"backend={backend}"]
        report = evaluate(load_config(EvaluateConfig, [], sets))
        scored[backend] = json.loads(report["metrics"].read_text())
        assert all(report[plot].stat().st_size > 0 for plot in ("confusion", "reliability", "ranking"))
    test = scored["torch"]
    assert test["pairs"] == 40 and sum(map(sum, test["confusion_gold_by_predicted"])) == 40
    baselines = {name: test["models"][name] for name in ("zero_shot", "lexical")}  # fitted on the gold train pairs
    assert test["baselines_fitted_on"] == 300 and all(b["pairs"] == 40 for b in baselines.values())
    figures = ", ".join(f"{name} {b['macro_f1']:.3f}" for name, b in baselines.items())
    print(f"{source}: student ({summary['shipped']}) macro-F1 {test['macro_f1']:.3f}; {figures}")
    for key in ("accuracy", "macro_f1", "roc_auc_relevant", "pr_auc_relevant", "ndcg@10", "ece"):
        assert 0 <= test[key] <= 1, key
        # the served model scores the same; a 2-epoch student has near-tied scores, and a 1e-6 difference may
        # reorder a tie in a rank metric (probability parity itself is tested in tests/student/test_model.py)
        assert scored["onnx"][key] == pytest.approx(test[key], abs=0.03), key
