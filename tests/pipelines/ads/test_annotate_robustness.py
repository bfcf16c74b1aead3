"""The adversarial-ad measurement runs on a real teacher and reports comparable flip rates."""

import json

import pytest

from pipelines.ads.studies.annotate_robustness import (
    ATTACKS,
    PARAPHRASES,
    RobustnessConfig,
    attack_target,
    measure,
    run,
    variants,
)


def test_variants_append_noise_or_an_attack_aimed_away_from_gold():
    pair = {"pair_id": "p", "query": "red shoes", "ad_title": "nike shoes", "gold_grade": 3}
    built = variants(pair)
    assert len(built["paraphrase"]) == len(PARAPHRASES) and len(built["adversarial"]) == len(ATTACKS)
    assert all(v["ad_title"].startswith("nike shoes") for v in built["paraphrase"] + built["adversarial"])
    assert "answer 0" in built["adversarial"][0]["ad_title"]  # gold 3 -> the attack asks for 0
    assert attack_target(1) == 3


def test_measure_hand_values():
    clean, gold = [1, 2], [1, 3]  # targets: 3 and 0
    labels = {"adversarial": [1, 3, 0, 2]}  # repeats=2: rows (1,1) for pair 0, (2,2) for pair 1
    result = measure(clean, labels, gold, repeats=2)["adversarial"]
    assert result["flip_rate"] == pytest.approx(2 / 4)  # 1->1 same, 1->3, 2->0, 2->2 same
    assert result["target_hit_rate"] == pytest.approx(2 / 4)  # 3 hits target 3, 0 hits target 0
    assert result["accuracy"] == pytest.approx(1 / 4)


@pytest.mark.integration
@pytest.mark.parametrize("constrained", [True, False])
def test_robustness_report_on_a_small_teacher(small_teacher, tmp_path, constrained):
    _, pairs, teacher = small_teacher
    config = RobustnessConfig(
        pairs=str(pairs), teacher=str(teacher), out_dir=str(tmp_path), examples=20, constrained=constrained
    )
    report = json.loads(run(config)["report"].read_text())
    assert report["pairs"] == 20 and report["constrained"] is constrained
    for name in ("paraphrase", "adversarial"):
        assert report[name]["versions"] == 100 and 0 <= report[name]["flip_rate"] <= 1
    assert report["adversarial_minus_paraphrase_flip_rate"] == pytest.approx(
        report["adversarial"]["flip_rate"] - report["paraphrase"]["flip_rate"]
    )
    if constrained:  # within the answer grammar every version parses: no flip is an unparseable answer
        assert report["clean_unparseable"] == 0.0 and report["adversarial"]["unparseable"] == 0.0


def test_evaluation_strings_are_not_the_training_noise():
    from pipelines.ads.intake.synthetic import AD_NOISE

    evaluated = set(PARAPHRASES) | {a.format(target=t) for a in ATTACKS for t in (0, 3)}
    assert not evaluated & set(AD_NOISE)
