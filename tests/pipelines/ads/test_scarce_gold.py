"""The scarce-gold study: its arms draw whole queries up to the budget from the same source, its summary and
crossover by hand, and (integration) the whole study at tiny size through the real pipeline steps."""

import json
from pathlib import Path

import pytest

from pipelines.ads.studies.scarce_gold import (
    GOLD_ONLY,
    MIXED,
    TEACHER,
    ScarceGoldConfig,
    arm_rows,
    crossover,
    summarise,
)
from pipelines.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def source():
    rows = [
        {"pair_id": f"t{i}", "query": f"q{i // 3}", "split": "train", "gold_grade": i % 4} for i in range(30)
    ]  # 10 queries of 3 pairs
    rows += [{"pair_id": "t-unlabeled-gold", "query": "qx", "split": "train", "gold_grade": None}]
    rows += [{"pair_id": f"a{i}", "query": "qa", "split": "audit", "gold_grade": 1} for i in range(4)]
    rows += [{"pair_id": f"e{i}", "query": "qe", "split": "test", "gold_grade": 2} for i in range(4)]
    rows += [{"pair_id": f"u{i}", "query": "qu", "split": "unlabeled", "gold_grade": None} for i in range(9)]
    return rows


def test_an_arm_draws_whole_queries_up_to_its_budget_and_keeps_audit_test_and_pool():
    rows = source()
    arm = arm_rows(rows, budget=7, pool=5, seed=0)
    train = [r for r in arm if r["split"] == "train"]
    assert len(train) == 7 and all(r["gold_grade"] is not None for r in train)
    queries = [r["query"] for r in train]
    assert len(set(queries[:6])) == 2 and queries[:6] == sorted(queries[:6], key=queries.index)  # whole queries
    assert [r["pair_id"] for r in arm if r["split"] != "train"] == [f"a{i}" for i in range(4)] + [
        f"e{i}" for i in range(4)
    ] + [f"u{i}" for i in range(5)]
    assert arm_rows(rows, 7, 5, 0) == arm and arm_rows(rows, 7, 5, 1) != arm  # the seed draws
    assert {r["pair_id"] for r in arm_rows(rows, 6, 5, 0)} < {r["pair_id"] for r in arm}  # nested budgets
    with pytest.raises(Exception, match="a gold budget of 31 needs as many gold train pairs; the pairs have 30"):
        arm_rows(rows, 31, 5, 0)


def arm(budget, seed, gold, mixed=None, gate="passed"):
    models = {GOLD_ONLY: {"macro_f1": gold, "roc_auc_relevant": gold + 0.1, "label_accuracy": None}}
    if mixed is not None:
        models[MIXED] = {"macro_f1": mixed, "roc_auc_relevant": mixed + 0.1, "label_accuracy": None}
        models[TEACHER] = {"macro_f1": mixed - 0.1, "roc_auc_relevant": mixed, "label_accuracy": 0.6}
    return {
        "budget": budget,
        "seed": seed,
        "gate": gate,
        "seconds": {"teacher": 60.0, "students": 30.0},
        "models": models,
    }


def test_the_summary_is_mean_and_sample_sd_per_budget_and_finds_the_crossover():
    arms = [arm(100, 0, 0.50, 0.60), arm(100, 1, 0.54, 0.62), arm(400, 0, 0.70, 0.69), arm(400, 1, 0.72, 0.70)]
    arms.append(arm(800, 0, 0.80, gate="SFT teacher: the teacher answers at its class prior"))
    summary = summarise(arms)
    gold = summary["table"][GOLD_ONLY]["macro_f1"]
    assert gold["mean"] == pytest.approx([0.52, 0.71, 0.80])
    assert gold["sd"] == pytest.approx([0.02828427, 0.01414214, 0.0])  # sample sd (ddof 1); one seed: 0
    assert summary["table"][MIXED]["macro_f1"]["mean"][2] is None  # the teacher at 800 labelled nothing
    assert summary["crossover"]["budget"] == 400 and summary["crossover"]["gains"][:2] == pytest.approx([0.09, -0.015])
    assert summary["gates_passed"] == {100: 2, 400: 2, 800: 0}
    assert summary["mean_seconds"] == {"teacher": 60.0, "students": 30.0}


def test_the_crossover_reads_never_and_always():
    def table(gold, mixed):
        return {GOLD_ONLY: {"macro_f1": {"mean": gold}}, MIXED: {"macro_f1": {"mean": mixed}}}

    assert crossover([1, 2], table([0.5, 0.6], [0.4, 0.6]))["reading"] == "gold + teacher never beats gold only"
    always = crossover([1, 2], table([0.5, 0.6], [0.6, 0.7]))
    assert always["budget"] is None and "beats gold only at the largest budget" in always["reading"]
    back = crossover([1, 2, 4], table([0.5, 0.6, 0.7], [0.4, 0.7, 0.6]))  # below, above, below again
    assert back["budget"] == 4
    assert crossover([1], {GOLD_ONLY: {}})["reading"].startswith("no teacher labels at any budget")


def test_budgets_must_increase():
    with pytest.raises(ValueError, match="budgets must be increasing positive pair counts"):
        ScarceGoldConfig(budgets=(500, 250))


@pytest.mark.integration
def test_the_study_runs_every_arm_through_the_pipeline_and_reads_finished_arms_back(tmp_path):
    config = load_config(
        ScarceGoldConfig,
        [f"pipeline={ROOT / 'configs' / 'pipeline' / 'tiny-test.yaml'}"],
        [
            f"out_dir={tmp_path / 'study'}",
            "budgets=[60]",  # one arm through the pipeline: the draws of several are checked above
            "seeds=[0]",
            "pool=24",
            "label_past_gate=true",
            "pipeline.data.synthetic.audit=24",
            "pipeline.data.synthetic.test=32",
            "pipeline.min_balanced_margin=0.05",  # the tiny teacher fails it: recorded, and labels anyway
            f"pipeline.tracking.store_dir={tmp_path / 'mlflow'}",
        ],
    )
    from pipelines.ads.studies.scarce_gold import run

    paths = run(config)
    result = json.loads(paths["results"].read_text())
    assert [(a["budget"], a["seed"]) for a in result["arms"]] == [(60, 0)]
    for a in result["arms"]:
        assert set(a["models"]) == {GOLD_ONLY, TEACHER, MIXED, "zero-shot encoder", "lexical matcher"}
        assert a["labeled"] and set(a["seconds"]) == {"teacher", "rl", "annotate", "students"}
        assert a["models"][TEACHER]["label_accuracy"] is not None
    assert "| gold + teacher |" in paths["table"].read_text() and paths["plot"].stat().st_size > 0
    written = paths["results"].stat().st_mtime_ns
    arm_file = tmp_path / "study" / "n60-s0" / "arm.json"
    before = arm_file.stat().st_mtime_ns
    run(config)  # a rerun reads the finished arms back
    assert arm_file.stat().st_mtime_ns == before and paths["results"].stat().st_mtime_ns >= written
