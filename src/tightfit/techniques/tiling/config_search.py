"""The fused-tiling configuration search: which groups, grids and overlap policies run fastest
within a budget, predicted from memory read off each draft's lifetimes and a pure prediction of
its steps' seconds (analysis/predict.py over a frozen profile)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Sequence

from tightfit.graph.ir import Graph, spatial
from tightfit.techniques.deadline import Deadline, TimeUp, check, expired
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan, Step
from tightfit.techniques.tiling.planner import clear_edge, draft_tiling, plan_tiling
from tightfit.techniques.interface import Config, Point, Problem, pareto, technique
from tightfit.techniques.tiling.groups import (OVERLAPS, TileGroup, TilingError, cut_points, downsampling_cuts,
                                               format_tiling, groupable_runs, tileable)

# --- predictor and configuration search ---------------------------------------------------------
#
# MAFAT's Alg. 3 searches a fixed space (no cut or one cut at 4, 8 or 12 of YOLOv2; square
# grids) with a fitted memory predictor. Here: any number of groups up to `max_groups`, each
# between two cut points (by default the cuts after downsampling, where merging tiles costs
# least), any grid up to 8x8 (by default squares and grids one tile off square), either overlap
# policy; memory read exactly off each plan's lifetimes and step scratch, time from a cost
# function (the cost model).
#
# Bounding the work. Cut points separate the graph: at a step inside a group only the group's
# own buffers (and model outputs) are live, so a group's memory (bytes live, step scratch) and
# its steps' time do not depend on the other groups. Each (group, grid, overlap) is planned once,
# as the only group of a draft plan (memoised), and a configuration's prediction is assembled:
# peak = max live over its segments + max scratch over its segments (what check_plan reports),
# seconds = sum over segments. Memory is evaluated for every option; time only for the options a
# budget (the asked one, and a ladder of budgets for the front) can use: per segment and overlap,
# the `timed_per_segment` coarsest grids that fit (more tiles usually cost more time; the answer
# is the fastest of every configuration assembled, so a finer grid timed for a smaller ladder
# budget still wins when it is faster), and never a grid whose memory is no lower than a coarser
# grid's (dominated). A dynamic program over the cut points then picks, for each scratch cap S (the
# distinct step scratches), the fastest chain whose live bytes fit budget - S. Finer grids of a
# group stop once PLATEAU_GRIDS of them in a row lower neither its live bytes nor its scratch by
# PLATEAU_GAIN: the group's whole input and output buffers, which no grid shrinks, then dominate.
#
# The fine space. When an asked budget (budget_bytes or one of extra_budgets) lies below every
# configuration of the space above, the search adds: cuts at every cut point (not only after
# downsampling; if there are at most MAX_FINE_CUTS), and per segment the families of
# `fine_groups` (reused overlap, tiles one or two rows high, up to GRID_LIMIT columns, with and
# without narrow border columns), each family stopped by the same plateau rule. A segment is
# skipped when its whole input and output alone (live together in any tiling of it) exceed the
# smallest asked budget, or when an option already planned for it fits that budget, so the fine
# space costs only where it can help. Looking for the fastest
# configuration tries at most TIME_CAPS scratch caps per budget.

GRID_LIMIT = 8
MAX_CUTS = 10  # candidate cut points kept (evenly spaced) when a graph has more
MAX_FINE_CUTS = 24  # the fine space (asked budgets below the space above) cuts at every cut point if at most this many
PLATEAU_GRIDS = 3  # finer grids stop after this many in a row lower a group's live bytes and scratch by < PLATEAU_GAIN
PLATEAU_GAIN = 0.01
TIME_CAPS = 12  # scratch caps tried per budget when looking for the fastest configuration
# Past the deadline, an unpredicted group's guessed cost per tile beyond the first, as a share of
# its layers' layer-by-layer time (mobilenet_v1 at 1/8 of its memory: 98 and 42 tiles, 2.3x).
GUESS_PER_TILE = 0.01

StepSeconds = Callable[[Plan, Sequence[Step]], float]


@dataclass(frozen=True)
class TilingSetting:
    """A configuration (Point.config of the search's points): its tiled groups (other layers run
    layer by layer), or the whole network by parts (`parts`: the parts technique's Config; no
    groups). A point's memory is its run memory (arena lower bound + largest step scratch)."""

    groups: tuple[TileGroup, ...]
    parts: Config | None = None

    @property
    def spec(self) -> str:
        if self.parts is not None:
            return _parts_spec(self.parts)
        return format_tiling(self.groups) or "layer-by-layer"

    @property
    def key(self) -> tuple:
        """What tells configurations apart (a hashable stand-in: a parts Config holds dicts)."""
        return self.groups, self.spec


def tiling_point(setting: TilingSetting, memory_bytes: int, seconds: float) -> Point:
    return Point(setting, memory_bytes, (seconds,), (f"fused tiling {setting.spec}",))


def smallest_key(p: Point) -> tuple:
    """Smallest peak first; ties broken without a time (fewer tiles, then the spec)."""
    return (p.memory_bytes, sum(g.tiles for g in p.config.groups), p.config.spec)


def _parts_spec(parts: Config) -> str:
    """Phases per layer (runs of equal phases as ranges), the input's bands, held layers:
    "parts 0:512,1:304,2-5:152, input 256, held 11"."""
    runs: list[list[int]] = []  # [first, last, phases]
    for lid, n in sorted(parts.get("phases").items()):
        if runs and runs[-1][1] == lid - 1 and runs[-1][2] == n:
            runs[-1][1] = lid
        else:
            runs.append([lid, lid, n])
    layers = ",".join(f"{a}:{n}" if a == b else f"{a}-{b}:{n}" for a, b, n in runs)
    held = parts.get("held", ())
    return (f"parts {layers}, input {parts.get('source')}" + (", aligned" if parts.get("align") else "")
            + (f", held {','.join(map(str, held))}" if held else ""))


@dataclass(frozen=True)
class TilingSearch:
    """The search's answer; its points are configured by a TilingSetting."""

    chosen: Point  # fastest within the budget; if none fits, the smallest reachable
    front: tuple[Point, ...]  # Pareto front (memory, seconds) of the configurations assembled
    evaluated: int  # group options planned (memory); each timed at most once
    fits: bool
    smallest_bytes: int  # the smallest peak any configuration in the searched space reaches
    points: tuple[Point, ...] = ()  # every configuration assembled (the front's superset)
    timed_out: bool = False  # the deadline stopped the planning of group options


def default_grids(limit: int = GRID_LIMIT) -> tuple[tuple[int, int], ...]:
    """Grids 1x1 .. limit x limit, square or one tile off square, by tile count."""
    grids = [(n, m) for n in range(1, limit + 1) for m in range(1, limit + 1) if abs(n - m) <= 1]
    return tuple(sorted(grids, key=lambda x: (x[0] * x[1], x)))


def candidate_cuts(graph: Graph, limit: int = MAX_CUTS) -> tuple[int, ...]:
    """Where groups may start and end in the search: the model's ends, the cut points after
    downsampling (all cut points if there are fewer than two of those), at most `limit`, and
    the ends of every groupable run (the cut points around layers that cannot be tiled: a model
    whose first layer is a layout transpose has no coarse group without the cut after it)."""
    cuts = downsampling_cuts(graph)
    if len(cuts) < 2:
        cuts = tuple(p for p in cut_points(graph) if 0 < p < len(graph.layers))
    if len(cuts) > limit:
        cuts = tuple(cuts[round(k * (len(cuts) - 1) / (limit - 1))] for k in range(limit))
    around = {p for first, last in groupable_runs(graph) for p in (first, last + 1)}
    return tuple(sorted({0, len(graph.layers)} | set(cuts) | around))


def fine_groups(g: Graph, first: int, last: int, limit: int = GRID_LIMIT) -> list[list[TileGroup]]:
    """The small-memory space of one group, in families of grids by column count: overlap
    reused, tiles one or two output rows high (reuse makes the row overlap free, so rows cost
    little), 1..limit columns, each family also with border columns as narrow as `clear_edge`."""
    h, w = spatial(g.shape(g.layers[last].output))
    edge = clear_edge(g, TileGroup(first, last, (1, min(3, w)), "reuse"))
    families = []
    for n in sorted({h, -(-h // 2)} - {1}):
        families.append([TileGroup(first, last, (n, m), "reuse") for m in range(1, min(limit, w) + 1)])
        if edge:
            families.append([TileGroup(first, last, (n, m), "reuse", edge) for m in range(3, min(limit, w) + 1)
                             if w - 2 * edge >= m - 2])
    return [f for f in families if f]


def _whole_bytes(model: PlannedModel, a: int, b: int, dtype: str, overlay: bool = False) -> int:
    """A lower bound of the memory of layers a..b-1 as one group: its whole input (unless it is
    the model input, which may arrive tile by tile) and its whole output, live together; with
    `overlay`, the larger of the two (the output may share the input's bytes)."""
    g = model.graph
    tensors = ([] if a == 0 else [g.layers[a - 1].output]) + [g.layers[b - 1].output]
    sizes = [g.tensors[t].nbytes(dtype, model.batch) for t in tensors]
    if overlay and len(tensors) == 2:
        return max(sizes)
    return sum(sizes)


def _lags(draft: Plan, grp: TileGroup) -> tuple[int, int]:
    """An overlaid group's block growth beyond its input and beyond its output (0, 0 if none)."""
    from tightfit.plan.overlay import block_growth

    if not grp.overlay:
        return 0, 0
    guest = next(b.id for b in draft.buffers if b.overlay is not None)
    return block_growth(draft, guest)


def _joins(prev: "_Option | None", opt: "_Option", live_cap: int) -> bool:
    """Whether `opt` may follow `prev` within `live_cap`: an overlaid group's block also holds
    bytes in the segments beside it, and a group's input may not be an overlay already."""
    if prev is None:
        return not opt.overlaid
    if prev.overlaid and opt.overlaid:
        return False
    return prev.live + opt.lag_prev <= live_cap and opt.live + prev.lag_next <= live_cap


def _live(opt: "_Option", prev: "_Option | None" = None) -> int:
    """A segment's live bytes, bounded with its neighbours' overlay blocks (the DP's memory)."""
    if prev is None:
        return opt.live
    return max(opt.live + prev.lag_next, prev.live + opt.lag_prev)


def cost_seconds(cost, graph: Graph) -> StepSeconds:
    """The cost model's predicted seconds of some steps of a plan."""
    return lambda plan, steps: cost.steps_seconds(plan, [graph], steps)


def step_memory(plan: Plan, graph: Graph) -> tuple[list[int], list[int]]:
    """Per step: bytes of the buffers live at it, and its scratch."""
    from tightfit.plan.lifetimes import lifetimes

    life = lifetimes(plan, [graph], conflicts=False)
    return life.live_bytes(), list(life.step_scratch)


@dataclass
class _Option:
    """One way to run the layers between two cut points: layer by layer (group None) or a group."""

    group: TileGroup | None
    live: int
    scratch: int
    plan: Plan | None = None
    steps: tuple[int, int] = (0, 0)
    seconds: float | None = None
    # An overlaid group's block: bytes beyond its input, live in the segment before it (from that
    # input's first write), and beyond its output, live in the segment after it.
    lag_prev: int = 0
    lag_next: int = 0

    @property
    def overlaid(self) -> bool:
        return self.group is not None and self.group.overlay

    @property
    def peak(self) -> int:
        return self.live + self.scratch


@dataclass(frozen=True)
class _Setup:
    """What one run of the search is asked, fixed for the run, and the layer-by-layer draft every
    segment's plain option is read from."""

    model: PlannedModel
    seconds: StepSeconds
    grids: tuple[tuple[int, int], ...]
    overlaps: tuple[str, ...]
    max_groups: int
    timed_per_segment: int
    layout: str
    dtype: str
    deadline: Deadline | None
    progress: Callable[[str], None]
    real_cuts: frozenset[int]  # the graph's cut points (where a group may start and end)
    base: Plan
    base_live: tuple[int, ...]
    base_scratch: tuple[int, ...]

    @property
    def graph(self) -> Graph:
        return self.model.graph

    @property
    def layers(self) -> int:
        return len(self.model.graph.layers)


@dataclass
class _Space:
    """The search's state, grown by each planning pass and passed explicitly: the cut points, per
    segment between two of them its layer-by-layer option and, per overlap, its memory-Pareto
    grids by tiles; how many group options were planned; whether the deadline stopped a pass."""

    cuts: tuple[int, ...]
    plain: dict[tuple[int, int], _Option] = field(default_factory=dict)
    options: dict[tuple[int, int], list[list[_Option]]] = field(default_factory=dict)
    evaluated: int = 0
    timed_out: bool = False

    def known(self, seg: tuple[int, int]) -> list[_Option]:
        return [self.plain[seg]] + [o for kept in self.options.get(seg, ()) for o in kept]


@dataclass(frozen=True)
class TilingOptions:
    """What the tiling search explores and answers: at most `max_groups` groups, the `grids`
    (None: default_grids()), the `overlaps`, the `cuts` (None: candidate_cuts), the options timed
    per segment (`timed_per_segment`), a front over a ladder of `front_points` budgets plus the
    fastest within each of `extra_budgets`, and with `parts` the parts search's front where a
    budget is below the coarse space."""

    max_groups: int = 3
    grids: Sequence[tuple[int, int]] | None = None
    overlaps: Sequence[str] = OVERLAPS
    cuts: Sequence[int] | None = None
    timed_per_segment: int = 2
    front_points: int = 12
    extra_budgets: Sequence[int] = ()
    parts: bool = True


def search_tiling(model: PlannedModel, seconds: StepSeconds, budget_bytes: int | None = None,
                  options: TilingOptions = TilingOptions(), layout: str = "nhwc", dtype: str = "fp32",
                  deadline: Deadline | None = None, progress: Callable[[str], None] = lambda line: None) -> TilingSearch:
    """With `budget_bytes`: the fastest configuration found whose predicted run memory fits
    (`fits` False: `chosen` is the smallest reachable). Without: the fastest overall. The
    front is assembled over a ladder of `options.front_points` budgets from the smallest reachable
    peak to the layer-by-layer peak, plus the fastest within each of `options.extra_budgets` (so
    one search answers several budgets: the fastest front point within each). A budget below the
    space of `options.cuts` and `options.grids` opens the fine space (see above). `seconds(plan, steps)` predicts the time
    of some of a plan's steps (`cost_seconds(predictor, graph)`, a Predictor over a frozen
    profile). With `options.parts`, a budget below the coarse space also gets the parts search's front
    there (the whole network by parts).
    Past `deadline` (checked before each group option is planned) no more options are planned
    and the configurations are assembled from those planned so far; `progress` gets a line per
    stage."""
    g, o = model.graph, options
    setup = _setup(model, seconds, o.grids, o.overlaps, o.max_groups, o.timed_per_segment, layout, dtype, deadline, progress)
    space = _Space(tuple(sorted(set(o.cuts) | {0, setup.layers})) if o.cuts is not None else candidate_cuts(g))
    _plan_until_deadline(setup, space, lambda a, b: True, partial(_coarse_groups, setup))
    smallest = _smallest(setup, space, _scratch_caps(space))
    asked = [x for x in (budget_bytes, *o.extra_budgets) if x is not None]
    below = bool(asked) and min(asked) < smallest.memory_bytes  # a budget below the coarse space
    # Parts configurations compete only where the tiles' coarse space cannot go.
    by_parts = ([p for p in _parts_points(model, seconds, min(asked), layout, dtype, deadline, progress)
                 if p.memory_bytes < smallest.memory_bytes] if o.parts and below and not expired(deadline) else [])
    if below and "reuse" in o.overlaps:
        smallest = _plan_fine_space(setup, space, min(asked), smallest)
    return _answer(setup, space, smallest, by_parts, budget_bytes, o.extra_budgets, o.front_points)


def _setup(model: PlannedModel, seconds: StepSeconds, grids: Sequence[tuple[int, int]] | None, overlaps: Sequence[str],
           max_groups: int, timed_per_segment: int, layout: str, dtype: str, deadline: Deadline | None,
           progress: Callable[[str], None]) -> _Setup:
    g = model.graph
    base = draft_tiling(model, (), layout, dtype)
    live, scratch = step_memory(base, g)
    return _Setup(model, seconds, tuple(sorted(grids or default_grids(), key=lambda x: (x[0] * x[1], x))),
                  tuple(overlaps), max_groups, timed_per_segment, layout, dtype, deadline, progress,
                  frozenset(cut_points(g)), base, tuple(live), tuple(scratch))


def _plan_until_deadline(setup: _Setup, space: _Space, keep: Callable[[int, int], bool],
                         groups_of: Callable[[int, int], list[list[TileGroup]]]) -> None:
    """A planning pass (_plan_segments) stopped by the deadline, and its progress line."""
    try:  # past the deadline too: its first loop gives every new segment its layer-by-layer option
        _plan_segments(setup, space, keep, groups_of)
    except TimeUp:
        space.timed_out = True
    setup.progress(f"tiling search: {space.evaluated} group options planned{' (time is up)' if space.timed_out else ''}")


def _plan_segments(setup: _Setup, space: _Space, keep: Callable[[int, int], bool],
                   groups_of: Callable[[int, int], list[list[TileGroup]]]) -> None:
    """Plan the options of every segment between the space's cut points that `keep` admits:
    layer by layer, and each family of groups `groups_of(a, b)` gives (finer grids last), memory
    only. TimeUp past the deadline (a family cut off is not kept)."""
    pairs = [(a, b) for i, a in enumerate(space.cuts) for b in space.cuts[i + 1:]]
    for a, b in pairs:  # every segment can run layer by layer, whatever the deadline cuts off below
        space.plain.setdefault((a, b), _plain_option(setup, a, b))
    for a, b in pairs:
        if not _groupable(setup, a, b) or not keep(a, b):
            continue
        for candidates in groups_of(a, b):
            space.options.setdefault((a, b), []).append(_plan_family(setup, space, a, b, candidates))


def _groupable(setup: _Setup, a: int, b: int) -> bool:
    return a in setup.real_cuts and b in setup.real_cuts and all(tileable(setup.graph, l) for l in range(a, b))


def _plain_option(setup: _Setup, a: int, b: int) -> _Option:
    lo, hi = (0 if a == 0 else a + 1), b + 1  # the segment's steps in the layer-by-layer plan
    return _Option(None, max(setup.base_live[lo:hi]), max(setup.base_scratch[lo:hi]), setup.base, (lo, hi))


def _plan_family(setup: _Setup, space: _Space, a: int, b: int, candidates: Sequence[TileGroup]) -> list[_Option]:
    """The memory-Pareto options of one family of grids of segment (a, b), finer grids last,
    stopped at PLATEAU_GRIDS options in a row that gain nothing (or a grid that cannot be drafted)."""
    kept: list[_Option] = []
    stale = 0
    for grp in candidates:
        if stale >= PLATEAU_GRIDS:
            break
        check(setup.deadline)
        try:
            draft = draft_tiling(setup.model, [grp], setup.layout, setup.dtype)
        except TilingError:  # an overlay variant whose output cannot share its input
            break
        space.evaluated += 1
        opt = _group_option(setup, draft, grp, a, b)
        stale = 0 if _gains(opt, kept) else stale + 1
        # Dominated: more tiles, no less live memory and no less scratch. (Scratch counts once
        # per configuration, live bytes per segment: both matter.)
        if not any(k.live <= opt.live and k.scratch <= opt.scratch for k in kept):
            kept.append(opt)
    return kept


def _group_option(setup: _Setup, draft: Plan, grp: TileGroup, a: int, b: int) -> _Option:
    live, scratch = step_memory(draft, setup.graph)
    lo, hi = (0 if a == 0 else a + 1), len(draft.steps()) - (setup.layers - b)
    # The plan is dropped (rebuilt if timed): a big graph's fine grids are large.
    return _Option(grp, max(live[lo:hi]), max(scratch[lo:hi]), None, (lo, hi), None, *_lags(draft, grp))


def _gains(opt: _Option, kept: Sequence[_Option]) -> bool:
    """Whether `opt` lowers the family's live bytes or scratch by PLATEAU_GAIN."""
    return not kept or any(getattr(opt, f) < min(getattr(k, f) for k in kept) * (1 - PLATEAU_GAIN)
                           for f in ("live", "scratch"))


def _coarse_groups(setup: _Setup, a: int, b: int) -> list[list[TileGroup]]:
    """The coarse space of segment (a, b): a family per overlap, the grids by tile count."""
    h, w = spatial(setup.graph.shape(setup.graph.layers[b - 1].output))
    return [[TileGroup(a, b - 1, (n, m), ov) for n, m in setup.grids
             if n * m > 1 and n <= h and m <= w and not (ov == "reuse" and n == 1)] for ov in setup.overlaps]


def _fine_and_overlaid(g: Graph, a: int, b: int) -> list[list[TileGroup]]:
    """The fine space of segment (a, b): fine_groups's families, and overlaid, each again."""
    families = fine_groups(g, a, b - 1)
    if a == 0:  # the model input arrives by tiles: nothing whole to overlay
        return families
    return families + [[replace(grp, overlay=True) for grp in f] for f in families]


def _plan_fine_space(setup: _Setup, space: _Space, target: int, smallest: Point) -> Point:
    """Below the coarse space (`target`: the smallest asked budget): cuts at every cut point (if
    at most MAX_FINE_CUTS) and the fine space planned for the segments that could fit the target
    and have no planned option that does. Returns the new smallest configuration."""
    every_cut = cut_points(setup.graph)
    space.cuts = tuple(sorted(set(space.cuts) | (set(every_cut) if len(every_cut) <= MAX_FINE_CUTS else set())))
    pairs = [(a, b) for i, a in enumerate(space.cuts) for b in space.cuts[i + 1:]]
    if not any(_whole_bytes(setup.model, a, b, setup.dtype, overlay=True) <= target for a, b in pairs):
        # Nothing can fit (`fit` asks for its smallest plan with a budget of 0): look for the
        # smallest reachable instead, in every segment that could lower it.
        target = smallest.memory_bytes
    _plan_until_deadline(setup, space, partial(_worth, setup, space, target), partial(_fine_and_overlaid, setup.graph))
    return _smallest(setup, space, _scratch_caps(space))


def _worth(setup: _Setup, space: _Space, target: int, a: int, b: int) -> bool:
    """Whether segment (a, b) could fit `target` and nothing planned for it so far does."""
    return (_whole_bytes(setup.model, a, b, setup.dtype, overlay=True) <= target
            and min(o.peak for o in space.known((a, b))) > target)


def _timed(setup: _Setup, opt: _Option, space: _Space | None = None) -> float:
    """The option's predicted seconds (its steps in its draft), predicted once. Past the
    deadline (given the `space`), a group not predicted yet is guessed instead: its segment's
    layer-by-layer time, GUESS_PER_TILE more per tile beyond the first (drafting and predicting
    fine grids after the deadline took densenet121's search at 1/8 20 s past a 60 s limit)."""
    if opt.seconds is None and opt.group is not None and space is not None and expired(setup.deadline):
        g = opt.group
        plain = space.plain.get((g.first, g.last + 1))
        if plain is not None:
            return _timed(setup, plain) * (1 + GUESS_PER_TILE * (g.grid[0] * g.grid[1] - 1))
    if opt.seconds is None:
        plan = opt.plan or draft_tiling(setup.model, [opt.group], setup.layout, setup.dtype)
        opt.seconds = setup.seconds(plan, plan.steps()[opt.steps[0]:opt.steps[1]])
    return opt.seconds


def _usable(space: _Space, seg: tuple[int, int], live_cap: int, scratch_cap: int, first: int | None) -> list[_Option]:
    """The segment's options within the caps: layer by layer, and the `first` coarsest fitting
    grids per overlap (None: all)."""
    plain = space.plain[seg]
    out = [plain] if plain.live <= live_cap and plain.scratch <= scratch_cap else []
    for kept in space.options.get(seg, ()):
        out += [o for o in kept if o.live <= live_cap and o.scratch <= scratch_cap][:first]
    return out


Chains = dict[tuple[int, int], tuple[float, list[_Option]]]  # (cut point, groups) -> best value and its options


def _chain(setup: _Setup, space: _Space, live_cap: int, scratch_cap: int,
           cost: Callable[[_Option, _Option | None], float], combine: Callable[[float, float], float],
           first: int | None) -> tuple[float, list[_Option]] | None:
    """The best chain of options over the cut points (at most max_groups groups, by `combine`
    of each option's `cost`), each segment choosing among its `first` coarsest fitting grids per
    overlap (None: all). A dynamic program over the cut points."""
    best: Chains = {(0, 0): (0.0, [])}
    for j, b in enumerate(space.cuts):
        for a in space.cuts[:j]:
            for opt in _usable(space, (a, b), live_cap, scratch_cap, first):
                _extend(best, a, b, opt, setup.max_groups, live_cap, cost, combine)
    ends = [best[(setup.layers, k)] for k in range(setup.max_groups + 1) if (setup.layers, k) in best]
    return min(ends, key=lambda e: e[0], default=None)


def _extend(best: Chains, a: int, b: int, opt: _Option, max_groups: int, live_cap: int,
            cost: Callable[[_Option, _Option | None], float], combine: Callable[[float, float], float]) -> None:
    """The chains ending at `a` continued by `opt` over (a, b), kept where they beat the best
    chain ending at `b` with as many groups."""
    for k in range(max_groups + 1):
        if (a, k) not in best:
            continue
        value, opts = best[(a, k)]
        k2 = k + (opt.group is not None)
        prev = opts[-1] if opts else None
        if k2 > max_groups or not _joins(prev, opt, live_cap):
            continue
        value = combine(value, cost(opt, prev))
        if (b, k2) not in best or value < best[(b, k2)][0]:
            best[(b, k2)] = (value, opts + [opt])


def _point(setup: _Setup, opts: list[_Option], space: _Space | None = None) -> Point:
    """The configuration of a chain and its prediction (past the deadline, given the `space`,
    guessed where an option was not predicted: see _timed)."""
    groups = tuple(o.group for o in opts if o.group is not None)
    if any(o.overlaid for o in opts):
        # A block spans segments, so per-segment figures only bound it: the plan is read.
        live, scratch = step_memory(draft_tiling(setup.model, groups, setup.layout, setup.dtype), setup.graph)
        peak = max(live) + max(scratch)
    else:
        peak = max(o.live for o in opts) + max(o.scratch for o in opts)
    return tiling_point(TilingSetting(groups), peak, sum(_timed(setup, o, space) for o in opts))


def _scratch_caps(space: _Space) -> list[int]:
    """The distinct step scratches of every option planned (the scratch caps of the DP)."""
    every = list(space.plain.values()) + [o for per in space.options.values() for kept in per for o in kept]
    return sorted({o.scratch for o in every})


def _fastest(setup: _Setup, space: _Space, caps: Sequence[int], budget: int) -> Point | None:
    """The fastest configuration within `budget` over at most TIME_CAPS of the scratch caps
    (evenly over the sorted distinct ones, the largest kept): each cap may time other options,
    and the fine space has hundreds of distinct scratches. The smallest configuration is found
    over every cap (untimed) and competes anyway."""
    fitting = [s for s in caps if s <= budget]
    stride = max(1, -(-len(fitting) // TIME_CAPS))
    found = []
    for s in fitting[::-1][::stride][::-1]:
        c = _chain(setup, space, budget - s, s, lambda o, _: _timed(setup, o, space), lambda x, y: x + y,
                   setup.timed_per_segment)
        if c is not None:
            found.append(_point(setup, c[1], space))
    return min(found, key=lambda p: (p.seconds, p.memory_bytes), default=None)


def _smallest(setup: _Setup, space: _Space, caps: Sequence[int]) -> Point:
    """The smallest configuration (no time looked at): per scratch cap, the chain of the least
    live bytes."""
    best: tuple[int, list[_Option]] | None = None
    for s in caps:
        c = _chain(setup, space, 1 << 62, s, _live, max, None)
        if c is not None and (best is None or c[0] + s < best[0]):
            best = (c[0] + s, c[1])
    return _point(setup, best[1], space)


def _answer(setup: _Setup, space: _Space, smallest: Point, by_parts: list[Point], budget_bytes: int | None,
            extra_budgets: Sequence[int], front_points: int) -> TilingSearch:
    """The front over the ladder of budgets and `extra_budgets`, and the pick within `budget_bytes`."""
    caps = _scratch_caps(space)
    top = _fastest(setup, space, caps, 1 << 62)
    # The memory side: the smallest chain (no time looked at) and the parts search's smallest.
    # A time-guided find below it depends on the cost profile: dropped, so the smallest
    # configuration, and whether a budget is reachable, are the same under any profile.
    smallest = min([smallest] + by_parts, key=smallest_key)
    floor = 0 if space.timed_out else smallest.memory_bytes  # (cut off by the deadline: nothing is dropped)
    seen = [smallest, top] + by_parts
    for budget in _ladder(smallest, top, front_points) + list(extra_budgets):
        p = _fastest(setup, space, caps, budget)
        if p is not None:
            seen.append(p)
    # Every assembled configuration competes: a ladder budget may have timed finer grids that
    # turn out faster (smaller tiles stay in cache) than the coarsest that fit.
    limit = 1 << 62 if budget_bytes is None else budget_bytes
    p = _fastest(setup, space, caps, limit)
    seen += [p] if p is not None else []
    seen = [q for q in seen if q.memory_bytes >= floor]
    fitting = [q for q in seen if q.memory_bytes <= limit]
    chosen, fits = (min(fitting, key=lambda q: (q.seconds, q.memory_bytes)), True) if fitting else (smallest, False)
    distinct = tuple({p.config.key: p for p in seen}.values())
    smallest = min(seen, key=smallest_key)
    return TilingSearch(chosen, pareto(distinct), space.evaluated, fits, smallest.memory_bytes, distinct, space.timed_out)


def _ladder(smallest: Point, top: Point, front_points: int) -> list[int]:
    """`front_points` - 2 budgets spaced geometrically between the smallest and the fastest."""
    if front_points <= 1 or top.memory_bytes <= smallest.memory_bytes:
        return []
    ratio = (top.memory_bytes / smallest.memory_bytes) ** (1 / (front_points - 1))
    return [int(smallest.memory_bytes * ratio ** k) for k in range(1, front_points - 1)]


def _parts_points(model: PlannedModel, seconds: StepSeconds, budget: int, layout: str, dtype: str,
                  deadline: Deadline | None = None, progress: Callable[[str], None] = lambda line: None) -> list[Point]:
    """The parts technique's front for `budget` (asked through the registry), as configurations."""
    problem = Problem(model, budget, _WholePlans(seconds), Config(layout, dtype, None), deadline, progress)
    front = technique("parts").search(problem)
    return [tiling_point(TilingSetting((), p.config), p.memory_bytes, p.seconds[0]) for p in front.points]


@dataclass(frozen=True)
class _WholePlans:
    """The prediction a Problem carries, made of the search's prediction of steps."""

    seconds: StepSeconds

    def plan_seconds(self, plan: Plan, graphs: Sequence[Graph]) -> float:
        return self.seconds(plan, plan.steps())

    def steps_seconds(self, plan: Plan, graphs: Sequence[Graph], steps: Sequence[Step]) -> float:
        return self.seconds(plan, steps)


def plan_point(model: PlannedModel, point: Point, planner: str = "improve", layout: str = "nhwc",
               dtype: str = "fp32") -> Plan:
    """The placed plan of a configuration the search assembled (tiled groups, or parts)."""
    setting: TilingSetting = point.config
    if setting.parts is not None:
        return technique("parts").draft(model, replace(setting.parts, planner=planner, layout=layout, dtype=dtype))
    return plan_tiling(model, setting.groups, planner, layout, dtype)
