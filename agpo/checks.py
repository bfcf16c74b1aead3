"""Argument checks shared by the configs and estimators: each error names the key and the bad value."""

from __future__ import annotations

import math
from collections.abc import Iterable


def require_int(key: str, value: object, minimum: int) -> None:
    """``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an int >= {minimum}, got {value!r}")


def require_ints(obj: object, keys: Iterable[str], minimum: int) -> None:
    """``require_int`` on each named attribute of ``obj``."""
    for key in keys:
        require_int(key, getattr(obj, key), minimum)


def require_non_negative(**values: float | None) -> None:
    """Each value is a finite number >= 0 (None passes: an option left off)."""
    for key, value in values.items():
        if value is not None and not (_is_number(value) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")


def require_positive(**values: float) -> None:
    """Each value is a finite number > 0."""
    for key, value in values.items():
        if not (_is_number(value) and math.isfinite(value) and value > 0):
            raise ValueError(f"{key} must be a finite number > 0, got {value!r}")


def require_choice(key: str, value: object, choices: Iterable[object]) -> None:
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{key} must be one of {choices}, got {value!r}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
