"""The student's settings (``StudentConfig``: backbone, kind, size), the kinds, the tiny tokenizer's special
tokens, the grades' names and the folder a baseline saved as its own kind writes (``save_state``: its state as
JSON beside a config.json naming its kind and grades); student.model builds the student (its docstring explains
kinds and backbones). Needs no torch, so configs validate without it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from student.kinds import AUTO
from student.kinds import KINDS as REGISTERED

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
KINDS = tuple(REGISTERED)  # the registered kinds' names
# the ESCI grades (pipelines.ads.teacher.relevance_reward.ESCI_GRADES) by name; another number of grades is named
# grade_k
ESCI_NAMES = ("irrelevant", "complement", "substitute", "exact")


def grade_names(num_grades: int) -> tuple[str, ...]:
    """The name of each grade 0..K-1: the ESCI names for 4 grades, else ``grade_0``, ``grade_1``, ..."""
    return ESCI_NAMES if num_grades == len(ESCI_NAMES) else tuple(f"grade_{k}" for k in range(num_grades))


def save_state(directory: str | Path, kind: str, state_file: str, state: dict[str, Any]) -> Path:
    """A baseline saved as its own kind: ``state`` (holding its ``format`` and ``num_grades``) as JSON in
    ``state_file`` (keys sorted: a set's order, and so a dict built from one, changes with each process's string
    hashes, and the same fit must be the same bytes) and a ``config.json`` naming the kind and the grades (what
    ``saved_baseline``, the model card and Hugging Face tools read); returns the folder."""
    names = grade_names(state["num_grades"])
    config = {
        "student_kind": kind,
        "num_labels": state["num_grades"],
        "id2label": dict(enumerate(names)),
        "label2id": {name: k for k, name in enumerate(names)},
    }
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / state_file).write_text(json.dumps(state, sort_keys=True), encoding="utf-8")  # one fit, one file
    (directory / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return directory


def load_state(directory: str | Path, state_file: str, fmt: str, what: str) -> dict[str, Any]:
    """The state ``save_state`` wrote; a folder without ``state_file``, or one of another format than ``fmt``, is
    an error naming ``what`` it is not."""
    path = Path(directory) / state_file
    if not path.is_file():
        raise FileNotFoundError(f"no {state_file} in {directory}: not a saved {what}")
    state = json.loads(path.read_text(encoding="utf-8"))
    if state.get("format") != fmt:
        raise ValueError(f"{path} has format {state.get('format')!r}; this code reads {fmt!r}: save the {what} again")
    return state


@dataclass(frozen=True)
class StudentConfig:
    """Backbone and size of the student."""

    backbone: str = field(
        default="tiny", metadata={"help": "tiny, all-minilm-l6-v2, or a local Hugging Face encoder directory"}
    )
    kind: str = field(
        default="auto",
        metadata={
            "help": f"one of {[*KINDS, AUTO]} (student.kinds): cross-encoder, bi-encoder (ordinal head on the "
            "cosine), hybrid (both summed); auto: cross for the tiny backbone, bi for a pretrained one"
        },
    )
    num_grades: int = field(default=4, metadata={"help": "grades predicted (0..K-1)"})
    max_length: int = field(default=96, metadata={"help": "longest query + ad in tokens"})
    tiny_hidden: int = field(default=64, metadata={"help": "tiny backbone: width"})
    tiny_layers: int = field(default=2, metadata={"help": "tiny backbone: encoder layers"})
    tiny_vocab: int = field(
        default=1500, metadata={"help": "tiny backbone: BPE vocabulary (>= 261: 256 bytes + 5 specials)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the new weights"})

    def __post_init__(self) -> None:
        if self.kind != AUTO and self.kind not in REGISTERED:  # the registry as it is now: a kind added later counts
            raise ValueError(f"kind must be one of {[*REGISTERED, AUTO]}, got {self.kind!r}")
        if self.num_grades < 2 or self.max_length < 8:
            raise ValueError(f"num_grades must be >= 2 and max_length >= 8, got {self.num_grades}, {self.max_length}")
        if self.tiny_hidden % 32:
            raise ValueError(f"tiny_hidden must be a multiple of 32 (heads of 32), got {self.tiny_hidden}")
        if self.tiny_vocab < 256 + len(SPECIALS):
            raise ValueError(f"tiny_vocab must be >= {256 + len(SPECIALS)} (bytes + specials), got {self.tiny_vocab}")
