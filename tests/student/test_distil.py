"""Distillation: the loss against hand values, and a tiny student that learns the synthetic task from
teacher-style votes and beats the majority-class baseline on gold test pairs."""

import math
import random

import pytest
import torch

from durable.checkpoint import CheckpointError
from evaluation.metrics import accuracy, validation_scores
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from student.batches import label_probs, pair_weights
from student.model import RelevanceStudent, StudentConfig
from student.training import (
    DistilTrainingConfig,
    _optimizer,
    distill_loss,
    resolved_schedule,
    soft_targets,
    usable_labels,
)
from student.training import distil as train_student


def distil(*args, **kwargs):
    """The library's training loop, early-stopping on the evaluation room's figures, as every stage runs it."""
    return train_student(*args, score=validation_scores, **kwargs)


def test_soft_targets_and_loss_hand_values():
    assert torch.allclose(soft_targets(torch.tensor([[3, 1]]), 1.0, 0.0), torch.tensor([[0.75, 0.25]]))
    # T = 2 flattens: sqrt(3), sqrt(1) normalised
    assert torch.allclose(soft_targets(torch.tensor([[3, 1]]), 2.0, 0.0), torch.tensor([[0.6340, 0.3660]]), atol=1e-4)
    config = DistilTrainingConfig(temperature=1.0, alpha=1.0, vote_smoothing=0.0)
    logits = torch.zeros(1, 2)
    loss = distill_loss(logits, torch.tensor([[3, 1]]), torch.tensor([0]), torch.ones(1), config)
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert float(loss) == pytest.approx(kl)
    hard_only = DistilTrainingConfig(alpha=0.0)
    loss = distill_loss(logits, torch.tensor([[3, 1]]), torch.tensor([0]), torch.ones(1), hard_only)
    assert float(loss) == pytest.approx(math.log(2))
    # confidence weights: a weight-0 pair contributes nothing
    two = distill_loss(
        torch.tensor([[0.0, 0.0], [5.0, -5.0]]),
        torch.tensor([[0, 4], [4, 0]]),
        torch.tensor([1, 0]),
        torch.tensor([1.0, 0.0]),
        hard_only,
    )
    assert float(two) == pytest.approx(math.log(2))
    gold = DistilTrainingConfig(alpha=0.0, gold_weight=1.0)
    loss = distill_loss(logits, torch.tensor([[3, 1]]), torch.tensor([0]), torch.ones(1), gold, gold=torch.tensor([1]))
    assert float(loss) == pytest.approx(2 * math.log(2))


def test_exact_grade_probabilities_are_tempered_but_not_smoothed():
    """Score-mode labels carry p (grade_probs): q = normalize(p^(1/T)); rows without p keep the votes' rule."""
    rows = [{"votes": [0, 0], "grade_probs": [0.64, 0.36]}, {"votes": [3, 1], "grade_probs": None}, {"votes": [1, 1]}]
    probs = label_probs(rows, 2)
    assert probs.tolist() == [pytest.approx([0.64, 0.36]), [0.0, 0.0], [0.0, 0.0]]
    targets = soft_targets(torch.tensor([r["votes"] for r in rows]), 2.0, 0.1, probs)
    votes = [math.sqrt(3.1) / (math.sqrt(3.1) + math.sqrt(1.1)), math.sqrt(1.1) / (math.sqrt(3.1) + math.sqrt(1.1))]
    assert targets.tolist() == [pytest.approx([0.8 / 1.4, 0.6 / 1.4]), pytest.approx(votes), pytest.approx([0.5, 0.5])]
    config = DistilTrainingConfig(temperature=1.0, alpha=1.0, vote_smoothing=0.1)
    loss = distill_loss(
        torch.zeros(1, 2), torch.tensor([[0, 0]]), torch.tensor([0]), torch.ones(1), config, probs=probs[:1]
    )
    assert float(loss) == pytest.approx(0.64 * math.log(0.64 / 0.5) + 0.36 * math.log(0.36 / 0.5), abs=1e-6)


def teacher_votes(gold: int, rng: random.Random, votes: int = 4, accuracy_: float = 0.8) -> list[int]:
    """Votes of a teacher that is right with probability ``accuracy_`` per vote (input data for the test)."""
    counts = [0, 0, 0, 0]
    for _ in range(votes):
        counts[gold if rng.random() < accuracy_ else rng.choice([g for g in range(4) if g != gold])] += 1
    return counts


@pytest.mark.integration
def test_a_tiny_student_beats_the_majority_baseline_on_gold_test_pairs():
    rows = generate_pairs(SyntheticConfig(train=1500, audit=200, unlabeled=300, test=0, seed=3))
    rng = random.Random(0)
    labels = []
    for r in (r for r in rows if r["split"] == "train"):
        votes = teacher_votes(r["gold_grade"], rng)
        grade = max(range(4), key=lambda g: (votes[g], -g))
        labels.append({**r, "votes": votes, "grade": grade, "confidence": votes[grade] / 4, "gold_grade": None})
    validation = [r for r in rows if r["split"] == "audit"]
    test = [r for r in rows if r["split"] == "unlabeled"]
    student = RelevanceStudent.build(StudentConfig(), texts=[r["query"] + " " + r["ad_title"] for r in rows])
    result = distil(student, labels, validation, DistilTrainingConfig(epochs=8, learning_rate=2e-3))
    predicted = student.predict_proba([r["query"] for r in test], [r["ad_title"] for r in test]).argmax(1).tolist()
    gold = [r["gold_grade"] for r in test]
    majority = max(range(4), key=[r["gold_grade"] for r in labels].count)
    baseline = accuracy(y_true=gold, y_pred=[majority] * len(gold))
    assert accuracy(y_true=gold, y_pred=predicted) > baseline + 0.1, (result.history, baseline)
    assert result.best_epoch >= 1 and len(result.history) <= 8


def test_bad_inputs():
    student = RelevanceStudent.build(StudentConfig(), texts=["red shoes nike"] * 5)
    with pytest.raises(ValueError, match="mismatched lengths"):
        student.predict_proba(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="no labeled pairs"):
        distil(
            student,
            [{"query": "a", "ad_title": "b", "votes": [0] * 4, "grade": None, "confidence": 0.0}],
            [{"query": "a", "ad_title": "b", "gold_grade": 0}],
            DistilTrainingConfig(),
        )
    with pytest.raises(FileNotFoundError, match="neither 'tiny', a packaged name"):
        RelevanceStudent.build(StudentConfig(backbone="/nonexistent"))


@pytest.mark.integration
def test_minilm_backbone_loads_offline_and_round_trips(tmp_path):
    cross = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", kind="cross"))
    assert sum(p.numel() for p in cross.model.parameters()) == 22_714_756  # 22.7 M encoder + a 4-grade head
    student = RelevanceStudent.build(StudentConfig(backbone="all-minilm-l6-v2", kind="hybrid"))
    assert sum(p.numel() for p in student.model.parameters()) == 22_714_756 + 4  # + scale and 3 thresholds
    before = student.predict_proba(["red nike shoes", "sofa"], ["nike running shoes, red", "table lamp"])
    assert before.shape == (2, 4) and abs(before.sum(1) - 1).max() < 1e-5
    loaded = RelevanceStudent.load(student.save(tmp_path / "student"))
    after = loaded.predict_proba(["red nike shoes", "sofa"], ["nike running shoes, red", "table lamp"])
    assert abs(after - before).max() < 1e-6


class Killed(Exception):
    """Stands in for a SIGKILL between epochs."""


def small_task(seed: int = 5):
    rows = generate_pairs(SyntheticConfig(train=120, audit=30, unlabeled=0, test=0, seed=seed))
    labels = [
        {
            **r,
            "votes": [int(g == r["gold_grade"]) * 2 for g in range(4)],
            "grade": r["gold_grade"],
            "confidence": 1.0,
            "gold_grade": None,
        }
        for r in rows
        if r["split"] == "train"
    ]
    validation = [r for r in rows if r["split"] == "audit"]
    texts = [r["query"] + " " + r["ad_title"] for r in rows]
    return labels, validation, texts


@pytest.mark.parametrize("kind", ["cross", "hybrid"])
def test_distillation_resumes_after_a_kill_with_the_weights_of_an_uninterrupted_run(tmp_path, kind):
    """The hybrid's head is fitted once, before epoch 1, and restored (not refitted) on resume."""
    labels, validation, texts = small_task()
    # the linear schedule makes the learning rate depend on the step: the resumed run must restore it
    config = DistilTrainingConfig(epochs=4, patience=4, batch_size=16, learning_rate=2e-3, schedule="linear")
    whole = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind=kind), texts=texts)
    expected = distil(whole, labels, validation, config)

    def kill_after_epoch_2(record):
        if record["epoch"] == 2:
            raise Killed

    first = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind=kind), texts=texts)
    with pytest.raises(Killed):
        distil(first, labels, validation, config, on_epoch=kill_after_epoch_2, checkpoint_dir=tmp_path)
    resumed = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, seed=9, kind=kind), texts=texts)
    seen = []
    result = distil(resumed, labels, validation, config, on_epoch=seen.append, checkpoint_dir=tmp_path)
    # replayed history (the hybrid's starting point, epoch 0, first), then the epochs that were left
    assert [r["epoch"] for r in seen] == [*([0] if kind == "hybrid" else []), 1, 2, 3, 4]
    assert result.history == expected.history and result.best_epoch == expected.best_epoch
    assert (expected.resumed_from_epoch, result.resumed_from_epoch) == (None, 2)
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(tensor, resumed.model.state_dict()[name]), name
    # a finished run reruns as a no-op with the same result
    again = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind=kind), texts=texts)
    rerun = distil(again, labels, validation, config, checkpoint_dir=tmp_path)
    assert rerun.history == expected.history and rerun.resumed_from_epoch == 4


def test_a_checkpoint_of_other_data_or_config_is_refused(tmp_path):
    labels, validation, texts = small_task()
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts)
    distil(student, labels, validation, DistilTrainingConfig(epochs=1), checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match=r"different run.*learning_rate"):
        distil(student, labels, validation, DistilTrainingConfig(epochs=1, learning_rate=1e-3), checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match=r"different run.*data_blake2b"):
        distil(student, labels[1:], validation, DistilTrainingConfig(epochs=1), checkpoint_dir=tmp_path)


@pytest.mark.parametrize(
    ("changed", "key"),
    [
        (lambda row: {**row, "confidence": 0.5}, "confidence_blake2b"),
        (lambda row: {**row, "gold_grade": (row["grade"] + 1) % 4}, "gold_grade_blake2b"),
        (lambda row: {**row, "grade_probs": [0.1, 0.2, 0.3, 0.4]}, "data_blake2b"),
        (lambda row: {**row, "source": "teacher"}, "source_blake2b"),
    ],
    ids=["confidence", "gold_grade", "grade_probs", "source"],
)
def test_labels_that_differ_only_in_a_loss_input_are_refused(tmp_path, changed, key):
    """Same pairs, votes and grades; another confidence (the pair weight), gold grade (the gold term) or exact
    grade probabilities (the soft target)."""
    labels, validation, texts = small_task()
    config = DistilTrainingConfig(epochs=1, gold_weight=1.0)
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts)
    distil(student, labels, validation, config, checkpoint_dir=tmp_path)
    edited = [changed(labels[0]), *labels[1:]]
    with pytest.raises(CheckpointError, match=rf"different run \(checkpoint -> this run: {key}: \"[0-9a-f]+\" -> "):
        distil(student, edited, validation, config, checkpoint_dir=tmp_path)


def test_early_stopping_waits_for_min_epochs():
    labels, validation, texts = small_task()

    def epochs_run(min_epochs: int) -> int:
        student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts)
        config = DistilTrainingConfig(
            epochs=6, patience=1, min_epochs=min_epochs, learning_rate=1e-9
        )  # nothing improves
        return len(distil(student, labels, validation, config).history)

    assert epochs_run(0) == 2  # epoch 1 is the best, epoch 2 is stale: stop
    assert epochs_run(4) == 4


def test_the_linear_schedule_is_transformers_warm_up_then_decay_over_the_optimizer_steps():
    """5 batches of 32 pairs per epoch, 2 batches per step: 3 steps an epoch, 9 in 3 epochs, warm-up int(0.25 * 9)
    = 2 steps: step/2 for steps 0-1, then (9 - step) / 7 (get_linear_schedule_with_warmup)."""
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=["red shoes"] * 5)
    student.pretrained = True  # the linear schedule of a fine-tuned encoder
    config = DistilTrainingConfig(epochs=3, warmup_ratio=0.25, accumulation_steps=2, learning_rate=1.0)
    optimizer, scheduler = _optimizer(student, config, pairs=150)
    rates = []
    for _ in range(9):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates == pytest.approx([0.0, 0.5, 1.0, 6 / 7, 5 / 7, 4 / 7, 3 / 7, 2 / 7, 1 / 7])
    constant = _optimizer(student, DistilTrainingConfig(learning_rate=0.3, schedule="constant"), 150)
    assert constant[1].get_last_lr() == [0.3]


def test_the_backbone_picks_the_rate_and_schedule_unless_set():
    assert resolved_schedule(DistilTrainingConfig(), pretrained=False) == (5e-4, "constant")
    assert resolved_schedule(DistilTrainingConfig(), pretrained=True) == (1e-4, "linear")
    assert resolved_schedule(DistilTrainingConfig(learning_rate=1e-4, schedule="constant"), pretrained=True) == (
        1e-4,
        "constant",
    )
    with pytest.raises(ValueError, match="schedule must be one of"):
        DistilTrainingConfig(schedule="cosine")


def test_teacher_rows_are_weighted_by_teacher_weight_and_left_out_at_zero():
    rows = [
        {"grade": 2, "confidence": 0.5, "source": "teacher"},
        {"grade": 3, "confidence": 1.0, "source": "gold"},
        {"grade": 1, "confidence": 1.0, "source": "human"},
        {"grade": None, "confidence": 0.0, "source": "teacher"},
    ]
    assert pair_weights(rows[:3], confidence_weighting=True, teacher_weight=0.25) == [0.125, 1.0, 1.0]
    assert pair_weights(rows[:3], confidence_weighting=False, teacher_weight=0.25) == [0.25, 1.0, 1.0]
    assert list(usable_labels(rows, teacher_weight=1.0)) == rows[:3]  # the abstained row is skipped
    assert list(usable_labels(rows, teacher_weight=0.0)) == rows[1:3]
    with pytest.raises(ValueError, match="teacher_weight must be >= 0, got -1"):
        DistilTrainingConfig(teacher_weight=-1)


def test_a_bi_student_starts_from_its_head_fitted_to_the_labels():
    labels, validation, texts = small_task()
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=texts)
    expected = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=texts)
    expected.fit_head([r["query"] for r in labels], [r["ad_title"] for r in labels], [r["grade"] for r in labels])
    distil(student, labels, validation, DistilTrainingConfig(epochs=1, min_epochs=1, learning_rate=1e-12))
    assert torch.allclose(student.model.head.thresholds, expected.model.head.thresholds, atol=1e-5)
    assert not torch.allclose(expected.model.head.thresholds, torch.tensor([1.0, 2.0, 3.0]))  # moved from the defaults


def test_a_bi_student_is_scored_before_training_and_keeps_its_start_when_no_epoch_beats_it():
    """Epoch 0 is the encoder's cosine through the fitted head (the zero-shot baseline when the labels are
    gold): training that does not beat it on audit ROC-AUC is not kept."""
    labels, validation, texts = small_task()
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=texts)
    start = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="bi"), texts=texts)
    start.fit_head([r["query"] for r in labels], [r["ad_title"] for r in labels], [r["grade"] for r in labels])
    # a rate so small that no epoch changes a ranking: no epoch is strictly better than the start
    config = DistilTrainingConfig(epochs=2, min_epochs=2, batch_size=32, learning_rate=1e-12)
    result = distil(student, labels, validation, config)
    assert [r["epoch"] for r in result.history] == [0, 1, 2] and result.history[0]["loss"] is None
    assert result.best_epoch == 0 and result.best_val == result.history[0]["val_roc_auc_relevant"]
    assert set(result.history[0]) == {"epoch", "loss", "val_macro_f1", "val_roc_auc_relevant"}
    for name, tensor in start.model.state_dict().items():
        assert torch.equal(tensor, student.model.state_dict()[name]), name


def test_the_selection_metric_picks_the_epoch_and_roc_auc_needs_both_sides_of_relevant():
    labels, validation, texts = small_task()
    config = DistilTrainingConfig(epochs=3, min_epochs=3, batch_size=32, selection_metric="macro_f1")
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts)
    result = distil(student, labels, validation, config)
    scores = [r["val_macro_f1"] for r in result.history]
    assert result.best_epoch == 1 + scores.index(max(scores)) and result.best_val == max(scores)
    relevant_only = [r for r in validation if r["gold_grade"] >= 2]
    with pytest.raises(
        ValueError,
        match=r"every gold validation pair is relevant \(grades \[2, 3\], relevant from 2\).*selection_metric=macro_f1",
    ):
        distil(student, labels, relevant_only, DistilTrainingConfig(epochs=1))
    # as the message says: macro-F1 picks the epoch on such an audit split, and ROC-AUC is recorded as absent
    on_macro_f1 = DistilTrainingConfig(epochs=1, min_epochs=1, selection_metric="macro_f1")
    assert distil(student, labels, relevant_only, on_macro_f1).history[-1]["val_roc_auc_relevant"] is None
    with pytest.raises(ValueError, match=r"relevant_from 4 leaves no relevant .* in 1\.\.3"):
        distil(student, labels, validation, DistilTrainingConfig(epochs=1, relevant_from=4))
    with pytest.raises(ValueError, match="selection_metric must be one of"):
        DistilTrainingConfig(selection_metric="accuracy")
