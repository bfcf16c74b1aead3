"""Class-balanced SFT on synthetic pairs at real-world imbalance (grade_weights 0.1, 0.1, 0.3, 1.0: most
pairs Exact): what each step trained on and the loss it reported, read from the model's own forward passes.
``sample`` trains on every grade equally often; ``loss`` sees each pair once per epoch and reports
(1/|B|) sum w_i l_i with w_i = N / (K * count of its grade); ``none`` the plain token mean."""

from collections import Counter

import pytest
import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2, train_bpe_tokenizer
from agpo.sft import IGNORE, SFTConfig, supervised_finetune, tokenize_example
from pipelines.ads.intake.synthetic import SyntheticConfig, generate_pairs
from pipelines.ads.teacher.prompts import RELEVANCE_V1

SKEWED = SyntheticConfig(train=120, audit=0, unlabeled=0, test=0, grade_weights=(0.1, 0.1, 0.3, 1.0))
EPOCHS = 3


class Recorder(torch.nn.Module):
    """The model, with every forward pass's rows (padding cut off) and logits kept."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask)
        rows = [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(input_ids, attention_mask, strict=True)]
        self.calls.append((rows, out.logits.detach()))
        return out


@pytest.fixture(scope="module")
def skewed():
    rows = generate_pairs(SKEWED)
    examples = [(RELEVANCE_V1.render_pair(r), RELEVANCE_V1.target(r["gold_grade"], r["rationale"])) for r in rows]
    grades = [r["gold_grade"] for r in rows]
    tokenizer = train_bpe_tokenizer([p + c for p, c in examples], vocab_size=320)
    return examples, grades, tokenizer


def train(skewed, balance):
    examples, grades, tokenizer = skewed
    shape = TinyModelConfig(vocab_size=320, hidden_size=64, num_layers=1, intermediate_size=128)
    model = Recorder(build_tiny_qwen2(tokenizer, shape))
    config = SFTConfig(epochs=EPOCHS, batch_size=16, learning_rate=3e-3, balance=balance)
    losses = supervised_finetune(model, tokenizer, examples, config, classes=grades)
    encoded = {}  # input ids -> (labels, grade): what a recorded row was
    for (prompt, completion), grade in zip(examples, grades, strict=True):
        ids, labels = tokenize_example(tokenizer, prompt, completion)
        encoded[tuple(ids)] = (labels, grade)
    return losses, model.calls, encoded


def token_losses(logits, rows, encoded):
    """Per row: the cross-entropy of each completion token, from the logits the step computed."""
    out = []
    for row, (labels, _) in enumerate(encoded[r] for r in rows):
        target = torch.tensor(labels[1:])
        ce = torch.nn.functional.cross_entropy(
            logits[row, : len(labels) - 1].float(), target, ignore_index=IGNORE, reduction="none"
        )
        out.append(ce[target != IGNORE])
    return out


def test_the_synthetic_set_is_skewed_like_real_labels(skewed):
    counts = Counter(skewed[1])
    assert counts == {3: 84, 2: 16, 1: 5, 0: 15}  # seed 0: 70% Exact (the rule turns some 2s into 3s)


def test_sample_balance_trains_every_grade_equally_often(skewed):
    losses, calls, encoded = train(skewed, "sample")
    assert len(losses) == len(calls) == EPOCHS * 8  # 120 pairs in batches of 16, as without balance
    epoch_rows = [[row for rows, _ in calls[e * 8 : (e + 1) * 8] for row in rows] for e in range(EPOCHS)]
    for rows in epoch_rows:
        assert Counter(encoded[row][1] for row in rows) == {0: 30, 1: 30, 2: 30, 3: 30}  # data: 70% grade 3
        assert max(Counter(row for row in rows if encoded[row][1] == 3).values()) == 1  # 30 of the 84, once
        assert sorted(Counter(row for row in rows if encoded[row][1] == 1).values()) == [6] * 5  # 30 slots, 5 pairs


@pytest.mark.parametrize("balance", ["loss", "none"])
def test_loss_balance_weights_each_pair_by_its_grade_and_sees_each_once(skewed, balance):
    losses, calls, encoded = train(skewed, balance)
    grades = skewed[1]
    counts = Counter(grades)
    weight = {g: len(grades) / (len(counts) * n) for g, n in counts.items()}  # 120 / (4 * n_g)
    assert weight[3] == pytest.approx(120 / 336) and weight[1] == pytest.approx(6.0)
    seen = Counter(encoded[row][1] for rows, _ in calls for row in rows)
    assert seen == {g: EPOCHS * n for g, n in counts.items()}  # every pair once per epoch: the data's skew
    for loss, (rows, logits) in zip(losses, calls, strict=True):
        per_token = token_losses(logits, rows, encoded)
        if balance == "loss":
            expected = sum(weight[encoded[r][1]] * t.mean() for r, t in zip(rows, per_token, strict=True)) / len(rows)
        else:
            expected = torch.cat(per_token).mean()
        assert loss == pytest.approx(float(expected), rel=1e-5)
