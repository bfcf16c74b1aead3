import pytest

from agpo.models import TinyModelConfig
from agpo.sft import SFTConfig
from pipelines.ads.intake.data import DataConfig
from pipelines.ads.intake.data import run as prepare
from pipelines.ads.intake.synthetic import SyntheticConfig
from pipelines.ads.teacher.warm_start import TeacherConfig
from pipelines.ads.teacher.warm_start import run as build_teacher


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


@pytest.fixture(scope="session")
def small_math_base(tmp_path_factory):
    """A tiny SFT-warmed arithmetic model (hidden 64; about 15 s) and the settings that train from it."""
    from pipelines.config import load_config
    from pipelines.math.math_train import MathTrainConfig, build_base, problems_of

    work = tmp_path_factory.mktemp("math")
    sets = {
        "arithmetic.count": 300,
        "eval_problems": 16,
        "eval_samples": 2,
        "sft_examples": 200,
        "sft.epochs": 2,
        "model.hidden_size": 64,
        "model.intermediate_size": 128,
        "out_dir": str(work / "base-run"),
    }
    config = load_config(MathTrainConfig, [], [f"{key}={value}" for key, value in sets.items()])
    base = build_base(config, problems_of(config)[0])
    return work, base, {k: v for k, v in sets.items() if k != "out_dir"}
