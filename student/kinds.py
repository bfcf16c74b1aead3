"""Student kinds: one class each, registered by name, as the advantage estimators are (agpo.advantages).

A kind says which feature groups it reads (student.pair_features: ``pair``, ``query``, ``ad``), whether it has
an ordinal head on the query-ad cosine (student.ordinal), how it makes grade logits from the network's two
readings (``RelevanceNet.pair_logits``, ``RelevanceNet.cosine_logits``), its title in model cards, and the
Hugging Face task other libraries load it as (``hf_task``, student.interchange; None: none). Adding a
kind is one class here and a ``register_kind`` call; the network, export and serving read it from the registry.

``auto`` (``resolved_kind``): cross for the tiny backbone (trained from scratch, it has no similarity to keep)
and bi for a pretrained one (it starts from the encoder's own cosine; docs/student.md "Student kinds" has the
figures that chose it). Imports nothing heavy: configs validate, and saved models name their kind, without
torch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

AUTO = "auto"


class StudentKind(Protocol):
    """What a kind is: its name, the feature groups it reads, whether it has an ordinal head, its title, its
    Hugging Face task, and its logits from the network's readings."""

    name: ClassVar[str]
    groups: ClassVar[tuple[str, ...]]
    ordinal_head: ClassVar[bool]
    title: ClassVar[str]
    hf_task: ClassVar[str | None]

    @staticmethod
    def logits(net: Any, features: dict[str, Any]) -> Any: ...


class CrossEncoder:
    """(query, ad) read as one sequence pair, a classification head on [CLS]."""

    name, groups, ordinal_head, title = "cross", ("pair",), False, "cross-encoder"
    hf_task = "sequence-classification"  # its logits are the classification model's

    @staticmethod
    def logits(net: Any, features: dict[str, Any]) -> Any:
        return net.pair_logits(features)


class BiEncoder:
    """Query and ad embedded alone (mean-pooled, unit length) and an ordinal grade head on their cosine: a
    pretrained sentence encoder starts from its zero-shot similarity, mapped to grades."""

    name, groups, ordinal_head, title = "bi", ("query", "ad"), True, "bi-encoder (ordinal head on the cosine)"
    hf_task = "feature-extraction"  # a sentence encoder; the cosine and the head are the steps after it

    @staticmethod
    def logits(net: Any, features: dict[str, Any]) -> Any:
        return net.cosine_logits(features)


class HybridEncoder:
    """Both readings summed, one encoder for the two; the pair's classification layer starts at zero, so
    training starts from the bi-encoder's similarity and learns what the pair reading adds."""

    name, groups, ordinal_head, title = "hybrid", ("pair", "query", "ad"), True, "hybrid encoder"
    hf_task = "feature-extraction"  # its sentence encoder; the pair term is in student.onnx only

    @staticmethod
    def logits(net: Any, features: dict[str, Any]) -> Any:
        return net.cosine_logits(features) + net.pair_logits(features)


KINDS: dict[str, type[StudentKind]] = {}


def register_kind(kind: type[StudentKind]) -> type[StudentKind]:
    """Add ``kind`` to the registry under its name (an existing name, or a class without every ``StudentKind``
    attribute, is an error)."""
    missing = [name for name in StudentKind.__annotations__ if not hasattr(kind, name)]
    if missing or not callable(getattr(kind, "logits", None)):
        raise ValueError(f"student kind {kind.__name__} lacks {missing or ['logits']} (see student.kinds.StudentKind)")
    if kind.name in KINDS or kind.name == AUTO:
        raise ValueError(f"student kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


for _kind in (CrossEncoder, BiEncoder, HybridEncoder):
    register_kind(_kind)

DEFAULT_KINDS = {"scratch": CrossEncoder.name, "pretrained": BiEncoder.name}  # what ``auto`` builds


def kind_of(name: str) -> type[StudentKind]:
    """The registered kind called ``name``, or an error naming the kinds there are."""
    if name not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {name!r}")
    return KINDS[name]


def resolved_kind(kind: str, backbone: str) -> str:
    """The kind a student is built as: ``kind`` itself, or for ``auto`` ``DEFAULT_KINDS`` by backbone regime
    (the tiny backbone is trained from scratch; any other is pretrained)."""
    if kind != AUTO:
        return kind_of(kind).name
    return DEFAULT_KINDS["scratch" if backbone == "tiny" else "pretrained"]
