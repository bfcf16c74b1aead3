"""The ordinal head: hand-computed probabilities, monotone in the similarity for any parameters, and a
maximum-likelihood fit that recovers known parameters."""

import math

import pytest
import torch

from student.ordinal import OrdinalHead


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_probabilities_match_the_hand_computed_cumulative_logits():
    # a = 2, b = (-1, 0, 1), s = 0.5: a*s = 1, so P(>=1) = sigmoid(2), P(>=2) = sigmoid(1), P(>=3) = sigmoid(0)
    head = OrdinalHead(4, scale=2.0, thresholds=(-1.0, 0.0, 1.0))
    probs = head.probabilities(torch.tensor([0.5], dtype=torch.float32))[0].tolist()
    expected = [1 - sigmoid(2), sigmoid(2) - sigmoid(1), sigmoid(1) - 0.5, 0.5]  # 0.119203 0.149738 0.231059 0.5
    assert probs == pytest.approx(expected, abs=1e-6)
    assert head(torch.tensor([0.5]))[0].tolist() == pytest.approx([math.log(p) for p in expected], abs=1e-5)
    assert head.scale.item() == pytest.approx(2.0) and head.thresholds.tolist() == pytest.approx([-1, 0, 1], abs=1e-6)


def test_any_parameters_give_distributions_that_rise_with_the_similarity():
    torch.manual_seed(0)
    similarity = torch.linspace(-1, 1, 101)
    for _ in range(20):
        head = OrdinalHead(4)
        with torch.no_grad():
            for parameter in head.parameters():
                parameter.copy_(torch.randn_like(parameter) * 3)
        probs = head.probabilities(similarity)
        assert (probs >= 0).all() and torch.allclose(probs.sum(1), torch.ones(101), atol=1e-6)
        at_least = head.cumulative(similarity)
        assert (at_least[1:] >= at_least[:-1]).all()  # P(grade >= k) never falls as s rises
        expected_grade = (probs * torch.arange(4)).sum(1)
        assert (expected_grade[1:] >= expected_grade[:-1] - 1e-6).all()


def test_the_fit_recovers_the_parameters_that_made_the_grades():
    generator = torch.Generator().manual_seed(0)
    truth = OrdinalHead(4, scale=8.0, thresholds=(2.0, 4.0, 6.0))
    similarity = torch.rand(20000, generator=generator)
    grades = torch.multinomial(truth.probabilities(similarity).detach(), 1, generator=generator).squeeze(1)
    fitted = OrdinalHead(4).fit(similarity, grades)
    assert fitted.scale.item() == pytest.approx(8.0, abs=0.4)
    assert fitted.thresholds.tolist() == pytest.approx([2.0, 4.0, 6.0], abs=0.25)
    again = OrdinalHead(4).fit(similarity, grades)  # deterministic
    assert all(torch.equal(a, b) for a, b in zip(fitted.parameters(), again.parameters(), strict=True))


def test_weights_count_like_repeated_pairs_and_bad_input_names_itself():
    similarity, grades = torch.tensor([0.1, 0.4, 0.7, 0.9]), torch.tensor([0, 1, 3, 3])
    weighted = OrdinalHead(4).fit(similarity, grades, torch.tensor([1.0, 2.0, 1.0, 1.0]))
    repeated = OrdinalHead(4).fit(torch.tensor([0.1, 0.4, 0.4, 0.7, 0.9]), torch.tensor([0, 1, 1, 3, 3]))
    assert weighted.probabilities(similarity).detach() == pytest.approx(
        repeated.probabilities(similarity).detach(), abs=1e-4
    )
    with pytest.raises(ValueError, match=r"grades must be in 0..3, got \[0, 4\]"):
        OrdinalHead(4).fit(torch.tensor([0.1, 0.2]), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="need 3 increasing thresholds"):
        OrdinalHead(4, thresholds=(1.0, 0.0, 2.0))
    with pytest.raises(ValueError, match="weights must hold one non-negative weight"):
        OrdinalHead(4).fit(similarity, grades, torch.zeros(4))
