"""Item 5's instruments: gold labels corrupted at a known rate, the student's sensitivity line against hand
values, and compare-students placing a teacher's students against gold-noise controls end to end."""

import json

import pytest

from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.annotation.annotate import run as annotate
from pipelines.ads.distillation.distil import DistilConfig, corrupted
from pipelines.ads.studies.compare_students import StudentProtocolConfig
from pipelines.ads.studies.compare_students import run as compare_students
from pipelines.ads.studies.label_sensitivity import fit_sensitivity, sensitivity_markdown
from pipelines.config import load_config


def test_gold_noise_replaces_exactly_its_share_with_other_grades():
    graded = [(f"p{i}", i % 4) for i in range(101)]
    config = DistilConfig(label_source="gold", gold_noise=0.2, gold_noise_seed=3)
    noisy = corrupted(graded, config, grades=4)
    changed = [(a, b) for a, b in zip(graded, noisy, strict=True) if a != b]
    assert len(changed) == 20  # round(0.2 * 101)
    assert all(pid == qid and 0 <= new < 4 for (pid, _), (qid, new) in changed)  # a different, valid grade
    assert corrupted(graded, config, grades=4) == noisy  # seeded: the same flips for every student seed
    other = corrupted(graded, DistilConfig(label_source="gold", gold_noise=0.2, gold_noise_seed=4), grades=4)
    assert other != noisy
    assert corrupted(graded, DistilConfig(label_source="gold"), grades=4) == graded


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"gold_noise": 0.1}, "needs label_source: gold"), ({"label_source": "gold", "gold_noise": 1.0}, r"\[0, 1\)")],
)
def test_gold_noise_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DistilConfig(**kwargs)
    with pytest.raises(ValueError, match="every gold_noise share must be in"):
        StudentProtocolConfig(gold_noise=(0.0,))


def control(accuracy, f1):
    return {"labels": "ctl", "control": True, "label_accuracy": accuracy, "macro_f1": f1}


def test_sensitivity_line_and_teacher_residuals_by_hand():
    # controls (1, .80) (1, .82) (.8, .60) (.8, .64): group means .81 and .62, so slope .19 / .2 = 0.95 and
    # intercept .81 - .95 = -0.14; residuals -.01 +.01 -.02 +.02, SSR .001, Sxx .04:
    # se = sqrt(.001 / 2 / .04) = 0.111803
    students = [control(1.0, 0.80), control(1.0, 0.82), control(0.8, 0.60), control(0.8, 0.64)]
    students += [{"labels": "grpo", "label_accuracy": 0.9, "macro_f1": f1} for f1 in (0.70, 0.74)]
    students += [{"labels": "unscored", "label_accuracy": None, "macro_f1": 0.5}]
    fit = fit_sensitivity(students)
    assert fit["slope"] == pytest.approx(0.95) and fit["intercept"] == pytest.approx(-0.14)
    assert fit["slope_se"] == pytest.approx(0.111803, abs=1e-6)
    (grpo,) = fit["teachers"]  # the label set without hidden gold cannot be placed
    assert grpo["predicted"] == pytest.approx(0.715) and grpo["residual"] == pytest.approx(0.005)
    assert "**0.950** ± 0.112" in sensitivity_markdown(fit) and "| grpo | 0.900 | 0.720 | 0.715 | +0.005 |" in (
        sensitivity_markdown(fit)
    )
    with pytest.raises(ValueError, match="two label accuracies"):
        fit_sensitivity([control(1.0, 0.8), control(1.0, 0.9)])


@pytest.mark.integration
def test_compare_students_places_a_teacher_against_gold_noise_controls(small_teacher, tmp_path):
    work, pairs, teacher = small_teacher
    gold = f"{work}/data/unlabeled_gold.parquet"
    labels = tmp_path / "annotate"
    annotate(
        load_config(
            AnnotateConfig,
            [],
            [f"teacher={teacher}", f"input.path={pairs}", f"out_dir={labels}", f"gold={gold}", "voting.votes=2"],
        )
    )
    sets = [
        f"label_sets={{sft: {labels}}}",
        "gold_noise=[0.3]",
        f"out_dir={tmp_path / 'students'}",
        f"distil.pairs={pairs}",
        f"distil.gold={gold}",
        "distil.training.epochs=2",
        "distil.training.min_epochs=1",
    ]
    paths = compare_students(load_config(StudentProtocolConfig, [], sets))
    result = json.loads(paths["json"].read_text())
    by_name = {s["labels"]: s for s in result["students"]}
    assert list(by_name) == ["gold", "gold-noise-30", "sft"]
    pairs_used = by_name["gold-noise-30"]["training_pairs"]
    assert by_name["gold-noise-30"]["label_accuracy"] == pytest.approx(1 - round(0.3 * pairs_used) / pairs_used)
    assert by_name["gold"]["label_accuracy"] == 1.0 and by_name["gold"]["control"]
    fit = result["sensitivity"]
    assert fit["control_students"] == 2 and fit["slope_se"] is None  # two points: a line, no error estimate
    assert [t["labels"] for t in fit["teachers"]] == ["sft"]
    assert paths["plot"].stat().st_size > 0 and "line predicts" in paths["markdown"].read_text()
