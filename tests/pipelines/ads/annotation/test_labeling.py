"""Votes -> labels: majority with a conservative tie-break, retries of unparseable votes, abstention; the
teacher's maj@n gate counts exactly what annotation labels."""

import itertools

import pytest

from agpo.evaluation import majority
from agpo.models import TinyModelConfig, build_tiny_qwen2, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine
from pipelines.ads.annotation.labeling import PairAnswers, PairLabeler, VotingConfig, pair_seed
from pipelines.ads.prompts import RELEVANCE_V1
from pipelines.ads.teacher_eval import vote_accuracy


def grade_of(counts: list[int]) -> int | None:
    """The label of a pair whose votes per grade are ``counts``."""
    return majority([g for g, count in enumerate(counts) for _ in range(count)], tie="lowest")


def test_majority_takes_the_lower_grade_on_a_tie():
    assert grade_of([0, 2, 2, 0]) == 1
    assert grade_of([1, 0, 0, 1]) == 0
    assert grade_of([0, 0, 0, 3]) == 3
    assert grade_of([0, 0, 0, 0]) is None


def test_the_teacher_gate_maj_at_n_counts_what_annotation_labels():
    """Every 4-vote outcome (unparseable answers included) and every gold grade: the gate's maj@4 is 1 exactly
    when annotation would label the gold grade (before, the gate broke ties by the first answer seen)."""
    labeler = PairLabeler(None, None, RELEVANCE_V1, VotingConfig(votes=4), "teacher-x")  # labels, never samples
    for votes in itertools.product([None, 0, 1, 2, 3], repeat=4):
        answers = PairAnswers(4)
        for grade in votes:
            answers.add(f"<answer>{grade}</answer>", grade)
        label, _ = labeler._label_row({"pair_id": "p", "query": "q", "ad_title": "a"}, answers)
        for gold in range(4):
            assert vote_accuracy([list(votes)], [gold])["maj@4"] == float(label["grade"] == gold), (votes, gold)


def test_parsed_answers_fill_slots_and_failures_are_kept():
    answers = PairAnswers(2)
    answers.add("junk", None)
    answers.add("x <answer>1</answer>", 1)
    assert answers.open_slots == 1
    answers.add("y <answer>2</answer>", 2)
    answers.add("z <answer>3</answer>", 3)  # no open slot left: ignored
    assert answers.grades == [1, 2] and answers.failed == ["junk"] and answers.open_slots == 0


def test_pair_seeds_are_stable_and_distinct():
    assert pair_seed(0, "p1", 0) == pair_seed(0, "p1", 0)
    assert len({pair_seed(0, "p1", 0), pair_seed(0, "p1", 1), pair_seed(0, "p2", 0), pair_seed(1, "p1", 0)}) == 4


def test_a_teacher_that_never_answers_abstains_after_its_retries():
    tokenizer = train_bpe_tokenizer(["<query>red shoes</query>\n<ad>nike</ad>\n"] * 10, vocab_size=300)
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1)).eval()
    config = VotingConfig(votes=3, max_retries=2, max_new_tokens=4, constrained=False)
    labeler = PairLabeler(HFRolloutEngine(model, tokenizer), tokenizer, RELEVANCE_V1, config, "teacher-x")
    pairs = [{"pair_id": f"p{i}", "query": "red shoes", "ad_title": f"nike {i}"} for i in range(3)]
    labels, review = labeler.label(pairs)
    assert [label["pair_id"] for label in labels] == ["p0", "p1", "p2"]
    for label in labels:  # a random model never writes <answer>k</answer> in 4 tokens
        assert label["grade"] is None and label["votes"] == [0, 0, 0, 0] and label["confidence"] == 0.0
        assert label["parse_failures"] == 3 * 3  # 3 slots x (1 + 2 retries)
    assert [r["pair_id"] for r in review] == ["p0", "p1", "p2"] and all(r["abstained"] for r in review)
    assert all(len(r["teacher_answers"]) == 9 for r in review)
    assert labeler.stats.pairs == 3 and 0 < labeler.stats.generated_tokens <= 3 * 9 * 4  # EOS may end a row early


def test_a_random_teacher_decoded_within_the_answer_grammar_never_fails_to_parse():
    tokenizer = train_bpe_tokenizer(
        ["<query>red shoes</query>\n<ad>nike</ad>\n <answer>3</answer>"] * 10, vocab_size=300
    )
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1)).eval()
    config = VotingConfig(votes=4, max_retries=2, max_new_tokens=24, temperature=1.5)
    labeler = PairLabeler(HFRolloutEngine(model, tokenizer), tokenizer, RELEVANCE_V1, config, "teacher-x")
    pairs = [{"pair_id": f"p{i}", "query": "red shoes", "ad_title": f"nike {i}"} for i in range(25)]
    labels, _ = labeler.label(pairs)
    assert sum(label["parse_failures"] for label in labels) == 0
    assert all(label["grade"] is not None and sum(label["votes"]) == 4 for label in labels)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"votes": 0}, "votes"), ({"review_threshold": 1.5}, "review_threshold"), ({"temperature": 0}, "temperature")],
)
def test_voting_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VotingConfig(**kwargs)
