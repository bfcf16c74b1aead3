"""The synthetic query-ad generator: grades by rule, determinism, noise, Chinese text, and the contract."""

import json
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ads.intake.contracts import (
    PAIRS_SCHEMA,
    ContractError,
    labeled_splits,
    pairs_table,
    read_pairs,
    teacher_part,
    write_table,
)
from pipelines.ads.intake.data import DataConfig, run
from pipelines.ads.intake.synthetic import (
    CATALOG,
    REALISTIC,
    Product,
    QuerySpec,
    SyntheticConfig,
    generate_pairs,
    gold_grade,
    misspell,
    one_grade_off,
)
from pipelines.ads.pipeline_config import AdsPipelineConfig
from pipelines.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def shoe(**changes):
    base = {"category": "sneakers", "brand": "nike", "colour": "red", "size": "42", "material": "mesh"}
    return Product(**(base | changes))


def test_gold_grade_rules_by_hand():
    query = QuerySpec("sneakers", (("brand", "nike"), ("colour", "red")))
    assert gold_grade(query, shoe()) == (3, "exact", ())
    assert gold_grade(query, shoe(size="44", material="leather")) == (3, "exact", ())  # unnamed attributes are free
    assert gold_grade(query, shoe(colour="blue")) == (2, "substitute", ("colour",))
    assert gold_grade(query, shoe(brand="puma", colour="blue")) == (2, "substitute", ("brand", "colour"))
    assert gold_grade(query, shoe(category="socks"))[0] == 1
    assert gold_grade(query, shoe(category="smartphone"))[0] == 0
    assert gold_grade(QuerySpec("socks", ()), shoe())[0] == 1  # complements are symmetric


def test_generated_grades_match_the_rule_and_text():
    rows = generate_pairs(SyntheticConfig(train=400, audit=0, unlabeled=0, test=0))
    assert Counter(r["gold_grade"] for r in rows).keys() == {0, 1, 2, 3}
    for row in rows:
        ad = Product(**json.loads(row["ad_attributes"]))
        assert ad.category in row["ad_title"] and ad.brand in row["ad_title"]
        grade = row["gold_grade"]
        if grade >= 2:
            assert row["query"].endswith(ad.category) or f"{ad.category} " in row["query"]
        assert row["rationale"].startswith(
            {3: "same category, all", 2: "same category,", 1: "complementary", 0: "different"}[grade]
        )


def test_deterministic_by_seed_and_unique_ids():
    a = generate_pairs(SyntheticConfig(train=50, audit=10, unlabeled=10, test=0))
    assert a == generate_pairs(SyntheticConfig(train=50, audit=10, unlabeled=10, test=0))
    assert a != generate_pairs(SyntheticConfig(seed=1, train=50, audit=10, unlabeled=10, test=0))
    assert len({r["pair_id"] for r in a}) == 70
    assert Counter(r["split"] for r in a) == {"train": 50, "audit": 10, "unlabeled": 10}


def test_label_noise_flips_only_train_grades():
    rows = generate_pairs(SyntheticConfig(train=1000, audit=200, unlabeled=0, test=0, label_noise=0.3))
    flipped = [r for r in rows if r["gold_grade"] != r["clean_grade"]]
    assert {r["split"] for r in flipped} == {"train"}
    assert 0.25 < len(flipped) / 1000 < 0.35


def test_chinese_and_mixed_text():
    zh = generate_pairs(SyntheticConfig(train=30, audit=0, unlabeled=0, test=0, language="zh"))
    assert all(any(CATALOG[c][0] in r["query"] for c in CATALOG) for r in zh)
    mixed = generate_pairs(SyntheticConfig(train=200, audit=0, unlabeled=0, test=0, language="mixed"))
    chinese = sum(any("\u4e00" <= ch <= "\u9fff" for ch in r["query"]) for r in mixed)
    assert 60 < chinese < 140


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"train": -1}, "train must be an int >= 0"),
        ({"grade_weights": (1, 1, 1)}, "grade_weights must be 4"),
        ({"label_noise": 1.5}, r"label_noise must be in \[0, 1\]"),
        ({"language": "fr"}, "language must be en, zh or mixed"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SyntheticConfig(**kwargs)


def test_stage_writes_the_pairs_contract(tmp_path):
    paths = run(DataConfig(out_dir=str(tmp_path), synthetic=SyntheticConfig(train=20, audit=5, unlabeled=7, test=0)))
    table = read_pairs(paths["pairs"])
    assert table.schema == PAIRS_SCHEMA and table.num_rows == 32
    unlabeled = read_pairs(paths["pairs"], "unlabeled")
    assert unlabeled.num_rows == 7 and unlabeled["gold_grade"].null_count == 7
    hidden = pq.read_table(paths["unlabeled_gold"])
    assert hidden.num_rows == 7 and hidden["gold_grade"].null_count == 0
    assert json.loads(paths["summary"].read_text())["per_split"] == {"train": 20, "audit": 5, "unlabeled": 7}


def test_read_pairs_names_what_is_wrong(tmp_path):
    with pytest.raises(ContractError, match="does not exist; run `agpo data` first"):
        read_pairs(tmp_path / "nope.parquet")
    write_table(pa.table({"pair_id": ["a"], "query": ["q"]}), tmp_path / "thin.parquet")
    with pytest.raises(ContractError, match=r"lacks column\(s\) \['ad_title', 'gold_grade', 'split'\]"):
        read_pairs(tmp_path / "thin.parquet")
    bad = pa.table({"pair_id": ["a"], "query": ["q"], "ad_title": ["t"], "gold_grade": ["high"], "split": ["train"]})
    write_table(bad, tmp_path / "typed.parquet")
    with pytest.raises(ContractError, match="wrong type"):
        read_pairs(tmp_path / "typed.parquet")
    good = pairs_table([{"pair_id": "a", "query": "q", "ad_title": "t", "gold_grade": 2, "split": "audit"}])
    write_table(good, tmp_path / "good.parquet")
    assert read_pairs(tmp_path / "good.parquet", "audit")["gold_grade"].to_pylist() == [2]


def test_labeled_splits_keep_gold_rows_and_name_the_source():
    rows = [
        {"split": "train", "gold_grade": 1},
        {"split": "train", "gold_grade": None},
        {"split": "train", "gold_grade": 3},
        {"split": "audit", "gold_grade": 0},
    ]
    train, audit = labeled_splits(rows, "p.parquet", 1, None)
    assert train == [rows[0]] and audit == [rows[3]]
    assert labeled_splits(rows, "p.parquet", None, None)[0] == [rows[0], rows[2]]
    with pytest.raises(ContractError, match=r"p.parquet needs labeled train and audit rows, got 2 and 0"):
        labeled_splits(rows[:3], "p.parquet", None, None)


def test_ad_noise_touches_train_ads_only_and_keeps_their_gold():
    from pipelines.ads.intake.synthetic import AD_NOISE, SyntheticConfig, generate_pairs

    clean = generate_pairs(SyntheticConfig(train=400, audit=50, unlabeled=50, test=0, ad_noise=0.0))
    noisy = generate_pairs(SyntheticConfig(train=400, audit=50, unlabeled=50, test=0, ad_noise=0.25))
    changed = [(a, b) for a, b in zip(clean, noisy, strict=True) if a["ad_title"] != b["ad_title"]]
    assert {b["split"] for _, b in changed} == {"train"}
    assert 0.15 < len(changed) / 400 < 0.35
    for a, b in changed:
        assert b["ad_title"][len(a["ad_title"]) :] in AD_NOISE and a["gold_grade"] == b["gold_grade"]


def test_the_teacher_parts_split_whole_queries_the_same_way_every_time():
    rows = [{"pair_id": f"p{i}", "query": f"query {i % 200}", "split": "train", "gold_grade": 1} for i in range(1000)]
    sft, rl = teacher_part(rows, 0.4, "sft"), teacher_part(rows, 0.4, "rl")
    assert sorted(r["pair_id"] for r in sft + rl) == sorted(r["pair_id"] for r in rows)  # disjoint, complete
    assert not {r["query"] for r in sft} & {r["query"] for r in rl}  # no query on both sides
    assert 0.3 < len({r["query"] for r in rl}) / 200 < 0.5  # 0.4 of the queries, within sampling error
    assert teacher_part(rows, 0.4, "rl") == rl and teacher_part(list(reversed(rows)), 0.4, "rl") == rl[::-1]
    assert teacher_part(rows, 0.0, "sft") == rows == teacher_part(rows, 0.0, "rl")  # no split: both train on all
    with pytest.raises(ValueError, match=r"rl_share must be in \[0, 1\)"):
        teacher_part(rows, 1.0, "rl")


REALISTIC_SET = SyntheticConfig(train=3000, audit=500, unlabeled=500, test=500, **REALISTIC)


def test_realism_changes_the_text_and_the_mix_not_the_rules_grade():
    plain = generate_pairs(
        SyntheticConfig(train=3000, audit=500, unlabeled=500, test=500, grade_weights=REALISTIC["grade_weights"])
    )
    real = generate_pairs(REALISTIC_SET)
    # the same products and rule grades as without the text settings: they draw from their own generators
    assert [r["clean_grade"] for r in real] == [r["clean_grade"] for r in plain]
    assert [r["ad_attributes"] for r in real] == [r["ad_attributes"] for r in plain]
    shares = Counter(r["clean_grade"] for r in real)
    for grade, share in enumerate((0.07, 0.10, 0.38, 0.45)):  # what rater-averaged e-commerce sets have
        assert abs(shares[grade] / len(real) - share) < 0.02
    lengths = [len(r["ad_title"].split()) for r in real]
    assert min(lengths) >= 8 and max(lengths) <= 25 and sum(lengths) / len(lengths) > 11
    for r in real[:200]:  # every title names the ad's brand, colour, size and material
        ad = json.loads(r["ad_attributes"])
        assert all(ad[k] in r["ad_title"].lower() for k in ("brand", "colour", "size", "material"))


def test_rater_noise_moves_that_share_of_every_split_one_grade():
    rows = generate_pairs(REALISTIC_SET)
    for split in ("train", "audit", "unlabeled", "test"):
        part = [r for r in rows if r["split"] == split]
        off = [r for r in part if r["gold_grade"] != r["clean_grade"]]
        assert abs(len(off) / len(part) - 0.15) < 0.04, split
        assert all(abs(r["gold_grade"] - r["clean_grade"]) == 1 for r in off)


def test_query_typos_touch_that_share_of_queries():
    plain = generate_pairs(SyntheticConfig(train=2000, audit=0, unlabeled=0, test=0))
    typed = generate_pairs(SyntheticConfig(train=2000, audit=0, unlabeled=0, test=0, query_typos=0.2))
    changed = sum(a["query"] != b["query"] for a, b in zip(plain, typed, strict=True)) / len(plain)
    assert 0.12 < changed <= 0.22  # a query of short words only keeps its spelling
    assert misspell("white tent", random.Random(1)) in {
        "wht tent",
        "whie tent",
        "wihte tent",
        "white tnt",
        "white etnt",
        "whte tent",
        "wite tent",
        "white ten",
        "white tnet",
        "white tet",
    }
    assert one_grade_off(0, random.Random(0)) == 1 and one_grade_off(3, random.Random(0)) == 2


def test_the_realistic_preset_is_the_realistic_settings():
    config = load_config(AdsPipelineConfig, [ROOT / "configs" / "pipeline" / "realistic.yaml"])
    assert {k: getattr(config.data.synthetic, k) for k in REALISTIC} == REALISTIC
