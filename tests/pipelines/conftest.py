import pytest

from agpo.models import TinyModelConfig
from agpo.sft import SFTConfig
from pipelines.prepare_data import DataConfig
from pipelines.prepare_data import run as prepare
from pipelines.synthetic import SyntheticConfig
from pipelines.teacher import TeacherConfig
from pipelines.teacher import run as build_teacher


@pytest.fixture(scope="session")
def small_teacher(tmp_path_factory):
    """A small synthetic set and a small SFT teacher (hidden 64; about 10 s): (work dir, pairs, model dir)."""
    work = tmp_path_factory.mktemp("small")
    data = DataConfig(out_dir=str(work / "data"), synthetic=SyntheticConfig(train=300, audit=40, unlabeled=60, test=40))
    pairs = prepare(data)["pairs"]
    teacher = TeacherConfig(
        pairs=str(pairs),
        out_dir=str(work / "sft"),
        sft_examples=300,
        audit_examples=20,
        model=TinyModelConfig(hidden_size=64, intermediate_size=128),
        sft=SFTConfig(epochs=12, learning_rate=3e-3),  # answers parse (audit accuracy 0.3)
    )
    return work, pairs, build_teacher(teacher)["model"]
