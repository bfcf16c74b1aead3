"""The exported-graph cache (student.graph_cache): a network exported before is copied after its check, a changed
network, a tampered entry or a cache others may write is traced again."""

import hashlib
import json
import os
import shutil

import onnx
import pytest
import torch

from student import graph_cache
from student.export import ONNX_FILE, export_onnx
from student.interchange import INTERCHANGE_ONNX
from student.model import RelevanceStudent, StudentConfig

TEXTS = ["red running shoes nike", "black phone case apple", "wireless earbuds sony"] * 10


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("AGPO_ONNX_CACHE", str(folder))
    return folder


def tiny_student(seed: int = 0) -> RelevanceStudent:
    return RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="cross", seed=seed), texts=TEXTS)


def entries(cache) -> list:
    return sorted(p for p in cache.iterdir() if not p.name.startswith("."))


def test_the_same_network_is_served_from_the_cache_and_a_changed_one_is_traced(cache, tmp_path):
    student = tiny_student()
    export_onnx(student, tmp_path / "first")
    [entry] = entries(cache)
    files = json.loads((entry / graph_cache.SUMS).read_text())
    assert set(files) == {ONNX_FILE, INTERCHANGE_ONNX}  # the cross-encoder's two graphs
    assert cache.stat().st_mode & 0o777 == 0o700

    # the entry's graph replaced by another valid one, its sum recorded: the next export copies it, not traces
    other = onnx.load(tmp_path / "first" / ONNX_FILE)
    other.producer_name = "from the cache"
    onnx.save(other, entry / ONNX_FILE)
    files[ONNX_FILE] = hashlib.sha256((entry / ONNX_FILE).read_bytes()).hexdigest()
    (entry / graph_cache.SUMS).write_text(json.dumps(files))
    export_onnx(student, tmp_path / "second")
    assert onnx.load(tmp_path / "second" / ONNX_FILE).producer_name == "from the cache"
    assert len(entries(cache)) == 1

    with torch.no_grad():  # one weight changed: another key, traced
        next(student.model.parameters()).add_(1.0)
    export_onnx(student, tmp_path / "third")
    assert len(entries(cache)) == 2
    assert onnx.load(tmp_path / "third" / ONNX_FILE).producer_name != "from the cache"


def test_the_same_network_saved_in_two_folders_has_one_key_and_a_changed_setting_another(tmp_path):
    # the zero-shot baseline is loaded from the evaluation's folder, the shipped student from the run's: one graph
    graphs = {ONNX_FILE: "probabilities"}
    tiny_student().save(tmp_path / "run" / "model")
    shutil.copytree(tmp_path / "run" / "model", tmp_path / "eval" / "baseline")
    keys = [
        graph_cache.graph_key(RelevanceStudent.load(tmp_path / folder).model, graphs, "settings")
        for folder in ("run/model", "eval/baseline")
    ]
    assert keys[0] == keys[1]
    changed = RelevanceStudent.load(tmp_path / "eval" / "baseline").model
    changed.backbone.config.layer_norm_eps *= 10  # not a weight: a setting of the network the graph depends on
    assert graph_cache.graph_key(changed, graphs, "settings") != keys[0]


def stored(cache, key: str, folder, data: bytes) -> None:
    """Entry ``key`` of ``cache`` holding one graph file, ``model.onnx``, with ``data``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(data)
    graph_cache.store(cache, key, folder, ["model.onnx"])


def test_an_entry_whose_bytes_changed_is_refused_and_replaced_by_the_next_store(tmp_path):
    cache = graph_cache.private_cache(tmp_path / "cache")
    stored(cache, "k", tmp_path / "made", b"graph")
    assert graph_cache.restore(cache, "k", tmp_path / "served", ["model.onnx"])
    assert (tmp_path / "served" / "model.onnx").read_bytes() == b"graph"
    (cache / "k" / "model.onnx").write_bytes(b"grapH")  # its recorded sum no longer matches
    assert not graph_cache.restore(cache, "k", tmp_path / "refused", ["model.onnx"])
    assert not (tmp_path / "refused").exists()  # nothing copied
    assert not graph_cache.restore(cache, "k", tmp_path / "refused", ["model.onnx", "other.onnx"])  # a file missing
    stored(cache, "k", tmp_path / "made", b"graph")  # traced again: the entry replaced
    assert graph_cache.restore(cache, "k", tmp_path / "served-again", ["model.onnx"])


def test_a_cache_others_may_write_is_not_used_and_off_turns_it_off(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert graph_cache.private_cache(shared) is None
    assert graph_cache.private_cache(tmp_path / "new").stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("AGPO_ONNX_CACHE", graph_cache.OFF)
    assert graph_cache.cache_folder() is None
    monkeypatch.setenv("AGPO_ONNX_CACHE", str(shared))
    assert graph_cache.cache_folder() == shared


def test_a_store_prunes_the_least_recently_used_entries_beyond_the_size_limit(tmp_path, monkeypatch):
    cache = graph_cache.private_cache(tmp_path / "cache")
    for key in ("old", "used", "other"):
        stored(cache, key, tmp_path / key, b"x" * 1000)
        os.utime(cache / key, (1, {"old": 100, "used": 200, "other": 300}[key]))
    assert graph_cache.restore(cache, "used", tmp_path / "served", ["model.onnx"])  # now the most recent
    monkeypatch.setenv("AGPO_ONNX_CACHE_GB", str(2500 / 2**30))  # two entries and their sums
    stored(cache, "new", tmp_path / "new", b"x" * 1000)
    assert sorted(entry.name for entry in entries(cache)) == ["new", "used"]  # "old", then "other", went first


def test_the_key_covers_the_weights_the_graphs_asked_for_and_the_settings():
    student, other_seed = tiny_student(), tiny_student(seed=1)
    graphs = {ONNX_FILE: "probabilities"}
    key = graph_cache.graph_key(student.model, graphs, "s")
    assert key == graph_cache.graph_key(tiny_student().model, graphs, "s")  # the same seed: the same network
    assert key != graph_cache.graph_key(other_seed.model, graphs, "s")
    assert key != graph_cache.graph_key(student.model, graphs | {INTERCHANGE_ONNX: "logits"}, "s")
    assert key != graph_cache.graph_key(student.model, graphs, "another exporter setting")
