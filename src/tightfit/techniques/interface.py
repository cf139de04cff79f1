"""The one interface of the techniques: the model every technique takes (PlannedModel), what a
draft is given (Config), what a search is given (Problem) and answers (Front of Points), the one
Pareto filter and the one run memory.

Searches are pure: a Problem carries a prediction (`predict`, analysis/predict.Predictor over a
frozen profile, or any object with its `plan_seconds(plan, graphs)` and
`steps_seconds(plan, graphs, steps)`), a deadline value and a progress callback; a search never
measures, forks or writes."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Sequence, TypeVar

from tightfit.errors import OptionError
from tightfit.graph.fingerprint import fingerprint
from tightfit.graph.ir import Graph
from tightfit.plan.lifetimes import Lifetimes, lifetimes
from tightfit.plan.offsets import lower_bound
from tightfit.plan.schema import ModelRef, Plan
from tightfit.techniques.deadline import Deadline

# The offset planner of plans drafted inside a search (fast; the chosen plan is placed by the
# caller's planner, "improve" by default).
SEARCH_PLANNER = "greedy_by_size"


def _silent(line: str) -> None:
    pass


@dataclass(frozen=True)
class PlannedModel:
    """A model as planners take it: its graph, how to load it again, and the request size."""

    graph: Graph
    spec: str
    batch: int = 1

    def ref(self) -> ModelRef:
        g = self.graph
        inputs = tuple((t, tuple(g.shape(t))) for t in g.inputs) if len(g.inputs) > 1 else ()
        return ModelRef(self.spec, tuple(g.shape(g.inputs[0])), self.graph_fingerprint, self.batch, inputs=inputs)

    @functools.cached_property
    def graph_fingerprint(self) -> str:  # hashing a large graph takes milliseconds; searches draft hundreds of plans
        return fingerprint(self.graph)


@dataclass(frozen=True)
class Config:
    """How to draft a plan: layout, dtype, the offset planner that places it (None: unplaced, as
    a search drafts), the layer order, and the technique's own settings (`settings`: e.g. parts'
    "phases", tiling's "groups"; a search's Point carries the Config that drafts it)."""

    layout: str = "nhwc"
    dtype: str = "fp32"
    planner: str | None = "improve"
    order: str = "imported"
    settings: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.settings.get(name, default)


@dataclass(frozen=True)
class Problem:
    """What a technique's search is given: the CNN (its `batch` is the request size), the run
    memory budget (bytes, parameters excluded; None: no budget, the search's fastest), the
    prediction, how plans are drafted, a deadline (checked between candidates), progress lines;
    `brief`: the search is one of fit's sources, kept short (fit searches the rest); `quick`: a
    large CNN searched quickly (fit's QUICK_LAYERS); `settings`: the technique's own (vbs: unit
    bytes, latency)."""

    model: PlannedModel
    budget_bytes: int | None
    predict: Any
    config: Config = Config()
    deadline: Deadline | None = None
    progress: Callable[[str], None] = _silent
    brief: bool = False
    quick: bool = False
    settings: Mapping[str, Any] = field(default_factory=dict)

    def seconds(self, plan: Plan) -> float:
        """The prediction of a one-model plan of this CNN."""
        return self.predict.plan_seconds(plan, [self.model.graph])


@dataclass(frozen=True)
class Point:
    """One evaluated plan of every technique and of fit: its configuration (what drafts it again:
    a Config in a technique's Front, a genome for fit, the technique's own setting inside its
    search), run memory, predicted seconds per CNN and what it runs per CNN."""

    config: Hashable | Config
    memory_bytes: int
    seconds: tuple[float, ...]
    labels: tuple[str, ...]
    exact: bool = False  # found by the search's memory side (no time looked at): the same under any profile
    # What the technique's search keeps of the point besides (parts: its plan's buffers, steps, work)
    detail: Hashable = None

    @property
    def genes(self) -> Any:
        """fit's genome (fit's points are configured by it)."""
        return self.config

    @property
    def fps(self) -> tuple[float, ...]:
        return tuple(1.0 / s if s > 0 else math.inf for s in self.seconds)

    def objectives(self) -> tuple[float, ...]:
        return (float(self.memory_bytes),) + tuple(self.seconds)


@dataclass(frozen=True)
class Front:
    """A search's answer: its Pareto front (by increasing memory), its pick (the fastest predicted
    that fits the budget; if none fits, the smallest: `fits` False), its smallest point, how many
    candidates it evaluated and whether the deadline stopped it."""

    points: tuple[Point, ...]
    chosen: Point | None  # None: the search found no plan at all (vbs: nothing fits)
    smallest: Point | None
    fits: bool
    evaluated: int
    timed_out: bool = False
    detail: Any = None  # the technique's own answer (e.g. TilingSearch), for reports


P = TypeVar("P")


def pareto(points: Sequence[P], objectives: Callable[[P], Sequence[float]] = lambda p: p.objectives(),
           tiebreak: Callable[[P], Any] = lambda p: ()) -> tuple[P, ...]:
    """Points no other point dominates (nor equals: the first by `tiebreak` is kept), by increasing
    objectives (memory first)."""
    ordered = sorted(points, key=lambda p: (tuple(objectives(p)), tiebreak(p)))
    front: list[P] = []
    kept: list[tuple[float, ...]] = []
    for p in ordered:
        o = tuple(objectives(p))
        if not any(all(x <= y for x, y in zip(q, o)) for q in kept):
            front.append(p)
            kept.append(o)
    return tuple(front)


def dominates(a: Point, b: Point) -> bool:
    oa, ob = a.objectives(), b.objectives()
    return all(x <= y for x, y in zip(oa, ob)) and oa != ob


def run_memory(plan: Plan, graphs: Sequence[Graph] | None = None, life: Lifetimes | None = None) -> int:
    """The analyser's run memory: the arena plus the largest step's kernel temporaries. Of a
    placed plan (no `graphs`), its arena; of an unplaced one, the arena's lower bound, which the
    offset planners reach on plans without concurrent partitions (with them: what the search's
    placement gives; the chosen plan's final placement is never larger). `life`: the plan's
    lifetimes, if known."""
    if graphs is None:
        return plan.arena_bytes + max((s.scratch for s in plan.steps()), default=0)
    from tightfit.plan.place import place

    life = life or lifetimes(plan, graphs)
    arena = place(plan, graphs, SEARCH_PLANNER).arena_bytes if plan.concurrent else lower_bound(life.reqs)
    return arena + max(life.step_scratch, default=0)


@dataclass(frozen=True)
class Technique:
    """A technique as the registry holds it: its name, one line on what it does, its planner and
    its search (None: nothing to search, e.g. reuse's one plan)."""

    name: str
    summary: str
    draft: Callable[[PlannedModel, Config], Plan]
    search: Callable[[Problem], Front | None] | None = None  # None from a search: nothing to offer
    # fit asks it for candidate plans of every CNN (its `search` with a brief Problem) and takes
    # the points `offered` picks from the front (default: its smallest and its pick)
    fit_source: bool = False
    offered: Callable[[Front], list[Point]] | None = None
    # its weight in sharing fit's time among the sources (parts: 2, its memory side finds the
    # smallest plans fit can reach; a third of 60 s did not finish it on resnet50 at load 3)
    fit_share: float = 1.0

    def offers(self, front: Front) -> list[Point]:
        return self.offered(front) if self.offered else _distinct(front.smallest, front.chosen)


# The techniques by name, in registry order. techniques/registry.py fills it (the techniques
# package imports the registry, so it is filled before any technique runs): a technique asks
# another by name here, since importing the registry, which imports every technique, would be a
# cycle.
_REGISTERED: dict[str, Technique] = {}


def register(*techniques: Technique) -> dict[str, Technique]:
    """Add the techniques to the registry; the registry (by name, in order)."""
    _REGISTERED.update((t.name, t) for t in techniques)
    return _REGISTERED


def technique(name: str) -> Technique:
    """The technique of that name; OptionError naming those there are."""
    if name not in _REGISTERED:
        raise OptionError(f"unknown technique {name!r}; available: {', '.join(_REGISTERED)}")
    return _REGISTERED[name]


def _distinct(*points: Point) -> list[Point]:
    """The points, each once (by identity: a point's config may not hash)."""
    out: list[Point] = []
    for p in points:
        if not any(p is q for q in out):
            out.append(p)
    return out
