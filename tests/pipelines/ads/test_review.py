"""`agpo review export` / `agpo review import` without a server: the Label Studio task format, a hand-written
Label Studio export read back as gold, the quality report's human agreement (Cohen's kappa by hand), and the
effect of human grades on distillation (they replace the teacher's label; gold_weight adds their term)."""

import json
import math
import xml.etree.ElementTree as ET

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from evaluation.metrics import cohen_kappa
from pipelines.ads.annotation.report import human_agreement
from pipelines.ads.annotation.review_export import GRADE_CHOICES, ReviewExportConfig, labeling_config
from pipelines.ads.annotation.review_export import run as review_export
from pipelines.ads.annotation.review_import import ReviewImportConfig
from pipelines.ads.annotation.review_import import run as review_import
from pipelines.ads.distillation.distil import DistilConfig, HumanGrades, label_columns, with_human_grades, with_text
from pipelines.ads.intake.contracts import ContractError
from pipelines.ads.teacher.labeling import REVIEW_SCHEMA
from pipelines.cli import main
from student.batches import pair_weights
from student.training import DistilTrainingConfig, distill_loss


def queue_row(pair_id, grade, confidence, answers=("<answer>1</answer>", "ok <answer>2</answer>")):
    return {
        "pair_id": pair_id,
        "query": f"query of {pair_id}",
        "ad_title": f"ad of {pair_id} <b>&",
        "grade": grade,
        "confidence": confidence,
        "abstained": grade is None,
        "teacher_answers": list(answers),
        "teacher_run_id": "run-7",
        "prompt_version": "v3",
    }


@pytest.fixture
def annotate_dir(tmp_path):
    """An annotation run's review queue in two shards, and its quality report."""
    out = tmp_path / "annotate"
    (out / "review").mkdir(parents=True)
    shards = [
        [queue_row("a", 1, 0.5), queue_row("b", None, 0.0, answers=("garbled", "?"))],
        [queue_row("c", 2, 0.25), queue_row("d", 3, 0.5)],
    ]
    for i, rows in enumerate(shards):
        pq.write_table(pa.Table.from_pylist(rows, schema=REVIEW_SCHEMA), out / "review" / f"shard-{i:05d}.parquet")
    (out / "quality_report.json").write_text(json.dumps({"review_rate": 0.2}))
    return out


def test_export_shows_reviewers_the_pair_only_by_default(annotate_dir, tmp_path):
    paths = review_export(ReviewExportConfig(review=str(annotate_dir / "review"), out_dir=str(tmp_path / "ls")))
    tasks = json.loads(paths["tasks"].read_text())
    assert [t["data"]["pair_id"] for t in tasks] == ["b", "c", "a", "d"]  # abstained, then by confidence
    assert tasks[1] == {
        "data": {"pair_id": "c", "query": "query of c", "ad_title": "ad of c <b>&", "teacher_shown": False},
        "predictions": [],  # nothing of the teacher: no grade to anchor the reviewer
    }
    view = ET.fromstring(paths["labeling_config"].read_text())
    choices = view.find("Choices")
    assert choices.get("name") == "grade" and choices.get("toName") == "ad" and choices.get("required") == "true"
    assert [c.get("value") for c in choices] == ["0 irrelevant", "1 complement", "2 substitute", "3 exact"]
    assert {t.get("name"): t.get("value") for t in view.iter("Text")} == {"query": "$query", "ad": "$ad_title"}
    assert "Teacher" not in paths["labeling_config"].read_text()
    assert json.loads(paths["summary"].read_text())["teacher_shown"] is False
    limited = review_export(
        ReviewExportConfig(review=str(annotate_dir / "review"), out_dir=str(tmp_path / "top"), limit=2)
    )
    assert len(json.loads(limited["tasks"].read_text())) == 2


def test_export_with_show_teacher_gives_its_answers_and_its_grade_as_prediction(annotate_dir, tmp_path):
    config = ReviewExportConfig(review=str(annotate_dir / "review"), out_dir=str(tmp_path / "ls"), show_teacher=True)
    paths = review_export(config)
    tasks = json.loads(paths["tasks"].read_text())
    c = tasks[1]
    assert c["data"]["query"] == "query of c" and c["data"]["ad_title"] == "ad of c <b>&"
    assert c["data"]["teacher_shown"] is True and c["data"]["teacher_grade"] == 2
    assert c["data"]["teacher_answers"] == "1. <answer>1</answer>\n2. ok <answer>2</answer>"
    assert c["predictions"] == [
        {
            "model_version": "run-7",
            "score": 0.25,
            "result": [
                {"from_name": "grade", "to_name": "ad", "type": "choices", "value": {"choices": ["2 substitute"]}}
            ],
        }
    ]
    assert tasks[0]["predictions"] == []  # abstained: no grade to pre-select
    view = ET.fromstring(paths["labeling_config"].read_text())
    assert {t.get("name"): t.get("value") for t in view.iter("Text")} == {
        "query": "$query",
        "ad": "$ad_title",
        "teacher_answers": "$teacher_answers",
    }


def annotation(grade, user=1, cancelled=False):
    value = {"choices": [GRADE_CHOICES[grade]]} if grade is not None else {"choices": []}
    result = [] if grade is None else [{"from_name": "grade", "to_name": "ad", "type": "choices", "value": value}]
    return {"id": 10 + user, "completed_by": user, "result": result, "was_cancelled": cancelled, "lead_time": 3.2}


def ls_task(task_id, pair_id, annotations, teacher_shown=False):
    """A task of Label Studio's JSON export, abridged."""
    data = {"pair_id": pair_id, "query": "q", "teacher_shown": teacher_shown}
    return {"id": task_id, "data": data, "annotations": annotations, "predictions": []}


def test_import_reads_a_label_studio_export_as_gold_and_scores_the_teacher(annotate_dir, tmp_path):
    export = tmp_path / "export.json"
    tasks = [
        ls_task(1, "a", [annotation(1)]),  # agrees with the teacher
        ls_task(2, "b", [annotation(0, user=1), annotation(2, user=2)]),  # teacher abstained; tie -> lower grade
        ls_task(3, "c", [annotation(3, user=1), annotation(1, user=2, cancelled=True)]),  # cancelled one ignored
        ls_task(4, "d", [annotation(1, user=1, cancelled=True)]),  # nothing left: unreviewed
    ]
    export.write_text(json.dumps(tasks))
    config = ReviewImportConfig(export=str(export), review=str(annotate_dir / "review"), out_dir=str(tmp_path / "g"))
    paths = review_import(config)
    gold = pq.read_table(paths["gold_labels"]).to_pylist()
    assert [(r["pair_id"], r["grade"], r["annotations"], r["annotators"], r["teacher_grade"]) for r in gold] == [
        ("a", 1, 1, ["1"], 1),
        ("b", 0, 2, ["1", "2"], None),
        ("c", 3, 1, ["1"], 2),
    ]
    summary = json.loads(paths["summary"].read_text())
    assert summary["reviewed"] == 3 and summary["unreviewed"] == 1
    agreement = summary["human_agreement"]
    assert agreement["accuracy"] == pytest.approx(1 / 3)  # abstained counts as wrong
    assert agreement["abstained"] == 1
    assert summary["agreement_tasks"]["counted"] == 3 and summary["agreement_tasks"]["left_out_teacher_shown"] == 0
    report = json.loads((annotate_dir / "quality_report.json").read_text())
    assert report["review_rate"] == 0.2 and report["human_agreement"] == agreement

    tasks[0]["annotations"][0]["result"][0]["value"]["choices"] = ["very relevant"]
    export.write_text(json.dumps(tasks))
    with pytest.raises(ContractError, match="task 1: grade choice"):
        review_import(config)
    export.write_text(json.dumps([ls_task(9, "zz", [annotation(2)])]))
    with pytest.raises(ContractError, match="'zz' is not in the review queue"):
        review_import(config)
    export.write_text(json.dumps([{"pair_id": "a", "grade": "1 complement"}]))  # JSON_MIN
    with pytest.raises(ContractError, match="JSON format"):
        review_import(config)


def test_the_agreement_counts_only_tasks_exported_without_the_teachers_grade(annotate_dir, tmp_path, capsys):
    export = tmp_path / "export.json"
    tasks = [
        ls_task(1, "a", [annotation(1)], teacher_shown=True),  # kept the pre-selected grade: left out
        ls_task(2, "c", [annotation(3)]),  # blind, disagrees with the teacher's 2
        ls_task(3, "d", [annotation(3)]),  # blind, agrees with the teacher's 3
        {**ls_task(4, "b", [annotation(0)]), "data": {"pair_id": "b"}},  # an older export: it pre-selected
    ]
    export.write_text(json.dumps(tasks))
    config = ReviewImportConfig(export=str(export), review=str(annotate_dir / "review"), out_dir=str(tmp_path / "g"))
    paths = review_import(config)
    gold = {r["pair_id"]: r["teacher_shown"] for r in pq.read_table(paths["gold_labels"]).to_pylist()}
    assert gold == {"a": True, "c": False, "d": False, "b": True}  # every human grade is gold either way
    summary = json.loads(paths["summary"].read_text())
    assert summary["agreement_tasks"]["counted"] == 2 and summary["agreement_tasks"]["left_out_teacher_shown"] == 2
    assert summary["human_agreement"]["accuracy"] == pytest.approx(0.5)
    assert "on 2 tasks without its grade shown 0.500" in capsys.readouterr().out
    export.write_text(json.dumps(tasks[:1]))
    summary = json.loads(review_import(config)["summary"].read_text())
    assert "human_agreement" not in summary
    assert "no teacher agreement: all 1 graded tasks showed the teacher's grade" in capsys.readouterr().out


def test_cohen_kappa_and_human_agreement_match_hand_values():
    human, teacher = [0, 1, 2, 3, 3, 2], [0, 1, 2, 2, 3, 1]
    # p_o = 4/6; marginals human (1, 1, 2, 2), teacher (1, 2, 2, 1): p_e = 9/36; kappa = (2/3 - 1/4) / (3/4) = 5/9
    assert cohen_kappa(y_true=human, y_pred=teacher) == pytest.approx(5 / 9)
    agreement = human_agreement(human=[*human, 1], teacher=[*teacher, None], num_grades=4)
    assert agreement["accuracy"] == pytest.approx(4 / 7) and agreement["abstained"] == 1
    assert agreement["cohen_kappa"] == pytest.approx(5 / 9)  # over the pairs the teacher graded
    assert agreement["confusion_human_by_teacher"][3] == [0, 0, 1, 1]
    assert cohen_kappa(y_true=[2, 2], y_pred=[2, 2]) is None  # chance agreement 1: undefined
    with pytest.raises(ValueError, match="y_pred has grade 4"):
        cohen_kappa(y_true=[0], y_pred=[4])


def human_graded(teacher: list[dict], review_gold, text: dict[str, dict]) -> list[dict]:
    """The distil stage's training rows of ``teacher``'s label rows after ``review_gold``'s human grades."""
    pairs = pa.Table.from_pylist([{"pair_id": p, **t} for p, t in text.items()])
    labeled = with_text(label_columns(pa.Table.from_pylist(teacher), "teacher"), pairs, "the pairs file")
    return with_human_grades(labeled, HumanGrades.read(str(review_gold), pairs), 4).to_pylist()


def test_human_grades_replace_teacher_labels_and_gold_weight_scales_their_term(tmp_path):
    text = {p: {"query": "q", "ad_title": p} for p in ("a", "b", "c")}
    teacher = [
        {"pair_id": "a", "grade": 1, "confidence": 0.5, "votes": [0, 2, 2, 0]},
        {"pair_id": "b", "grade": None, "confidence": 0.0, "votes": [0, 0, 0, 0]},
        {"pair_id": "c", "grade": 3, "confidence": 1.0, "votes": [0, 0, 0, 4]},
    ]
    gold = tmp_path / "gold_labels.parquet"
    pq.write_table(pa.table({"pair_id": ["a", "b"], "grade": pa.array([2, 0], pa.int8())}), gold)
    rows = human_graded(teacher, gold, text)
    human = {"pair_id": "a", "grade": 2, "confidence": 1.0, "votes": [0, 0, 1, 0], "gold_grade": 2, "source": "human"}
    assert rows[0] == human | {"grade_probs": None, "query": "q", "ad_title": "a"}
    assert rows[1]["grade"] == 0 and rows[1]["gold_grade"] == 0  # an abstained pair becomes usable
    assert rows[2] == teacher[2] | {
        "grade_probs": None,
        "gold_grade": None,
        "source": "teacher",
        "query": "q",
        "ad_title": "c",
    }

    logits = torch.tensor([[0.1, 0.2, 0.3, 0.4], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]])
    votes = torch.tensor([r["votes"] for r in rows])
    grades = torch.tensor([r["grade"] for r in rows])
    gold_grades = torch.tensor([-1 if r["gold_grade"] is None else r["gold_grade"] for r in rows])
    weights = torch.tensor(pair_weights(rows, True))
    assert weights.tolist() == [1.0, 1.0, 1.0]

    def loss(gold_weight):
        config = DistilTrainingConfig(gold_weight=gold_weight)
        return distill_loss(logits, votes, grades, weights, config, gold=gold_grades).item()

    ce = torch.nn.functional.cross_entropy(logits[:2], torch.tensor([2, 0]), reduction="sum").item()
    assert loss(2.0) - loss(0.0) == pytest.approx(2.0 * ce / 3, rel=1e-5)  # only the human-graded pairs add it
    assert math.isfinite(loss(0.0))

    missing = tmp_path / "other.parquet"
    pq.write_table(pa.table({"pair_id": ["zz"], "grade": pa.array([1], pa.int8())}), missing)
    with pytest.raises(ContractError, match="not in the pairs file"):
        human_graded(teacher, missing, text)
    with pytest.raises(ValueError, match=r"needs label_source in \['gold\+teacher', 'teacher'\]"):
        DistilConfig(label_source="gold", review_gold=str(gold))


def test_a_human_grade_also_replaces_the_labels_of_the_reviewed_pairs_copies(tmp_path):
    # annotation's dedup queues one row per distinct (query, ad text): its copies must follow the human grade
    text = {
        "a": {"query": "red shoes", "ad_title": "Nike Air"},
        "a-copy": {"query": "Red  Shoes", "ad_title": "nike air"},
        "b": {"query": "lamp", "ad_title": "Desk lamp"},
        "b-copy": {"query": "lamp", "ad_title": "desk LAMP"},
        "b-copy2": {"query": "LAMP", "ad_title": "desk lamp "},
        "c": {"query": "lamp", "ad_title": "Garden hose"},
    }
    teacher = [{"pair_id": p, "grade": 3, "confidence": 0.9, "votes": [0, 0, 0, 4]} for p in text]
    gold = tmp_path / "gold_labels.parquet"
    graded = {"a": 1, "b": 2, "b-copy": 0}  # b's text graded twice, differently: majority, tie to the lower
    pq.write_table(pa.table({"pair_id": list(graded), "grade": pa.array(list(graded.values()), pa.int8())}), gold)
    rows = {r["pair_id"]: r for r in human_graded(teacher, gold, text)}
    label = ("grade", "confidence", "votes", "gold_grade", "source")
    assert [rows["a-copy"][k] for k in label] == [rows["a"][k] for k in label] == [1, 1.0, [0, 1, 0, 0], 1, "human"]
    assert (rows["b"]["grade"], rows["b-copy"]["grade"]) == (2, 0)  # a pair's own human grade comes first
    assert rows["b-copy2"]["grade"] == 0 and rows["c"] == {**rows["c"], **teacher[-1], "source": "teacher"}


def test_the_cli_spells_review_export_and_import_as_two_words(annotate_dir, tmp_path, capsys):
    out = tmp_path / "ls"
    assert main(["review", "export", "--set", f"review={annotate_dir / 'review'}", "--set", f"out_dir={out}"]) == 0
    assert (out / "tasks.json").is_file() and (out / "labeling_config.xml").is_file()
    assert main(["review", "import", "--set", f"export={tmp_path / 'none.json'}"]) == 1
    assert "Label Studio export" in (err := capsys.readouterr().err) and "none.json does not exist" in err


def test_labeling_config_parses_and_names_every_grade():
    view = ET.fromstring(labeling_config())
    assert len(view.find("Choices")) == len(GRADE_CHOICES) == 4
