"""The errors a user can act on."""

from __future__ import annotations

from typing import Any


class IncompatibleStateError(ValueError):
    """A saved state cannot continue this sampler's order; names the field and both values."""

    def __init__(self, field: str, saved: Any, current: Any, reason: str = "") -> None:
        self.field = field
        self.saved = saved
        self.current = current
        detail = f": {reason}" if reason else ""
        super().__init__(f"state field {field!r}: saved {saved!r}, expected {current!r}{detail}")
