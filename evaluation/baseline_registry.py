"""Baselines: one class each, registered by name, as student kinds are (student.kinds).

A baseline is what a team has without this pipeline. Its class says its ``name`` (the key in
``evaluate.baselines.names``, in metrics.json and in a saved folder's ``config.json`` ``student_kind``), its
``title`` in tables, plots and cards, how it is ``fit`` on the gold train pairs (-> a predictor:
``predict_proba(queries, ads, batch_size)`` -> [pairs, grades], and ``save(folder)``), and, for a baseline saved
as its own kind of folder, how it is served: ``load(folder)``, the ``backend`` that scores it, the class a card
says ``loads_as``, the ``evaluation/`` modules the served pyfunc carries as code (``code``) and the packages it
pins (``requirements``). A baseline saved as a student folder (the zero-shot encoder: a bi student) has
``saved_as_student`` and is loaded, served and carded as that student. ``library``: the card's
``library_name``; ``state_file``: the file of its folder that holds its whole fitted state (its version).

Registration order is the champion rule's "simplest first" (evaluation.comparison): the first
registered baseline wins a tie. Adding a baseline is one module with its class and a ``register_baseline``
call, its name in ``PLUGINS`` (imported at the bottom, after this module's own), and a test; evaluation/bm25.py
is the example. Imports nothing heavy (each class imports its library in ``fit`` and ``load``), so configs
validate and saved folders are recognised without scikit-learn or torch.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from compute.placement import ON_CPU, Placement

PLUGINS = ("evaluation.bm25",)  # modules that register a baseline of their own on import
# package -> the modules every served baseline carries: the registry, each plugin it imports, the student
# library's folder format (save_state, load_state) and compute's Placement, which the registry and its baselines
# import
REGISTRY_CODE = {
    "evaluation": ("__init__.py", "baseline_registry.py", *(f"{p.rpartition('.')[2]}.py" for p in PLUGINS)),
    "student": ("__init__.py", "model_config.py", "kinds.py"),
    "compute": ("__init__.py", "placement.py"),
}


class Baseline(Protocol):
    """What a baseline is (module docstring)."""

    name: ClassVar[str]
    title: ClassVar[str]
    backend: ClassVar[str]
    library: ClassVar[str]
    state_file: ClassVar[str]
    loads_as: ClassVar[str]
    saved_as_student: ClassVar[bool]
    code: ClassVar[tuple[str, ...]]
    requirements: ClassVar[tuple[str, ...]]

    @staticmethod
    def fit(config: Any, rows: Sequence[dict[str, Any]], num_grades: int, placement: Placement = ON_CPU) -> Any: ...

    @staticmethod
    def load(folder: Path) -> Any: ...


class LexicalBaseline:
    """The lexical matcher (evaluation.lexical: match features + logistic regression), its settings
    ``lexical_model``."""

    name, title, backend, saved_as_student = "lexical", "lexical matcher", "scikit-learn", False
    library, state_file = "sklearn", "lexical.json"
    loads_as = "`LexicalMatcher.load(folder)` of `evaluation/lexical.py` (scikit-learn; `lexical.json` is its state)"
    code = ("lexical.py", "lexical_config.py")
    requirements = ("scikit-learn", "scipy")

    @staticmethod
    def fit(config: Any, rows: Sequence[dict[str, Any]], num_grades: int, placement: Placement = ON_CPU) -> Any:
        from evaluation.lexical import LexicalMatcher

        queries, ads, grades = ([r[key] for r in rows] for key in ("query", "ad_title", "gold_grade"))
        return LexicalMatcher(num_grades, config.lexical_model).fit(queries, ads, grades)

    @staticmethod
    def load(folder: Path) -> Any:
        from evaluation.lexical import LexicalMatcher

        return LexicalMatcher.load(folder)


class ZeroShotBaseline:
    """The untrained sentence encoder ``encoder`` read as a bi student, its ordinal head fitted on the gold
    pairs (evaluation.zero_shot.zero_shot_student); saved, loaded and served as that bi student."""

    name, title, backend, saved_as_student = "zero_shot", "zero-shot encoder", "torch", True
    library, state_file = "sentence-transformers", "model.safetensors"
    loads_as, code, requirements = "a bi student (its card says how)", (), ()

    @staticmethod
    def fit(config: Any, rows: Sequence[dict[str, Any]], num_grades: int, placement: Placement = ON_CPU) -> Any:
        from evaluation.zero_shot import zero_shot_student

        return zero_shot_student(config.encoder, rows, num_grades, placement=placement)

    @staticmethod
    def load(folder: Path) -> Any:
        from student.model import RelevanceStudent

        return RelevanceStudent.load(folder)


BASELINES: dict[str, type[Baseline]] = {}


def register_baseline(baseline: type[Baseline]) -> type[Baseline]:
    """Add ``baseline`` to the registry under its name (an existing name, or a class without every ``Baseline``
    attribute, is an error)."""
    missing = [name for name in (*Baseline.__annotations__, "fit", "load") if not hasattr(baseline, name)]
    if missing:
        raise ValueError(f"baseline {baseline.__name__} lacks {missing} (see evaluation.baseline_registry.Baseline)")
    if baseline.name in BASELINES:
        raise ValueError(f"baseline {baseline.name!r} is already registered")
    BASELINES[baseline.name] = baseline
    return baseline


def baseline_of(name: str) -> type[Baseline]:
    """The registered baseline called ``name``, or an error naming the baselines there are."""
    if name not in BASELINES:
        raise ValueError(f"baselines must be among {list(BASELINES)}, got {name!r}")
    return BASELINES[name]


def fit_baselines(config: Any, rows: Sequence[dict[str, Any]], num_grades: int, placement: Placement = ON_CPU) -> dict:
    """Name -> the fitted baseline (a predictor), for each one ``config`` (a ``BaselinesConfig``) names, in its
    order; none without gold train ``rows``. The zero-shot encoder runs on ``placement``."""
    if not rows:
        return {}
    return {name: baseline_of(name).fit(config, rows, num_grades, placement) for name in config.names}


def saved_baseline(folder: str | Path) -> type[Baseline] | None:
    """The baseline saved as its own kind in ``folder`` (its config.json's ``student_kind`` names it); None for a
    student folder, a zero-shot baseline's included."""
    path = Path(folder) / "config.json"
    kind = json.loads(path.read_text(encoding="utf-8")).get("student_kind") if path.is_file() else None
    baseline = BASELINES.get(kind)
    return None if baseline is None or baseline.saved_as_student else baseline


def served_code(baseline: type[Baseline]) -> dict[str, tuple[str, ...]]:
    """Package -> the modules a served ``baseline`` carries as code: ``REGISTRY_CODE`` and its own ``code``."""
    return REGISTRY_CODE | {"evaluation": (*REGISTRY_CODE["evaluation"], *baseline.code)}


for _baseline in (LexicalBaseline, ZeroShotBaseline):
    register_baseline(_baseline)
for _plugin in PLUGINS:
    importlib.import_module(_plugin)
