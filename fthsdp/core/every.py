"""How often something periodic happens: every N steps, or every T of wall-clock time.

``--checkpoint-every 500`` counts steps (a bare integer); ``--checkpoint-every
30m`` counts time (a number with a unit: s, m or h). Steps are a boundary
every member computes alone; a time is each member's own clock, so the
members agree on the step it falls at inside the step's all-reduce
(fthsdp/agent/training/ftar/decisions.py, CHECKPOINT_SLOT).
"""

from __future__ import annotations

import dataclasses
import re

from fthsdp.core.errors import ConfigError

_EVERY_RE = re.compile(r"^\s*(?:(\d+)|([0-9]*\.?[0-9]+)\s*(s|m|h))\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@dataclasses.dataclass(frozen=True)
class Every:
    """At most one of the two is nonzero; both zero: never."""

    steps: int = 0
    """Every this many steps (at each step that is a multiple of it)."""

    seconds: float = 0.0
    """Every this many seconds of wall-clock time, at the first step boundary after it."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.seconds < 0 or (self.steps and self.seconds):
            raise ConfigError(f"an interval is steps or a time, not both and not negative: {self!r}")

    @property
    def never(self) -> bool:
        return not self.steps and not self.seconds

    def __str__(self) -> str:
        """The form ``parse_every`` reads back (passed to the ranks in the environment)."""
        if self.seconds:
            return f"{self.seconds:g}s"
        return str(self.steps)


def parse_every(text: str | int | float | Every, name: str = "interval") -> Every:
    """'500' (steps), '30m', '90s', '1.5h' (time); '0': never."""
    if isinstance(text, Every):
        return text
    if isinstance(text, bool):
        raise ConfigError(f"{name}: expected a number of steps such as 500 or a time such as 30m, got {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"{name}: must not be negative, got {text}")
        return Every(steps=text)
    match = _EVERY_RE.match(str(text))
    if not match:
        raise ConfigError(f"{name}: expected a number of steps such as 500 or a time such as 30m, got {text!r}")
    if match.group(1) is not None:
        return Every(steps=int(match.group(1)))
    seconds = float(match.group(2)) * _UNIT_SECONDS[match.group(3)]
    return Every(seconds=seconds)


__all__ = ["Every", "parse_every"]
