"""Argument checks that name the argument and the value expected, shared by every public entry."""

from __future__ import annotations

from enum import Enum
from numbers import Integral
from typing import Any, TypeVar

E = TypeVar("E", bound=Enum)


def check_int(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An int (not a bool) in [minimum, maximum]; numpy integers are accepted and converted."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and at most {maximum}"
        raise ValueError(f"{name} must be at least {minimum}{upper}, got {value}")
    return value


def check_optional_int(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    return None if value is None else check_int(name, value, minimum=minimum, maximum=maximum)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def check_choice(name: str, value: Any, choices: type[E]) -> E:
    """One of an enum's values, given as the enum member or its string."""
    allowed = [member.value for member in choices]
    try:
        return choices(value)
    except ValueError:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}") from None
