"""The lexical matcher: its match features against hand-computed values, a rule learned from features that
carries over to words never seen in training (what a bag of n-grams cannot do), determinism, weights, and
defined behaviour for one-grade labels and grades absent from training."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from evaluation.lexical import FEATURES, Bm25, LexicalConfig, LexicalMatcher, overlap_features

ADS = ["Acme red shoes 42", "Zeta blue lamp", "Acme red shoes 42"]  # two distinct documents for BM25


def test_bm25_matches_the_hand_computed_score():
    bm25 = Bm25(ADS)
    # N = 2 distinct ads, avgdl = (4 + 3) / 2 = 3.5; "red", "shoes", "42" each in 1 of them:
    # idf = ln(1 + (2 - 1 + 0.5) / (1 + 0.5)) = ln 2; |ad| = 4: norm = 1.2 * (0.25 + 0.75 * 4 / 3.5) = 1.328571
    # each term: ln 2 * 1 * 2.2 / (1 + 1.328571) = 0.654875; three terms: 1.964626
    assert bm25.idf("red") == pytest.approx(math.log(2))
    assert bm25.score("red shoes 42", "Acme red shoes 42") == pytest.approx(1.9646258, abs=1e-6)
    assert bm25.score("red red shoes 42", "Acme red shoes 42") == pytest.approx(1.9646258, abs=1e-6)  # distinct terms
    assert bm25.score("red shoes 42", "Zeta blue lamp") == 0.0
    assert bm25.idf("unseen") == pytest.approx(math.log(1 + 2.5 / 0.5))  # n = 0: ln 6


def test_overlap_features_match_the_hand_computed_values():
    features = overlap_features("red shoes 42", "Acme red shoes 42")
    assert features == pytest.approx(
        {
            "query_coverage": 1.0,  # red, shoes, 42 all in the ad
            "jaccard": 0.75,  # 3 shared of {acme, red, shoes, 42}
            "number_overlap": 1.0,  # 42 in both
            "query_has_number": 1.0,
            "brand_match": 0.0,  # the ad's first term "acme" is not a query term
            "query_length": math.log(4),
            "ad_length": math.log(5),
        }
    )
    assert overlap_features("acme shoes size 40", "Acme red shoes 42")["brand_match"] == 1.0
    assert overlap_features("acme shoes size 40", "Acme red shoes 42")["number_overlap"] == 0.0
    assert overlap_features("blue lamp", "Acme red shoes 42")["query_has_number"] == 0.0


def test_features_come_in_their_documented_order_with_tfidf_cosines():
    matcher = LexicalMatcher(4).fit(["red shoes 42", "blue lamp"], ADS[:2], [3, 0])
    x = matcher.features(["red shoes 42", "red shoes 42"], ["red shoes 42", "Zeta blue lamp"])
    assert x.shape == (2, len(FEATURES))
    column = dict(zip(FEATURES, x.T, strict=True))
    assert column["word_cosine"] == pytest.approx([1.0, 0.0]) and column["char_cosine"][0] == pytest.approx(1.0)
    assert column["char_cosine"][1] < 0.2 and column["query_coverage"].tolist() == [1.0, 0.0]
    assert matcher.features([], []).shape == (0, len(FEATURES))


def match_set(words: list[str], seed: int):
    """Grade 3 when the ad repeats the query's words, 0 when it shares none: a matching rule, not a word list."""
    rng = np.random.default_rng(seed)
    queries, ads, grades = [], [], []
    for _ in range(200):
        query = " ".join(rng.choice(words, 2, replace=False))
        other = " ".join(rng.choice([w for w in words if w not in query.split()], 2, replace=False))
        relevant = bool(rng.integers(2))
        queries.append(query)
        ads.append(f"{query} deluxe" if relevant else f"{other} deluxe")
        grades.append(3 if relevant else 0)
    return queries, ads, grades


def test_the_rule_carries_over_to_words_never_seen_in_training():
    seen = ["sofa", "lamp", "rug", "desk", "chair", "shelf", "mirror", "bench"]
    unseen = ["kettle", "toaster", "blender", "mixer", "grill", "wok", "ladle", "whisk"]
    model = LexicalMatcher(4).fit(*match_set(seen, 0))
    queries, ads, grades = match_set(unseen, 1)
    assert (model.predict(queries, ads) == np.asarray(grades)).mean() == 1.0
    probs = model.predict_proba(queries, ads)
    assert probs.shape == (200, 4) and np.allclose(probs.sum(1), 1) and (probs[:, 1:3] == 0).all()  # absent grades


def test_the_fit_is_deterministic_and_weights_decide_between_contradicting_labels():
    queries, ads, grades = match_set(["sofa", "lamp", "rug", "desk", "chair"], 0)
    for config in (LexicalConfig(), LexicalConfig(class_weight="balanced", seed=3)):
        first = LexicalMatcher(4, config).fit(queries, ads, grades).predict_proba(queries, ads)
        assert np.array_equal(first, LexicalMatcher(4, config).fit(queries, ads, grades).predict_proba(queries, ads))
    q, a = ["red shoes", "red shoes", "blue lamp", "blue lamp"], ["red shoes x", "red shoes x", "acme", "acme"]
    heavy_three = LexicalMatcher(4).fit(q, a, [3, 0, 3, 0], [0.9, 0.1, 0.9, 0.1])
    heavy_zero = LexicalMatcher(4).fit(q, a, [3, 0, 3, 0], [0.1, 0.9, 0.1, 0.9])
    assert heavy_three.predict(["red shoes"], ["red shoes x"]).tolist() == [3]
    assert heavy_zero.predict(["red shoes"], ["red shoes x"]).tolist() == [0]


def test_one_grade_gives_the_constant_model_and_bad_input_says_what_is_wrong():
    model = LexicalMatcher(4).fit(["a", "b"], ["c", "d"], [2, 2])
    assert model.single_grade == 2 and model.predict_proba(["x"], ["y"]).tolist() == [[0, 0, 1, 0]]
    with pytest.raises(ValueError, match=r"grades must be integers in 0..3, got \[0, 5\]"):
        LexicalMatcher(4).fit(["a", "b"], ["c", "d"], [0, 5])
    with pytest.raises(ValueError, match="need one grade per pair"):
        LexicalMatcher(4).fit(["a"], ["c", "d"], [0, 1])
    with pytest.raises(RuntimeError, match="fit the lexical matcher"):
        LexicalMatcher(4).predict(["a"], ["b"])
    with pytest.raises(ValueError, match=r"need k1 >= 0 and 0 <= b <= 1"):
        LexicalConfig(b=1.5)


def test_a_saved_matcher_loads_back_to_the_same_probabilities_with_no_pickle(tmp_path):
    queries = ["red shoes 42", "blue lamp", "acme shoes", "desk lamp 60 w", "red shoes", "lamp"]
    ads = ["Acme red shoes 42", "Zeta blue lamp", "Acme red shoes 40", "Zeta desk lamp 60 W", "Zeta blue lamp", "Acme"]
    grades = [3, 3, 2, 3, 0, 1]
    matcher = LexicalMatcher(4).fit(queries, ads, grades)
    folder = matcher.save(tmp_path / "lexical")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "lexical.json",
    ]  # plain JSON, nothing to unpickle
    config = json.loads((folder / "config.json").read_text())
    assert config["student_kind"] == "lexical" and config["id2label"]["3"] == "exact"
    loaded = LexicalMatcher.load(folder)
    unseen = (["red lamp", "shoes 40", "zeta"], ["Zeta blue lamp", "Acme red shoes 40", "Acme red shoes 42"])
    assert np.array_equal(loaded.predict_proba(*unseen), matcher.predict_proba(*unseen))
    # batches of one give the same figures up to the last bits of a BLAS reduction
    assert np.allclose(loaded.predict_proba(*unseen, batch_size=1), matcher.predict_proba(*unseen), atol=1e-12)
    one_grade = LexicalMatcher(4).fit(queries[:2], ads[:2], [3, 3]).save(tmp_path / "one")
    assert LexicalMatcher.load(one_grade).predict(*unseen).tolist() == [3, 3, 3]
    with pytest.raises(FileNotFoundError, match=r"no lexical.json in .*: not a saved lexical matcher"):
        LexicalMatcher.load(tmp_path)
    (folder / "lexical.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(ValueError, match="has format 'other/9'; this code reads 'agpo-lexical-matcher/1'"):
        LexicalMatcher.load(folder)


def test_a_saved_matcher_is_the_same_bytes_whatever_the_process_string_hashes_are(tmp_path):
    """Python seeds its string hashes per process, so a set's order differs between runs; the saved state does not
    (save_state writes its keys sorted): two runs of one fit give one file, and a file digest means one model."""
    fit_and_save = (
        "import sys; from evaluation.lexical import LexicalMatcher; "
        "LexicalMatcher(4).fit(['red shoes 42', 'blue lamp', 'acme shoes', 'desk lamp 60 w'], "
        "['Acme red shoes 42', 'Zeta blue lamp', 'Acme red shoes 40', 'Zeta desk lamp 60 W'], [3, 3, 2, 1])"
        ".save(sys.argv[1])"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", fit_and_save, str(tmp_path / seed)], env=env, check=True, timeout=120)
    assert (tmp_path / "1" / "lexical.json").read_bytes() == (tmp_path / "2" / "lexical.json").read_bytes()
