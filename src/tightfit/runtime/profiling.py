"""Profiling as a stage of its own, run by the command layer around a pure search: the search
predicts from a frozen snapshot of the profile (analysis/predict.Predictor), which notes every
step shape it lacks and predicts it from the kernels' rates; those are measured here and saved
(incrementally: a killed run keeps what was measured before), and the search runs again over the
completed profile, until a pass needs nothing new. A warm profile takes one pass.

Without a time limit the passes before the last find the step shapes the search needs, so their
time is reported as profiling, apart from the search's own. With one (the caller's deadline), the
limit bounds the whole stage, profiling included: a first search gets FIRST_SEARCH_SHARE of it,
measuring the shapes it asked for most stops when MEASURE_UNTIL of the limit has passed, and a
last search gets what is left; shapes not measured by then stay predicted, and the report says
how many."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, TypeVar

from tightfit.analysis.predict import Predictor

T = TypeVar("T")
# Passes at most: the last one's search is kept even if it met new shapes (measured and saved
# for the next run, and reported).
MAX_PASSES = 4
FIRST_SEARCH_SHARE = 0.35
MEASURE_UNTIL = 0.7
MEASURE_CHUNK = 16  # shapes measured between looks at the clock (each saved as it is measured)


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
    predicted: int = 0  # step shapes the last pass predicted from the kernels' rates (time was up)

    def line(self, what: str, time_limit: float | None = None) -> str:
        limit = f" of {time_limit:g} s allowed" if time_limit else ""
        text = (f"{what}: search {self.search_seconds:.1f} s{limit}; profiling {self.shapes} new step shapes "
                f"{self.measure_seconds:.1f} s")
        if self.passes > 1:
            text += f", finding them {self.finding_seconds:.1f} s ({self.passes - 1} search passes)"
        text += " (not counted)" if time_limit is None else " (counted)"
        if self.predicted:
            text += (f"; {self.predicted} step shapes predicted from the kernels' measured rates, not measured "
                     "(the time limit; a later run measures them as its limit allows)")
        elif not self.complete:
            text += "; the last pass still met unprofiled shapes (measured now, predicted from the kernels' rates there)"
        return text


def profiled_search(cost: Any, search: Callable[[Any, Any], T], deadline: Callable[[], Any] = lambda: None,
                    say: Callable[[str], None] = lambda line: None, what: str = "search") -> tuple[T, Profiling]:
    """`search(predictor, deadline)` over `cost`'s profile, frozen, until it needs no step shape
    the profile lacks. `deadline()`, the caller's (e.g. a techniques.deadline.Deadline
    `--time-limit` seconds from now), bounds the whole stage, profiling included; None: no limit,
    every shape the searches meet is measured. `cost` a runtime CostModel; any other object (a
    stand-in with `plan_seconds`) is passed to the search as it is, once."""
    if not hasattr(cost, "frozen"):
        t0 = time.monotonic()
        found = search(cost, deadline())
        return found, Profiling(1, 0, 0.0, 0.0, time.monotonic() - t0, True)
    total = deadline()
    if total is not None:
        return _within(cost, search, total, say, what)
    shapes, measuring, finding = 0, 0.0, 0.0
    for n in range(1, MAX_PASSES + 1):
        predictor = Predictor(cost.frozen())
        t0 = time.monotonic()
        found = search(predictor, None)
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


def _within(cost: Any, search: Callable[[Any, Any], T], total: Any, say: Callable[[str], None],
            what: str) -> tuple[T, Profiling]:
    """The stage bounded by `total` (a techniques.deadline.Deadline): a first search, measuring
    what it asked for most, a last search over the completed profile in the time left."""
    limit = total.left()
    predictor = Predictor(cost.frozen())
    t0 = time.monotonic()
    found = search(predictor, replace(total, at=total.clock() + limit * FIRST_SEARCH_SHARE))
    first = time.monotonic() - t0
    if predictor.complete:
        return found, Profiling(1, 0, 0.0, 0.0, first, True)
    say(f"{what}: profiling: the search met {len(predictor.missing)} step shapes the profile lacks: measuring "
        "the ones it asked for most while the time limit allows")
    t1 = time.monotonic()
    shapes = _measure_until(cost, predictor, lambda: total.left() <= (1 - MEASURE_UNTIL) * limit)
    measuring = time.monotonic() - t1
    last = Predictor(cost.frozen())
    t2 = time.monotonic()
    found = search(last, total)
    steps_missing = sum(1 for how in last.missing.values() if how is not None)
    return found, Profiling(2, shapes, measuring, first, time.monotonic() - t2, last.complete, steps_missing)


def _measure_until(cost: Any, predictor: Predictor, time_up: Callable[[], bool]) -> int:
    """Measure the missing constants, then the missing step shapes the search asked for most
    first, a chunk at a time until `time_up()`; the shapes measured."""
    constants = {k: how for k, how in predictor.missing.items() if how is None}
    if constants:
        cost.measure_missing(constants)
    steps = sorted((k for k, how in predictor.missing.items() if how is not None), key=lambda k: -predictor.asked.get(k, 0))
    measured = 0
    for i in range(0, len(steps), MEASURE_CHUNK):
        if time_up():
            break
        measured += cost.measure_missing({k: predictor.missing[k] for k in steps[i: i + MEASURE_CHUNK]})
    cost.save()
    return measured
