"""train-compare's grid: every entry is a preset merged over the shared run; seeds aggregate to mean ± sd."""

import pytest

from pipelines.config import load_config
from pipelines.experiments.train_compare import CompareConfig, aggregate, markdown_table, run_config


def test_each_run_merges_its_preset_seed_budget_and_folder(tmp_path):
    config = CompareConfig(out_dir=str(tmp_path), algorithms=("gspo", "agpo_always"), seeds=(0, 2))
    gspo = run_config(config, "gspo", 2)
    assert gspo.trainer.algorithm == "grpo" and gspo.trainer.optimizer.ppo_epochs == 2
    loss = gspo.trainer.loss
    assert (loss.policy_loss, loss.eps_low, loss.eps_high) == ("gspo", 3e-4, 4e-4)
    assert gspo.trainer.seed == 2 and gspo.trainer.token_budget == 40_000 and gspo.trainer.max_steps >= 10_000
    assert gspo.out_dir == str(tmp_path / "gspo" / "seed-2")
    always = run_config(config, "agpo_always", 0)
    assert always.trainer.advantage.params["neg_gate"] == "always" and always.trainer.loss.policy_loss == "ppo"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"algorithms": ("ppo_magic",)}, "no preset configs/train/ppo_magic.yaml"),
        ({"algorithms": ("../grpo",)}, "algorithms entry"),
        ({"seeds": ()}, "at least one each"),
        ({"token_budget": 0}, "token_budget must be >= 1"),
    ],
)
def test_bad_grids_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompareConfig(**kwargs)


def run_summary(algorithm, seed, sampled, greedy):
    return {
        "algorithm": algorithm,
        "seed": seed,
        "audit_accuracy_start": 0.5 + seed / 100,
        "audit_accuracy_end": sampled,
        "audit_maj@4_start": 0.6,
        "audit_maj@4_end": sampled + 0.05,
        "audit_greedy_accuracy_start": 0.7,
        "audit_greedy_accuracy_end": greedy,
        "steps": 10 + seed,
        "generated_tokens": 1000,
        "seconds": 60.0,
    }


def test_mean_and_sample_sd_over_seeds():
    runs = [run_summary("grpo", 0, 0.6, 0.7), run_summary("grpo", 1, 0.8, 0.7), run_summary("agpo", 0, 0.5, 0.6)]
    table = aggregate(runs, samples=4)
    grpo, agpo = table
    assert grpo["seeds"] == [0, 1] and grpo["audit_accuracy_end"] == pytest.approx(0.7)
    assert grpo["audit_accuracy_end_sd"] == pytest.approx(0.1414214, abs=1e-6)  # sample sd of 0.6 and 0.8
    assert grpo["audit_greedy_accuracy_end_sd"] == 0.0 and grpo["steps"] == 10.5
    assert agpo["audit_accuracy_end_sd"] == 0.0  # one seed
    markdown = markdown_table(table, runs, CompareConfig(seeds=(0, 1)), samples=4)
    assert "| grpo | 0.700 ± 0.141 | 0.750 ± 0.141 | 0.700 ± 0.000 | 10 | 1,000 | 1.0 |" in markdown
    assert "| SFT start | 0.503 ± 0.006 |" in markdown  # the sampled start differs by seed: 0.50, 0.51, 0.50


def test_the_smollm2_scale_preset_loads_under_train():
    config = load_config(CompareConfig, ["train=configs/smollm2-rl.yaml"], ["algorithms=[grpo, agpo]"])
    trainer = config.train.trainer
    assert (trainer.optimizer.trainable_layers, trainer.rollout.max_new_tokens, config.train.audit_samples) == (8, 8, 4)
