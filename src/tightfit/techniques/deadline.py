"""When a search must stop, as a value: planners stay pure functions of their inputs, and check the
deadline between candidates (never inside one), returning the best found so far when it passes.

The clock is the caller's (monotonic by default). Searches never profile: the command layer
measures new step shapes between search passes (runtime/profiling.py), each pass with its own
deadline, so a first run that profiles searches as long as a warm one."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Deadline:
    at: float  # on `clock`, in seconds
    clock: Callable[[], float] = time.monotonic

    @staticmethod
    def after(seconds: float, clock: Callable[[], float] = time.monotonic) -> "Deadline":
        return Deadline(clock() + seconds, clock)

    def expired(self) -> bool:
        return self.clock() >= self.at

    def left(self) -> float:
        return max(0.0, self.at - self.clock())


def expired(deadline: Deadline | None) -> bool:
    """Whether an optional deadline has passed (None: never)."""
    return deadline is not None and deadline.expired()


class TimeUp(Exception):
    """Raised between candidates when the deadline has passed; the search catches it and returns
    the best it found so far."""


def share(deadline: Deadline | None, fraction: float, reserve: float = 0.0) -> Deadline | None:
    """A deadline for a stage given `fraction` of what is left of `deadline` less `reserve`
    seconds (kept for what follows); stages sharing it so, each asking its share of what is left
    when it starts, give the time one leaves unused to the next (None: no deadline)."""
    if deadline is None:
        return None
    return Deadline(deadline.clock() + max(0.0, deadline.left() - reserve) * fraction, deadline.clock)


def check(deadline: Deadline | None) -> None:
    if expired(deadline):
        raise TimeUp()
