"""How the teacher's answers for a pair become its label (``VotingConfig``: sampled votes or the exact grade
distribution); pipelines.ads.teacher.labeling applies it (its docstring has the rules). Needs no torch, so
configs validate without it."""

from __future__ import annotations

from dataclasses import dataclass, field

from agpo.checks import require_choice, require_int

MODES = ("sample", "score")
SCORE_NEEDS_HF = "mode: score needs engine: hf (it reads the teacher's log-probs of each grade); set engine: hf"


@dataclass(frozen=True)
class VotingConfig:
    """How the teacher's answers for a pair become its label: sampled votes or the exact grade distribution."""

    mode: str = field(
        default="sample",
        metadata={
            "help": "sample: majority of `votes` sampled answers; score: the teacher's exact grade distribution "
            "after its greedy reason (deterministic, engine hf only; near one-hot after a reason)"
        },
    )
    votes: int = field(default=4, metadata={"help": "answers sampled per pair"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the votes"})
    max_new_tokens: int = field(default=24, metadata={"help": "longest answer in tokens"})
    max_retries: int = field(default=2, metadata={"help": "extra rounds for votes whose answer did not parse"})
    review_threshold: float = field(
        default=0.75, metadata={"help": "pairs with confidence below this (or abstained) go to the review queue"}
    )
    batch_pairs: int = field(default=128, metadata={"help": "pairs per generation call (rows = pairs x votes)"})
    seed: int = field(default=0, metadata={"help": "sampling seed (per pair: hash of seed and pair_id)"})
    constrained: bool = field(
        default=True,
        metadata={
            "help": "decode within the answer grammar (reason, <answer>k</answer>, EOS): every answer parses; "
            "needs max_new_tokens >= the shortest answer (score mode always does)"
        },
    )

    def __post_init__(self) -> None:
        require_choice("mode", self.mode, MODES)
        if self.mode == "score" and not self.constrained:
            raise ValueError("mode: score decodes within the answer grammar; constrained: false needs mode: sample")
        require_int("votes", self.votes, 1)
        require_int("max_new_tokens", self.max_new_tokens, 1)
        require_int("max_retries", self.max_retries, 0)
        require_int("batch_pairs", self.batch_pairs, 1)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if not 0 <= self.review_threshold <= 1:
            raise ValueError(f"review_threshold must be in [0, 1], got {self.review_threshold!r}")

    @property
    def answers_per_pair(self) -> int:
        """Answers the teacher writes per pair, retries aside (the parse-failure rate's denominator)."""
        return self.votes if self.mode == "sample" else 1
