"""YAML + overrides into validated dataclasses: every error names the key and the value."""

import re
from dataclasses import dataclass, field
from typing import Literal

import pytest

from pipelines.config import ConfigError, describe, from_dict, load_config, to_dict
from pipelines.experiments.toy import ToyCompareConfig


@dataclass(frozen=True)
class Inner:
    rate: float = field(default=0.5, metadata={"help": "a rate"})
    mode: Literal["a", "b"] = field(default="a", metadata={"help": "a mode"})

    def __post_init__(self):
        if self.rate > 1:
            raise ValueError(f"rate must be <= 1, got {self.rate}")


@dataclass(frozen=True)
class Outer:
    name: str = field(default="x", metadata={"help": "a name"})
    steps: int = field(default=3, metadata={"help": "steps"})
    cap: float | None = field(default=None, metadata={"help": "optional cap"})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "seeds"})
    params: dict[str, dict[str, object]] = field(default_factory=dict, metadata={"help": "free params"})
    flag: bool = field(default=False, metadata={"help": "a flag"})
    inner: Inner = field(default_factory=Inner, metadata={"help": "nested"})


def test_defaults_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 5\ninner:\n  rate: 0.25\nseeds: [1, 2]\nparams: {agpo: {lambda_neg: 1.0}}\n")
    config = load_config(Outer, path, ["inner.mode=b", "cap=2", "flag=true"])
    assert config == Outer(
        steps=5, cap=2.0, seeds=(1, 2), params={"agpo": {"lambda_neg": 1.0}}, flag=True, inner=Inner(0.25, "b")
    )
    assert isinstance(config.cap, float)
    assert load_config(Outer) == Outer()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stepz": 1}, r"unknown config key\(s\) \['stepz'\]; known keys here: cap, flag, inner"),
        ({"inner": {"rat": 1}}, r"\['inner.rat'\]; known keys here: mode, rate"),
        ({"steps": "five"}, "steps must be an integer, got 'five'"),
        ({"steps": True}, "steps must be an integer, got True"),
        ({"steps": 2.5}, "steps must be an integer, got 2.5"),
        ({"flag": "yes"}, "flag must be true or false, got 'yes'"),
        ({"seeds": 3}, "seeds must be a list, got 3"),
        ({"seeds": [1, "x"]}, r"seeds\[1\] must be an integer, got 'x'"),
        ({"inner": {"mode": "c"}}, r"inner.mode must be one of \['a', 'b'\], got 'c'"),
        ({"inner": {"rate": 2.0}}, "invalid config in inner: rate must be <= 1, got 2.0"),
        ({"inner": 3}, "inner must be a mapping, got 3"),
        ({"cap": "big"}, "cap must be a number, got 'big'"),
        ({"name": 7}, "name must be a string, got 7"),
    ],
)
def test_bad_values_name_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(Outer, data)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*missing\.yaml does not exist; fix the --config path"):
        load_config(Outer, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(Outer, bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must hold a mapping at the top, got list"):
        load_config(Outer, listy)
    with pytest.raises(ConfigError, match="must look like key=value"):
        load_config(Outer, (), ["steps"])
    with pytest.raises(ConfigError, match="'name' is not a section"):
        load_config(Outer, (), ["name=a", "name.sub=1"])


def test_round_trip_and_describe():
    config = load_config(ToyCompareConfig, (), ["toy.group_size=4", "toy.loss.eps_high=0.28"])
    again = from_dict(ToyCompareConfig, to_dict(config))
    assert again == config
    lines = describe(ToyCompareConfig)
    assert any(line.startswith("  toy.group_size (8): G, responses per prompt") for line in lines)
    assert any(line.startswith("  toy.loss.eps_high (0.2):") for line in lines)
    loss = lines.index("  [toy.loss] policy loss settings")  # a nested section: a header line, then its keys
    assert lines[loss + 1].startswith("  toy.loss.policy_loss ('ppo'):")
    assert any(line.startswith("  toy.adaptive.lambda_T (0.15):") for line in lines)


def test_stage_validation_surfaces_as_config_error():
    with pytest.raises(ConfigError, match="invalid config in toy: unknown algorithm 'ppo'"):
        load_config(ToyCompareConfig, (), ["toy.algorithms=[ppo]"])


def test_a_file_can_be_mounted_under_a_section(tmp_path):
    preset = tmp_path / "inner.yaml"
    preset.write_text("rate: 0.75\n")
    outer = tmp_path / "outer.yaml"
    outer.write_text("steps: 9\ninner: {mode: b}\n")
    config = load_config(Outer, [str(outer), f"inner={preset}"])
    assert config.steps == 9 and config.inner == Inner(rate=0.75, mode="b")


def test_a_partial_nested_override_keeps_the_fields_own_default():
    from pipelines.math.math_pipeline import MathPipelineConfig
    from pipelines.math.math_train import MathTrainConfig

    config = load_config(MathTrainConfig, [], ["model.hidden_size=64"])
    assert config.model.hidden_size == 64 and config.model.vocab_size == 400  # the field's default, not the class's
    pipeline = load_config(MathPipelineConfig, [], ["tracking.store_dir=/tmp/x"])
    assert pipeline.tracking.experiment == "math_rlvr" and pipeline.tracking.store_dir == "/tmp/x"


def test_several_training_processes_need_a_deepspeed_config():
    from pipelines.ads.teacher.train import TrainTeacherConfig

    with pytest.raises(ConfigError, match=r"processes=2 trains data-parallel through DeepSpeed: set deepspeed"):
        load_config(TrainTeacherConfig, [], ["processes=2"])
    config = load_config(TrainTeacherConfig, [], ["processes=2", "deepspeed=configs/deepspeed/zero1.json"])
    assert config.processes == 2
    with pytest.raises(ConfigError, match="processes"):
        load_config(TrainTeacherConfig, [], ["processes=0"])


@pytest.mark.parametrize(
    ("run_id", "problem"),
    [
        ("..", "is the parent folder"),
        (".", "is the folder it would go in"),
        ("../../etc", "holds the path separator '/'"),
    ],
)
def test_a_pipeline_run_id_that_leaves_its_folder_is_a_config_error(run_id, problem):
    from pipelines.ads.pipeline_config import AdsPipelineConfig
    from pipelines.math.math_pipeline import MathPipelineConfig

    for config_class in (AdsPipelineConfig, MathPipelineConfig):
        with pytest.raises(ConfigError, match=rf"invalid config: run_id '{re.escape(run_id)}' {problem}"):
            load_config(config_class, (), [f"run_id='{run_id}'"])


@pytest.mark.parametrize(
    "override",
    [
        "name=!!python/object:os.system ls",
        "name=!foo 1",
        "steps=[1",
        "params={[1]: 2}",
        "inner.mode=!!python/name:os.system",
    ],
)
def test_an_override_that_is_not_plain_yaml_is_a_config_error_naming_key_and_value(override):
    key, _, value = override.partition("=")
    with pytest.raises(ConfigError, match=rf"override {re.escape(repr(key))}: value {re.escape(repr(value))}"):
        load_config(Outer, (), [override])


def test_a_config_file_with_a_tag_or_keys_that_are_not_strings_is_a_config_error(tmp_path):
    tagged = tmp_path / "tagged.yaml"
    tagged.write_text("name: !!python/object/apply:os.system [ls]\n")
    with pytest.raises(ConfigError, match=r"tagged.yaml is not valid YAML: .*python/object/apply:os.system"):
        load_config(Outer, tagged)
    numbered = tmp_path / "numbered.yaml"
    numbered.write_text("1: 2\nname: a\ninner: {null: 3}\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['1'\]"):
        load_config(Outer, numbered)
    numbered.write_text("name: a\ninner: {null: 3, rate: 0.1}\n")
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) \['inner.None'\]"):
        load_config(Outer, numbered)


def test_the_trainer_keys_are_listed_under_their_sections():
    from pipelines.math.math_train_config import MathTrainConfig

    lines = describe(MathTrainConfig)
    header = lines.index(
        "  [trainer.optimizer] the update: AdamW, LR schedule, clipping, PPO epochs, micro-batches, trained layers"
    )
    assert lines[header + 1] == "  trainer.optimizer.learning_rate (0.0001): AdamW peak learning rate"
    for section in ("rollout", "advantage", "loss", "adaptive", "dapo", "optimizer", "checkpoint"):
        assert any(line.startswith(f"  [trainer.{section}] ") for line in lines), section
    assert not any(line.startswith("  trainer.learning_rate ") for line in lines)  # the old flat key is not offered


def test_an_old_flat_trainer_key_moves_to_its_section_with_one_warning_per_key(tmp_path, caplog):
    """The trainer's flat keys of the previous release (agpo.trainer_config.RENAMED_KEYS) still load, from a file,
    an override or a dict, each with one warning that names its new key; the result equals the new keys'."""
    from agpo.trainer_config import RENAMED_KEYS
    from pipelines.math.math_train_config import MathTrainConfig

    old_file = tmp_path / "old.yaml"
    old_file.write_text(
        "trainer:\n  learning_rate: 1.0e-5\n  checkpoint_every: 3\n  advantage_params: {lambda_neg: 0.25}\n"
        "  loss: {eps_high: 0.28}\n"
    )
    new_file = tmp_path / "new.yaml"
    new_file.write_text(
        "trainer:\n  optimizer: {learning_rate: 1.0e-5}\n  checkpoint: {every: 3}\n"
        "  advantage: {params: {lambda_neg: 0.25}}\n  loss: {eps_high: 0.28}\n"
    )
    with caplog.at_level("WARNING", logger="pipelines.config"):
        old = load_config(MathTrainConfig, [old_file], ["trainer.group_size=4", "trainer.rollout.temperature=0.7"])
    warnings = [r.getMessage() for r in caplog.records]
    assert sorted(warnings) == sorted(
        f"config key trainer.{key} is deprecated and will be removed in the next release: use trainer.{new}"
        for key, new in [
            ("learning_rate", "optimizer.learning_rate"),
            ("checkpoint_every", "checkpoint.every"),
            ("advantage_params", "advantage.params"),
            ("group_size", "rollout.group_size"),
        ]
    )
    new = load_config(MathTrainConfig, [new_file], ["trainer.rollout.group_size=4", "trainer.rollout.temperature=0.7"])
    assert old == new and new.trainer.optimizer.learning_rate == 1e-5 and new.trainer.rollout.group_size == 4
    assert new.trainer.rollout.prompts_per_step == 8 and new.trainer.optimizer.lr_schedule == "constant"  # defaults
    # the table names every key of the new sections, each once: every flat key of before has exactly one place
    assert sorted(RENAMED_KEYS.values()) == sorted(
        f"{section}.{key}"
        for section in ("rollout", "advantage", "dapo", "optimizer", "checkpoint")
        for key in to_dict(new.trainer)[section]
    )


def test_an_old_key_in_a_nested_stage_and_in_a_preset_over_a_config_is_moved(tmp_path, caplog):
    from pipelines.config import apply_presets
    from pipelines.math.math_compare_config import MathCompareConfig

    config = load_config(MathCompareConfig, [], ["train.trainer.ppo_epochs=2"])
    assert config.train.trainer.optimizer.ppo_epochs == 2 and config.train.trainer.token_budget == 40_000
    preset = tmp_path / "old_algorithm.yaml"
    preset.write_text("trainer: {algorithm: grpo, ppo_epochs: 3, dynamic_sampling: true}\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipelines.config"):
        merged = apply_presets(config.train, [preset], ["trainer.max_refill_rounds=5"])
    assert (merged.trainer.algorithm, merged.trainer.optimizer.ppo_epochs) == ("grpo", 3)
    assert merged.trainer.dapo.dynamic_sampling and merged.trainer.dapo.max_refill_rounds == 5
    assert len(caplog.records) == 3
    assert from_dict(MathCompareConfig, {"train": {"trainer": {"ppo_epochs": 2}}}) == config


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.learning_rate=1e-5", "trainer.optimizer.learning_rate=2e-5"],
        ["trainer.optimizer.learning_rate=2e-5", "trainer.learning_rate=1e-5"],
    ],
)
def test_an_old_key_and_its_new_key_both_set_is_a_config_error_naming_both(overrides):
    from pipelines.math.math_train_config import MathTrainConfig

    said = (
        "config keys trainer.learning_rate and trainer.optimizer.learning_rate are both set: trainer.learning_rate "
        "is the old name of trainer.optimizer.learning_rate; set only trainer.optimizer.learning_rate"
    )
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_config(MathTrainConfig, [], overrides)


def test_config_errors_never_echo_a_secret_and_redact_signed_urls():
    """A wrong value under a secret-named key shows as ***, and a presigned URL's signature (Azure's sig,
    S3's X-Amz-Signature) is redacted in errors as in MLflow params (issue 50, low items)."""
    import dataclasses

    from pipelines.config import from_dict, redact_urls

    @dataclasses.dataclass(frozen=True)
    class Service:
        api_key: int = 0
        endpoint: int = 0

    with pytest.raises(ConfigError, match=r"^api_key must be an integer, got \*\*\*$"):
        from_dict(Service, {"api_key": "hunter2"})
    with pytest.raises(ConfigError, match=r"got 'https://\*\*\*@host/x\?sig=\*\*\*&se=1'"):
        from_dict(Service, {"endpoint": "https://user:pw@host/x?sig=abc&se=1"})
    signed = "https://b.s3.amazonaws.com/k?X-Amz-Signature=abc123&X-Amz-Date=20261204"
    assert redact_urls(signed) == "https://b.s3.amazonaws.com/k?X-Amz-Signature=***&X-Amz-Date=20261204"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("lease_seconds", float("inf"), r"lease_seconds must be a number in \(0, 86400\], got inf"),
        ("lease_seconds", float("nan"), "got nan"),
        ("num_shards", 100_000, "num_shards must be at most 10,000"),
        ("chunk_pairs", 10_000_000, "chunk_pairs at most 1,000,000"),
    ],
)
def test_sharded_stages_bound_their_lease_shards_and_chunks(key, value, message):
    """lease_seconds=.inf used to be accepted and kill the heartbeat thread (OverflowError) while waiters on other
    hosts waited for ever; shards and chunks had no upper bound."""
    from pipelines.ads.annotation.annotate_config import AnnotateConfig
    from pipelines.ads.serving.score_config import ScoreConfig

    for config in (AnnotateConfig, ScoreConfig):
        with pytest.raises(ValueError, match=message):
            config(**{key: value})
