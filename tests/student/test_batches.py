"""The distillation's batches (student.batches): every pair once per epoch, length-grouped batches that pad
less than a random draw, seeded, and accumulated steps that equal one batch of all their pairs."""

import copy

import pytest
import torch

from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from student.batches import MEGABATCH, LabelledBatch, epoch_batches, optimizer_steps, text_lengths
from student.model import RelevanceStudent, StudentConfig
from student.training import DistilTrainingConfig, _train_epoch


def padding(batches, lengths):
    """Characters of padding: each pair padded to the longest of its batch."""
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_each_epoch_holds_every_pair_once_and_grouping_pads_less():
    lengths = [int(x) for x in torch.randint(5, 80, (1000,), generator=torch.Generator().manual_seed(1))]
    grouped = epoch_batches(lengths, 8, torch.Generator().manual_seed(0), length_grouped=True)
    shuffled = epoch_batches(lengths, 8, torch.Generator().manual_seed(0), length_grouped=False)
    for batches in (grouped, shuffled):
        assert sorted(i for b in batches for i in b) == list(range(1000))
        assert [len(b) for b in batches].count(8) == 125
    assert padding(grouped, lengths) < 0.2 * padding(shuffled, lengths)
    # within a mega-batch of 50 batches the order of batches is drawn, not longest first
    first = [max(lengths[i] for i in b) for b in grouped[:MEGABATCH]]
    assert first != sorted(first, reverse=True)
    assert grouped == epoch_batches(lengths, 8, torch.Generator().manual_seed(0), length_grouped=True)  # seeded


def test_optimizer_steps_group_consecutive_batches():
    assert optimizer_steps([[0], [1], [2], [3], [4]], 2) == [[[0], [1]], [[2], [3]], [[4]]]
    with pytest.raises(ValueError, match="accumulation_steps must be >= 1"):
        DistilTrainingConfig(accumulation_steps=0)
    with pytest.raises(ValueError, match="max_grad_norm must be > 0 or null"):
        DistilTrainingConfig(max_grad_norm=0.0)


def labelled(rows):
    return [
        {**r, "votes": [int(g == r["gold_grade"]) * 2 + 1 for g in range(4)], "grade": r["gold_grade"]}
        | {"confidence": 0.5 + 0.1 * (k % 5), "source": "teacher"}
        for k, r in enumerate(rows)
    ]


def test_a_step_of_two_batches_is_one_batch_of_all_their_pairs():
    """accumulation_steps 2 x batch 8 and one batch of 16, from the same weights on the same 16 pairs, take the
    same optimizer step (weights to 1e-6) and the same loss (dropout off); weights differ per pair, so the
    normaliser matters."""
    rows = labelled(generate_pairs(SyntheticConfig(train=16, audit=0, unlabeled=0, test=0, seed=2)))
    texts = [f"{r['query']} {r['ad_title']}" for r in rows]
    base = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300), texts=texts)
    for module in base.model.modules():  # dropout would draw other masks for other batch shapes
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    results = []
    for batch_size, steps in ((16, 1), (8, 2)):
        student = copy.deepcopy(base)
        config = DistilTrainingConfig(
            batch_size=batch_size, accumulation_steps=steps, learning_rate=1e-2, length_grouped=False
        )
        optimizer = torch.optim.SGD(student.model.parameters(), lr=1e-2)  # linear in the gradient: comparable
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        # both draw the same permutation; a batch of 16 is the first 8 pairs then the next 8
        loss = _train_epoch(student, rows, optimizer, scheduler, torch.Generator().manual_seed(0), config)
        results.append((loss, student.model.state_dict()))
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for name, value in results[0][1].items():
        assert torch.allclose(value, results[1][1][name], atol=1e-6), name


def test_the_collate_tokenizes_the_kinds_groups_and_builds_the_targets():
    rows = labelled(generate_pairs(SyntheticConfig(train=4, audit=0, unlabeled=0, test=0, seed=2)))
    student = RelevanceStudent.build(StudentConfig(tiny_hidden=32, tiny_vocab=300, kind="hybrid"), texts=["a b"])
    batch = LabelledBatch(student.tokenizer, ("pair", "query", "ad"), 16, True, 0.5)(rows)
    assert set(batch["features"]) >= {"input_ids", "query_input_ids", "ad_input_ids"}
    assert batch["weights"].tolist() == pytest.approx([0.25, 0.3, 0.35, 0.4])  # confidence x teacher_weight
    assert batch["gold"].tolist() == [r["gold_grade"] for r in rows]
    assert text_lengths(rows[:1]) == [len(rows[0]["query"]) + len(rows[0]["ad_title"])]
