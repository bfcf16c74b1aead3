import os
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from agpo.models import TinyModelConfig, build_tiny_qwen2, train_bpe_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# CI runs the same examples every time (no flaky draws); locally hypothesis explores freely. No deadline: speed is
# measured in benchmarks, and a 200 ms deadline failed examples that ran beside another test on 2 busy cores.
settings.register_profile(
    "ci", derandomize=True, max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(items):
    """Files with a test marked ``minutes(N)`` (about N minutes on 2 cores, the file's tests together) are
    collected first, the longest first, then the others in their usual order: with ``--no-loadscope-reorder``
    (the Makefile's) pytest-xdist hands files to its workers in collection order, so the longest ones start first
    and no worker idles at the end while the other finishes a long file."""
    minutes: dict[object, float] = {}
    for item in items:
        marker = item.get_closest_marker("minutes")
        if marker is not None:
            minutes[item.path] = max(minutes.get(item.path, 0), marker.args[0] if marker.args else 1)
    items.sort(key=lambda item: -minutes.get(item.path, 0))  # stable: the order within a file is kept


# a tiny byte-level BPE tokenizer and Qwen2 built here (no hub): the engines', trainer's and grammar's tests
CORPUS = [
    "<query>red nike running shoes</query>\n<ad>nike running shoes, red, mesh, size 42</ad>\n",
    "<query>black phone case</query>\n<ad>otterbox phone case, black, plastic</ad>\n",
    " same category, all named attributes match <answer>3</answer>",
    " different category <answer>0</answer>",
    "价格 耐克 跑鞋 红色",
] * 20


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_bpe_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture
def tiny_model(tiny_tokenizer):
    """A fresh 1-layer Qwen2 (hidden 64) with random weights, seed 0."""
    model = build_tiny_qwen2(
        tiny_tokenizer, TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=1, intermediate_size=128)
    )
    return model.eval()


@pytest.fixture
def prompt_ids(tiny_tokenizer):
    texts = ["<query>red shoes</query>\n<ad>", "<query>black phone case</query>\n<ad>otterbox phone case</ad>\n", "a"]
    return [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


# the real query-product pairs of ../shared/data (never copied into the repository); tests on it skip without it
HOME_DEPOT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "homedepot" / "hd_dev.csv"


@pytest.fixture(scope="session")
def home_depot_csv() -> Path:
    """The real Home Depot pairs' CSV; the test skips, saying where it looked, when it is not there."""
    if not HOME_DEPOT.is_file():
        pytest.skip(f"the real Home Depot pairs are not at {HOME_DEPOT} (../shared/data is not laid out here)")
    return HOME_DEPOT


@pytest.fixture(scope="session")
def real_export(home_depot_csv, tmp_path_factory) -> Path:
    """A tiny team export of real Home Depot text, imported with the README's recipe: whole queries, about 60
    test, 40 audit and 120 gold train pairs (pipelines.ads.studies.real_text's carving, sample 0); its pairs file."""
    from pipelines.ads.studies.real_text import carve, import_export, read_source

    columns, by_query = read_source(home_depot_csv)
    [rows] = carve(by_query, sample=0, sizes=(120,), test_pairs=60, audit_pairs=40).values()
    return import_export(rows, columns, tmp_path_factory.mktemp("real-export"))


@pytest.fixture(scope="session")
def s3_store(tmp_path_factory):
    """A real S3-compatible store (SeaweedFS, ``deploy/object_store.py``) on 127.0.0.1, one per test process
    (pytest-xdist worker), stopped at the session's end; identities ``admin`` and ``reader``. Skips when SeaweedFS's
    ``weed`` is not installed."""
    from deploy.object_store import start_object_store, weed_binary
    from deploy.services import ServiceError

    try:
        weed_binary()
    except ServiceError as missing:
        pytest.skip(str(missing))
    store = start_object_store(tmp_path_factory.mktemp("s3-store"))
    yield store
    store.stop()


@pytest.fixture
def s3_env(s3_store, monkeypatch) -> str:
    """A fresh bucket of ``s3_store`` (``t-<12 hex>``), with this test's environment pointing the AWS SDKs at the
    store as ``admin`` (``ObjectStore.env``; every other AWS_* variable unset); the bucket's name."""
    for key in [key for key in os.environ if key.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in s3_store.env("admin").items():
        monkeypatch.setenv(key, value)
    return s3_store.create_bucket(f"t-{uuid.uuid4().hex[:12]}")
