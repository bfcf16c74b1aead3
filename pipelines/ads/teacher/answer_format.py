"""The answer formats a relevance teacher can be taught (``reason``: a short reason, then ``<answer>k</answer>``;
``answer``: the tag alone). pipelines.ads.teacher.prompts renders them; this module imports nothing, so the teacher's
config names them without loading the answer grammar (pipelines.ads.teacher.answer_grammar imports torch)."""

from typing import Literal

AnswerFormat = Literal["reason", "answer"]
ANSWER_FORMATS = ("reason", "answer")
