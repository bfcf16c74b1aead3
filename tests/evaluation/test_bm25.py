"""The BM25 baseline (evaluation/bm25.py): rank_bm25's score mapped to grades, saved as plain JSON, and reached
through the baseline registry alone: configured by name, fitted, loaded and carded like the others."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evaluation.baseline_registry import (
    BASELINES,
    baseline_of,
    fit_baselines,
    register_baseline,
    saved_baseline,
    served_code,
)
from evaluation.baselines_config import BaselinesConfig
from evaluation.bm25 import STATE_FILE, Bm25Baseline, Bm25Matcher
from evaluation.predictors import backend_of, load_predictor, model_kind

QUERIES = ["red running shoes", "red running shoes", "desk lamp", "desk lamp", "blue mug", "blue mug"] * 2
ADS = ["Acme red running shoes", "Garden hose", "Zeta desk lamp led", "Red shoes", "Blue mug 300 ml", "Desk"] * 2
GRADES = [3, 0, 3, 0, 3, 0] * 2


def test_a_higher_bm25_score_is_a_likelier_relevant_grade():
    matcher = Bm25Matcher(4).fit(QUERIES, ADS, GRADES)
    scores, probs = matcher.scores(QUERIES, ADS), matcher.predict_proba(QUERIES, ADS)
    assert probs.shape == (len(QUERIES), 4) and np.allclose(probs.sum(1), 1.0)
    assert np.all(probs[:, [1, 2]] == 0)  # grades absent from training get no probability
    order = np.argsort(scores)
    assert np.all(np.diff(probs[order, 3]) >= -1e-12) and probs[0, 3] > probs[1, 3]
    assert scores[1] == 0.0  # no query term in the ad


def test_saved_as_plain_json_it_loads_back_predicting_the_same(tmp_path):
    matcher = Bm25Matcher(4).fit(QUERIES, ADS, GRADES)
    folder = matcher.save(tmp_path / "bm25")
    state = json.loads((folder / STATE_FILE).read_text())
    assert state["format"] == "agpo-bm25/1" and model_kind(folder) == "bm25"
    loaded = load_predictor(folder, backend="onnx")  # a baseline has no graph backend: its own load
    assert isinstance(loaded, Bm25Matcher) and backend_of(loaded) == "rank-bm25"
    assert np.array_equal(loaded.predict_proba(QUERIES, ADS), matcher.predict_proba(QUERIES, ADS))
    constant = Bm25Matcher(4).fit(QUERIES[:2], ADS[:2], [2, 2]).save(tmp_path / "one")
    assert np.array_equal(Bm25Matcher.load(constant).predict_proba(["x"], ["y"]), [[0, 0, 1, 0]])
    with pytest.raises(FileNotFoundError, match="not a saved BM25 baseline"):
        Bm25Matcher.load(tmp_path)


def test_the_registry_configures_fits_and_recognises_it_by_name(tmp_path):
    assert baseline_of("bm25") is Bm25Baseline and list(BASELINES)[-1] == "bm25"
    config = BaselinesConfig(names=("lexical", "bm25"))
    rows = [{"query": q, "ad_title": a, "gold_grade": g} for q, a, g in zip(QUERIES, ADS, GRADES, strict=True)]
    fitted = fit_baselines(config, rows, 4)
    assert list(fitted) == ["lexical", "bm25"] and isinstance(fitted["bm25"], Bm25Matcher)
    assert saved_baseline(fitted["bm25"].save(tmp_path / "bm25")) is Bm25Baseline
    assert fit_baselines(config, [], 4) == {} and fit_baselines(BaselinesConfig(names=()), rows, 4) == {}
    with pytest.raises(ValueError, match=r"distinct names among \['lexical', 'zero_shot', 'bm25'\]"):
        BaselinesConfig(names=("bm26",))
    with pytest.raises(ValueError, match="already registered"):
        register_baseline(Bm25Baseline)


def test_the_code_a_served_baseline_carries_is_all_it_needs(tmp_path):
    """The pyfunc model of a saved baseline carries the registry's modules and the baseline's ``code`` as the
    packages ``evaluation`` and ``student`` (pipelines.ads.serving.student_model): alone on the path, they load
    and predict it."""
    folder = Bm25Matcher(4).fit(QUERIES, ADS, GRADES).save(tmp_path / "bm25")
    code = tmp_path / "code"
    for package, files in served_code(Bm25Baseline).items():
        (code / package).mkdir(parents=True)
        for name in files:
            shutil.copy(Path(__file__).parents[2] / package / name, code / package / name)
    probe = (
        f"import sys; sys.path.insert(0, {str(code)!r}); import evaluation, student; "
        f"assert evaluation.__file__.startswith({str(code)!r}), evaluation.__file__; "
        f"assert student.__file__.startswith({str(code)!r}), student.__file__; "
        "from evaluation.baseline_registry import saved_baseline; "
        f"matcher = saved_baseline({str(folder)!r}).load({str(folder)!r}); "
        "print(matcher.predict_proba(['red shoes'], ['red shoes']).tolist())"
    )
    out = subprocess.run([sys.executable, "-I", "-c", probe], capture_output=True, text=True, check=True).stdout
    assert np.allclose(json.loads(out), Bm25Matcher.load(folder).predict_proba(["red shoes"], ["red shoes"]))
