"""Votes -> labels: majority with a conservative tie-break, retries of unparseable votes, abstention; the
teacher's maj@n gate counts exactly what annotation labels. Score mode: the teacher's exact grade
distribution after its greedy reason, equal to a hand computation and independent of the batching."""

import itertools

import pytest
import torch

from agpo.models import TinyModelConfig, build_tiny_qwen2, train_bpe_tokenizer
from agpo.rollout import HFRolloutEngine, encode_prompts
from agpo.rollout.continuations import continuation_logprobs
from agpo.sampling_metrics import majority
from pipelines.ads.annotation.annotate import AnnotateConfig
from pipelines.ads.teacher.answer_grammar import AnswerGrammar
from pipelines.ads.teacher.audit_metrics import vote_accuracy
from pipelines.ads.teacher.labeling import PairAnswers, PairLabeler, VotingConfig, pair_seed
from pipelines.ads.teacher.prompts import RELEVANCE_V1, TeacherPrompt
from pipelines.ads.teacher.relevance_reward import format_answer

PLAIN = TeacherPrompt(RELEVANCE_V1)  # the tiny teacher's prompt: plain template, reason format


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
    labeler = PairLabeler(None, None, PLAIN, VotingConfig(votes=4), "teacher-x")  # labels, never samples
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
    labeler = PairLabeler(HFRolloutEngine(model, tokenizer), tokenizer, PLAIN, config, "teacher-x")
    pairs = [{"pair_id": f"p{i}", "query": "red shoes", "ad_title": f"nike {i}"} for i in range(3)]
    labels, review = labeler.label(pairs)
    assert [label["pair_id"] for label in labels] == ["p0", "p1", "p2"]
    for label in labels:  # a random model never writes <answer>k</answer> in 4 tokens
        assert label["grade"] is None and label["votes"] == [0, 0, 0, 0] and label["confidence"] == 0.0
        assert label["grade_probs"] is None
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
    labeler = PairLabeler(HFRolloutEngine(model, tokenizer), tokenizer, PLAIN, config, "teacher-x")
    pairs = [{"pair_id": f"p{i}", "query": "red shoes", "ad_title": f"nike {i}"} for i in range(25)]
    labels, _ = labeler.label(pairs)
    assert sum(label["parse_failures"] for label in labels) == 0
    assert all(label["grade"] is not None and sum(label["votes"]) == 4 for label in labels)


@pytest.fixture(scope="module")
def random_teacher():
    tokenizer = train_bpe_tokenizer(
        ["<query>red shoes</query>\n<ad>nike</ad>\n same brand <answer>3</answer>"] * 10, vocab_size=300
    )
    model = build_tiny_qwen2(tokenizer, TinyModelConfig(vocab_size=300, hidden_size=64, num_layers=1)).eval()
    pairs = [{"pair_id": f"p{i}", "query": "red shoes" + " x" * (i % 4), "ad_title": f"nike {i}"} for i in range(9)]
    return model, tokenizer, pairs


def test_score_mode_labels_the_teachers_exact_grade_distribution_after_its_greedy_reason(random_teacher):
    model, tokenizer, pairs = random_teacher
    engine = HFRolloutEngine(model, tokenizer)
    config = VotingConfig(mode="score", batch_pairs=4, max_new_tokens=24, review_threshold=0.3)
    labeler = PairLabeler(engine, tokenizer, PLAIN, config, "teacher-x")
    labels, review = labeler.label(pairs)
    # by hand, one pair at a time: the greedy answer within the grammar, cut after <answer>, then each ending
    ids = encode_prompts(tokenizer, [PLAIN.render_pair(p) for p in pairs])
    for pair_ids, label in zip(ids, labels, strict=True):
        text = engine.generate(
            [pair_ids], n=1, temperatures=1.0, max_new_tokens=24, greedy=True, constraint=AnswerGrammar()
        ).texts[0]
        prefix = text[: text.index("<answer>") + len("<answer>")]
        endings = [f"{g}</answer>" for g in range(4)]
        expected = continuation_logprobs(model, tokenizer, [pair_ids], [prefix], endings)[0].exp()
        assert label["grade_probs"] == pytest.approx(expected.tolist(), abs=1e-5)
        assert label["grade"] == int(expected.argmax()) and label["confidence"] == max(label["grade_probs"])
        assert label["votes"] == [0, 0, 0, 0] and label["parse_failures"] == 0
        assert sum(label["grade_probs"]) == pytest.approx(1, abs=1e-5)
    queued = [label["pair_id"] for label in labels if label["confidence"] < 0.3]
    assert [r["pair_id"] for r in review] == queued
    for row in review:
        label = next(x for x in labels if x["pair_id"] == row["pair_id"])
        assert len(row["teacher_answers"]) == 1 and row["teacher_answers"][0].endswith(format_answer(label["grade"]))
    assert labeler.stats.pairs == 9 and labeler.stats.generated_tokens > 0 and labeler.stats.scoring_seconds > 0


def test_score_mode_labels_do_not_depend_on_the_batching(random_teacher):
    model, tokenizer, pairs = random_teacher

    def label(batch_pairs, max_batch_rows):
        engine = HFRolloutEngine(model, tokenizer, max_batch_rows=max_batch_rows)
        config = VotingConfig(mode="score", batch_pairs=batch_pairs)
        return PairLabeler(engine, tokenizer, PLAIN, config, "teacher-x").label(pairs)[0]

    one, many = label(1, 4), label(16, 1024)
    assert [x["grade"] for x in one] == [x["grade"] for x in many]
    for a, b in zip(one, many, strict=True):
        assert a["grade_probs"] == pytest.approx(b["grade_probs"], abs=1e-6)
    assert label(16, 1024) == many  # a rerun is identical to the bit


class ScoreOnlyEngine(HFRolloutEngine):
    def generate(self, *args, **kwargs):
        raise AssertionError("an answer-only teacher has no reason to decode")


def test_score_mode_reads_an_answer_only_teacher_right_after_the_tag(random_teacher):
    model, tokenizer, pairs = random_teacher
    config = VotingConfig(mode="score", batch_pairs=4)
    labeler = PairLabeler(
        ScoreOnlyEngine(model, tokenizer),
        tokenizer,
        TeacherPrompt(RELEVANCE_V1, answer_format="answer"),
        config,
        "teacher-x",
    )
    labels, _ = labeler.label(pairs)
    ids = encode_prompts(tokenizer, [PLAIN.render_pair(p) for p in pairs])
    expected = continuation_logprobs(
        model, tokenizer, ids, ["<answer>"] * len(ids), [f"{g}</answer>" for g in range(4)]
    )
    assert torch.allclose(torch.tensor([x["grade_probs"] for x in labels]), expected.exp(), atol=1e-6)
    assert labeler.stats.generated_tokens == 0


class ShortEngine(HFRolloutEngine):
    """Greedy answers that ran out of tokens before the tag for odd pairs (vLLM does not force the answer)."""

    def generate(self, prompt_ids, **kwargs):
        rollout = super().generate(prompt_ids, **kwargs)
        rollout.texts = [t if i % 2 == 0 else " same brand, red" for i, t in enumerate(rollout.texts)]
        return rollout


def test_score_mode_abstains_where_the_greedy_answer_does_not_parse(random_teacher):
    model, tokenizer, pairs = random_teacher
    config = VotingConfig(mode="score", review_threshold=0.0)
    labels, review = PairLabeler(ShortEngine(model, tokenizer), tokenizer, PLAIN, config, "t").label(pairs)
    ids = encode_prompts(tokenizer, [PLAIN.render_pair(p) for p in pairs])
    odd = sorted(range(len(pairs)), key=lambda i: len(ids[i]))[1::2]  # odd rows of the length-sorted batch
    for i, label in enumerate(labels):
        if i in odd:
            assert label["grade"] is None and label["grade_probs"] is None and label["confidence"] == 0.0
            assert label["parse_failures"] == 1
        else:
            assert label["grade"] is not None and label["parse_failures"] == 0
    assert [r["pair_id"] for r in review] == [pairs[i]["pair_id"] for i in sorted(odd)]
    assert all(r["abstained"] and r["teacher_answers"] == ["same brand, red"] for r in review)


def test_score_mode_needs_an_engine_that_scores():
    class SamplingOnly:
        def generate(self, *args, **kwargs): ...

    with pytest.raises(ValueError, match="mode: score needs engine: hf"):
        PairLabeler(SamplingOnly(), None, PLAIN, VotingConfig(mode="score"), "teacher-x")
    with pytest.raises(ValueError, match="mode: score needs engine: hf"):
        AnnotateConfig(engine="vllm", voting=VotingConfig(mode="score"))
    assert AnnotateConfig(engine="vllm").voting.mode == "sample"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"votes": 0}, "votes"),
        ({"review_threshold": 1.5}, "review_threshold"),
        ({"temperature": 0}, "temperature"),
        ({"mode": "vote"}, "mode must be one of"),
        ({"mode": "score", "constrained": False}, "constrained: false needs mode: sample"),
    ],
)
def test_voting_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        VotingConfig(**kwargs)
