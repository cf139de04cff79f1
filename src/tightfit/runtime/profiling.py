"""Profiling as a stage of its own, run by the command layer around a pure search: the search
predicts from a frozen snapshot of the profile (analysis/predict.Predictor), which notes every
step shape it lacks; those are measured here and saved (incrementally: a killed run keeps what
was measured before), and the search runs again over the completed profile, until a pass needs
nothing new. A warm profile takes one pass. The passes before the last find the step shapes the
search needs, so their time is reported as profiling, apart from the search's own."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from tightfit.analysis.predict import Predictor

T = TypeVar("T")
# Passes at most: the last one's search is kept even if it met new shapes (measured and saved
# for the next run, and reported).
MAX_PASSES = 4


@dataclass(frozen=True)
class Profiling:
    """What the stage did: passes run, step shapes measured and the seconds it took, the seconds
    of the passes before the last (finding the shapes), and the last pass's search seconds."""

    passes: int
    shapes: int
    measure_seconds: float
    finding_seconds: float
    search_seconds: float
    complete: bool  # the last pass found every step shape in its profile

    def line(self, what: str, time_limit: float | None = None) -> str:
        limit = f" of {time_limit:g} s allowed" if time_limit else ""
        text = (f"{what}: search {self.search_seconds:.1f} s{limit}; profiling {self.shapes} new step shapes "
                f"{self.measure_seconds:.1f} s")
        if self.passes > 1:
            text += f", finding them {self.finding_seconds:.1f} s ({self.passes - 1} search passes)"
        text += " (not counted)"
        if not self.complete:
            text += "; the last pass still met unprofiled shapes (measured now, counted as no time there)"
        return text


def profiled_search(cost: Any, search: Callable[[Any, Any], T], deadline: Callable[[], Any] = lambda: None,
                    say: Callable[[str], None] = lambda line: None, what: str = "search") -> tuple[T, Profiling]:
    """`search(predictor, deadline())` over `cost`'s profile, frozen, until it needs no step shape
    the profile lacks (each pass with a new deadline: `deadline()`, the caller's, e.g. a
    techniques.deadline.Deadline `--time-limit` seconds from now). `cost` a runtime CostModel; any other
    object (a stand-in with `plan_seconds`) is passed to the search as it is, once."""
    if not hasattr(cost, "frozen"):
        t0 = time.monotonic()
        found = search(cost, deadline())
        return found, Profiling(1, 0, 0.0, 0.0, time.monotonic() - t0, True)
    shapes, measuring, finding = 0, 0.0, 0.0
    for n in range(1, MAX_PASSES + 1):
        predictor = Predictor(cost.frozen())
        t0 = time.monotonic()
        found = search(predictor, deadline())
        searched = time.monotonic() - t0
        if predictor.complete:
            return found, Profiling(n, shapes, measuring, finding, searched, True)
        say(f"{what}: profiling: pass {n} met {len(predictor.missing)} step shapes the profile lacks: measuring them")
        t1 = time.monotonic()
        shapes += cost.measure_missing(predictor.missing)
        cost.save()
        measuring += time.monotonic() - t1
        if n == MAX_PASSES:
            return found, Profiling(n, shapes, measuring, finding, searched, False)
        finding += searched
    raise AssertionError("unreachable")
