"""Settings that take one of a few values: each is an enum, and a user may give the member
or its value (``mode="upsert"`` or ``mode=WriteMode.UPSERT``)."""

from __future__ import annotations

import enum
from typing import TypeVar

from batchline.errors import ConfigurationError

__all__ = ["choose"]

E = TypeVar("E", bound=enum.Enum)


def choose(choices: type[E], value: E | str, setting: str) -> E:
    """``value`` as a member of ``choices``; a value that names none raises, listing them all."""
    if isinstance(value, choices):
        return value
    try:
        return choices(value)
    except ValueError:
        members = ", ".join(f"{m.value!r} ({choices.__name__}.{m.name})" for m in choices)
        raise ConfigurationError(f"{setting} must be one of {members}; got {value!r}") from None
