"""An ordinal grade head on one score: the cumulative-logit (proportional-odds) model.

For a similarity s (the cosine of a query and an ad embedding) and grades 0..K-1:

    P(grade >= k | s) = sigmoid(a * s - b_k),   k = 1..K-1,   a > 0,   b_1 < b_2 < ... < b_{K-1}
    p_0 = 1 - P(grade >= 1),   p_k = P(grade >= k) - P(grade >= k+1),   p_{K-1} = P(grade >= K-1)

with a = softplus(raw_scale), b_1 = raw_first and b_{k+1} = b_k + softplus(raw_gap_k), so every parameter
value gives a valid, monotone distribution: P(grade >= k) rises with s for every k, hence the expected grade
and P(relevant) rank pairs exactly as s does (an ROC-AUC or NDCG computed from them equals that of s).

``fit`` sets the parameters by weighted maximum likelihood, sum_i w_i * -log p_{y_i}(s_i) / sum_i w_i plus
``l2`` * ||raw||^2 (which keeps the fit finite when a grade is absent or the grades are separable), with
L-BFGS in float64: deterministic, and a few milliseconds for thousands of pairs. It is how a sentence
encoder's cosine is mapped to grades (the zero-shot baseline) and how a bi-encoder student's head starts.
"""

from __future__ import annotations

from itertools import pairwise

import torch

MIN_PROBABILITY = 1e-9  # log-probabilities are taken of probabilities clamped here


class OrdinalHead(torch.nn.Module):
    """The cumulative-logit head of the module docstring for ``num_grades`` grades."""

    def __init__(self, num_grades: int, scale: float = 5.0, thresholds: tuple[float, ...] | None = None) -> None:
        super().__init__()
        if num_grades < 2:
            raise ValueError(f"num_grades must be >= 2, got {num_grades}")
        thresholds = thresholds or tuple(float(k) for k in range(1, num_grades))
        if len(thresholds) != num_grades - 1 or any(b <= a for a, b in pairwise(thresholds)):
            raise ValueError(f"need {num_grades - 1} increasing thresholds, got {list(thresholds)}")
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.raw_scale = torch.nn.Parameter(torch.tensor(_softplus_inverse(scale)))
        self.raw_first = torch.nn.Parameter(torch.tensor(float(thresholds[0])))
        gaps = [b - a for a, b in pairwise(thresholds)]
        self.raw_gaps = torch.nn.Parameter(torch.tensor([_softplus_inverse(g) for g in gaps], dtype=torch.float32))

    @property
    def scale(self) -> torch.Tensor:
        return torch.nn.functional.softplus(self.raw_scale)

    @property
    def thresholds(self) -> torch.Tensor:
        gaps = torch.nn.functional.softplus(self.raw_gaps)
        return torch.cat([self.raw_first.reshape(1), self.raw_first + torch.cumsum(gaps, 0)])

    def cumulative(self, similarity: torch.Tensor) -> torch.Tensor:
        """P(grade >= k | s) for k = 1..K-1: [N, K-1]."""
        return torch.sigmoid(self.scale * similarity.unsqueeze(-1) - self.thresholds)

    def probabilities(self, similarity: torch.Tensor) -> torch.Tensor:
        """p_0..p_{K-1}: [N, K]."""
        at_least = self.cumulative(similarity)
        ones, zeros = torch.ones_like(at_least[:, :1]), torch.zeros_like(at_least[:, :1])
        bounds = torch.cat([ones, at_least, zeros], -1)
        return bounds[:, :-1] - bounds[:, 1:]

    def forward(self, similarity: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [N, K] (logits whose softmax is ``probabilities``)."""
        return self.probabilities(similarity).clamp_min(MIN_PROBABILITY).log()

    def fit(
        self,
        similarity: torch.Tensor,
        grades: torch.Tensor,
        weights: torch.Tensor | None = None,
        l2: float = 1e-4,
        max_iter: int = 200,
    ) -> OrdinalHead:
        """Weighted maximum likelihood of the module docstring (in place); returns the head."""
        if similarity.ndim != 1 or similarity.shape != grades.shape or not len(grades):
            raise ValueError(f"need one similarity per grade, got {tuple(similarity.shape)} and {tuple(grades.shape)}")
        num_grades = self.raw_gaps.numel() + 2
        if grades.min() < 0 or grades.max() >= num_grades:
            raise ValueError(f"grades must be in 0..{num_grades - 1}, got {sorted(set(grades.tolist()))}")
        weights = torch.ones(len(grades)) if weights is None else weights
        if weights.shape != grades.shape or (weights < 0).any() or not weights.sum() > 0:
            raise ValueError("weights must hold one non-negative weight per grade, not all zero")
        work = OrdinalHead(num_grades).double()
        work.load_state_dict({k: v.double() for k, v in self.state_dict().items()})
        s, y, w = similarity.double(), grades.long(), weights.double() / weights.double().sum()
        optimizer = torch.optim.LBFGS(work.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")

        def loss() -> torch.Tensor:
            optimizer.zero_grad()
            log_p = work(s).gather(1, y.unsqueeze(1)).squeeze(1)
            value = -(w * log_p).sum() + l2 * sum((p**2).sum() for p in work.parameters())
            value.backward()
            return value

        with torch.enable_grad():
            optimizer.step(loss)
        self.load_state_dict({k: v.to(self.raw_scale.dtype) for k, v in work.state_dict().items()})
        return self


def _softplus_inverse(value: float) -> float:
    """x with softplus(x) = value (> 0)."""
    return float(torch.log(torch.expm1(torch.tensor(float(value), dtype=torch.float64))))
