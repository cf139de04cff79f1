"""Choosing the phases of every layer (k rows per phase): the parts planner's search. A pure
function of the model, the constraint and a cost function (plan -> predicted seconds; the cost
model's, measured on this machine). Two questions: the fastest plan within a memory budget, or
the smallest plan within a time limit.

Early layers hold the large tensors and are cheap to split; late layers hold the large weights.
So the search runs in stages, each evaluating exact plans (memory from the plan's buffers and
lifetimes, time from the cost function); a setting's plan is the better of aligned rows per
phase and equal parts:
0. a model small enough (at most EXHAUSTIVE_LIMIT settings of 1, 2, 4, ... phases per splittable
   layer and source) is searched exhaustively, so on it the answer is the optimum of that space;
1. prefixes: the first `cut` splittable layers (and the input source) take P phases each. For
   each P in 2, 4, 8, ..., a binary search over `cut` finds the shortest prefix that fits the
   budget (or the longest within the time limit);
2. greedy refinement: each round doubles the phases around the tensors that set the memory peak
   (those live at the arena's peak, and the output of the step with the largest scratch, which
   the run holds besides the arena), or holds whole a streamed tensor at the peak (the stream
   is cut there: the windows before it die before those after it are allocated), taking the
   candidate that saves the most bytes per second of predicted time added;
3. with a budget, coarsening: the source, all split layers, the split layers of each output
   height (also by a quarter), and each split layer in turn have their phases halved, each
   split layer is taken back to one phase and each held tensor released, while the plan still
   fits and gets faster, until a sweep changes nothing (the first stages split every layer up to
   the cut, but a late layer between splits may fit whole, and halving its phases one step at a
   time can pass through counts that fit worse than one phase). The pick is the fastest, where
   predictions within TIME_RESOLUTION are ties won by fewer steps.
The memory side is timing-independent: before the budget stages (and whenever no time limit
is given), a memory search runs that never looks at a time: from the smallest of the first
setting, the exhaustive settings and every splittable layer at P phases (P = 2, 4, ...), stage 2
with each round taking the candidate that saves the most bytes (ties: fewer steps), until no
candidate lowers the peak. Its smallest peak is the search's smallest: points the time-guided
stages find below it are dropped (they depend on the cost profile), so the smallest plan the
search reports, and whether a budget can be met at all, are the same under any cost profile.
With a time limit instead of a budget, stages 1 and 2 run under the limit, then stages 1-3 are
asked for the fastest plan below the smallest found within the limit (and, after a miss, a
step further below): refinement follows one path, and the budget stages, whose prefixes and
refinement depend on the budget, reach cheaper splits it passes by.
Work is bounded: every plan is memoised by its phases and held tensors; an evaluation drafts
both row alignments and, for the better, one held tensor (networks of at most AUTO_HOLD_LAYERS
splittable layers); stage 1 plans O(log(layers)) prefixes per P; a greedy round plans at most
SINGLE_MOVES + 3 + HOLD_MOVES candidates, for at most MAX_ROUNDS rounds, and rounds that save
nothing stop after PLATEAU_ROUNDS; a coarsening sweep plans at most 3 + 2 x (heights) + 2 x
(split layers, if at most COARSEN_SINGLES) + (held layers) candidates, and each sweep but the
last lowers the predicted time; a time limit adds at most TIGHTEN_ROUNDS budget searches.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from tightfit.analysis.csdf import needs_whole_input
from tightfit.graph.ir import Graph, spatial
from tightfit.techniques.deadline import Deadline, TimeUp, check
from tightfit.plan.lifetimes import Lifetimes, buffer_tensors, lifetimes, live_at
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.techniques.interface import Config, Point, pareto, run_memory

Phases = tuple[tuple[int, int], ...]  # sorted (layer id, phases > 1)
NEAR_PEAK = 0.9  # steps this close to the peak count as peaks too
SINGLE_MOVES = 4  # single-tensor candidates per round (the largest tensors at the peaks)
HOLD_MOVES = 2  # hold-whole candidates per round (the smallest streamed tensors at the peaks)
PLATEAU_ROUNDS = 6  # rounds in a row that may shrink buffers without lowering the peak
EXHAUSTIVE_LIMIT = 512  # graphs with at most this many settings are searched exhaustively
MAX_ROUNDS = 30  # greedy rounds at most per refinement
TIGHTEN_ROUNDS = 6  # with a time limit: rounds of asking the budget stages for a smaller point
TIGHTEN_STEP = 0.025  # after a round finds nothing within the limit, ask this much lower
TIME_RESOLUTION = 0.01  # predicted times closer than this are ties, broken by fewer steps
COARSEN_SINGLES = 48  # coarsening tries layers one at a time when at most this many are split
MEMORY_MOVES = ("bytes", "work")  # the memory side's refinements: most bytes saved, most per work added
STEP_MACS = 50_000  # a step's fixed cost in multiply-adds (~50 us at ~1 GMAC/s): `work`, the profile-free time
MEMORY_RESTARTS = 4  # the memory side refines from its 4 smallest points (each the smallest not refined yet)
AUTO_HOLD_LAYERS = 128  # evaluations try a hold on networks of at most this many splittable layers


@dataclass(frozen=True)
class PartsSetting:
    """A point's configuration (Point.config): phases per split layer, the input's phases (row
    bands), rows per phase aligned or not, layers held whole."""

    phases: Phases
    source_phases: int
    align: bool  # rows per phase aligned to the producers (PartsOptions.align), else equal parts
    held: tuple[int, ...] = ()  # layers whose outputs are held whole (PartsOptions.held)

    def phases_dict(self) -> dict[int, int]:
        return dict(self.phases)


@dataclass(frozen=True)
class PartsFigures:
    """What the search reads off a point's plan besides its run memory and time (Point.detail)."""

    buffer_bytes: int  # all buffers summed, no reuse (the paper's "Total")
    steps: int  # steps of its plan
    work: int  # multiply-adds of its steps plus STEP_MACS per step: a time the profile does not set


def label(setting: PartsSetting) -> str:
    return f"parts search: {len(setting.phases)} layers split, source {setting.source_phases}"


def plan_point(model: PlannedModel, point: Point, planner: str = "improve", layout: str = "nhwc",
               dtype: str = "fp32") -> Plan:
    """The placed plan of a point the search evaluated."""
    from tightfit.techniques.parts.planner import PartsOptions, plan_parts

    c: PartsSetting = point.config
    return plan_parts(model, c.phases_dict(), c.source_phases, planner, layout, dtype, PartsOptions(c.align, c.held))


@dataclass(frozen=True)
class PartsSearch:
    """The search's answer; its points are configured by a PartsSetting, detailed by PartsFigures."""

    chosen: Point
    front: tuple[Point, ...]  # Pareto front (memory, seconds) of every evaluated point
    evaluated: int
    fits: bool
    smallest: Point | None = None  # the smallest point (ties: fewer steps): the memory side's without max_seconds
    timed_out: bool = False  # the deadline stopped it: every point found so far is kept, none dropped


def smallest_key(p: Point) -> tuple:
    """Smallest peak first; ties broken without a time (fewer steps, then the setting)."""
    c = p.config
    return (p.memory_bytes, p.detail.steps, c.phases, c.source_phases, c.held, not c.align)


def _seconds(p: Point) -> float:
    return p.seconds[0]


def _peak(p: Point) -> int:
    return p.memory_bytes


def _buffers(p: Point) -> int:
    return p.detail.buffer_bytes


def search_parts(model: PlannedModel, seconds: Callable[[Plan], float], budget_bytes: int | None = None,
                 max_seconds: float | None = None, config: Config = Config(),
                 deadline: Deadline | None = None, progress: Callable[[str], None] = lambda line: None) -> PartsSearch:
    """With `budget_bytes`: the fastest plan found whose peak fits it. Without: the smallest peak
    found whose predicted time is at most `max_seconds` (None: any time). `fits` says whether
    the constraint is met; if not, `chosen` is the smallest peak found. A graph with at most
    EXHAUSTIVE_LIMIT settings (phase counts 1, 2, 4, ... per layer and source) is searched
    exhaustively, so the answer is the optimum of that space. Past `deadline` (checked before each
    new point) it stops and answers from the points found so far; `progress` gets a line per stage.
    `config`: how plans are drafted (layout, dtype; its setting "stream_outputs": every plan hands
    the model's outputs over by rows, PartsOptions.stream_outputs)."""
    g = model.graph
    evaluate = _Evaluations(model, seconds, config.layout, config.dtype, deadline, bool(config.get("stream_outputs", False)))
    base = evaluate({}, 1)
    settings = ladder_settings(g)
    exhaustive = settings.count <= EXHAUSTIVE_LIMIT  # (read at each call: tests lower it)
    max_rounds = MAX_ROUNDS
    floor = None
    if budget_bytes is not None:
        fits = lambda p: p.memory_bytes <= budget_bytes  # noqa: E731
        pick = _fastest
    else:
        fits = lambda p: max_seconds is None or _seconds(p) <= max_seconds  # noqa: E731
        pick = lambda ps: min(ps, key=lambda p: (p.memory_bytes, p.seconds))  # noqa: E731
    stage = lambda name: progress(f"parts search: {name}, {evaluate.summary()}")  # noqa: E731
    timed_out = False
    try:
        if max_seconds is None:
            exact = _smallest_by_memory(g, base, settings if exhaustive else (), max_rounds, evaluate, evaluate.build)
            floor = exact.memory_bytes
            stage("memory side done")
        elif exhaustive:
            for phases, source in settings:
                evaluate(phases, source)
        if budget_bytes is not None:
            if floor is None or floor <= budget_bytes:  # (below the memory side's smallest every find is dropped)
                _fastest_within(g, base, budget_bytes, max_rounds, evaluate)
                stage("fastest within the budget done")
        else:
            _time_limited(g, base, fits, max_rounds, evaluate)
    except TimeUp:
        timed_out, floor = True, None
        stage("time is up")
    # Below the memory side's smallest, a find depends on the times that guided it: dropped.
    points = [p for p in evaluate.seen.values() if floor is None or p.memory_bytes >= floor]
    ok = [p for p in points if fits(p)]
    smallest = min(points, key=smallest_key)
    chosen = pick(ok) if ok else smallest
    return PartsSearch(chosen, pareto(points), len(evaluate.seen), bool(ok), smallest, timed_out)


class _Evaluations:
    """Settings evaluated into points, memoised (points only: plans of big graphs are large).
    A setting's point is the better of its two row alignments and, where drafts are cheap, of
    holding whole the tensor where the stream peaks."""

    def __init__(self, model: PlannedModel, seconds: Callable[[Plan], float], layout: str, dtype: str,
                 deadline: Deadline | None, stream_outputs: bool = False) -> None:
        self.model, self.seconds, self.layout, self.dtype, self.deadline = model, seconds, layout, dtype, deadline
        self.stream_outputs = stream_outputs
        self.seen: dict[tuple[Phases, int, tuple[int, ...]], Point] = {}
        # A third draft per evaluation: worth it where drafts are cheap (DenseNet's 248 splittable
        # layers plan slowly; its holds come from the greedy stage's moves only).
        self.auto_hold = len(splittable_layers(model.graph)) <= AUTO_HOLD_LAYERS

    def build(self, p: Point) -> Plan:
        c = p.config
        return self._plan(c.phases_dict(), c.source_phases, c.align, c.held)

    def _plan(self, phases: Mapping[int, int], source: int, align: bool, held: tuple[int, ...]) -> Plan:
        from tightfit.techniques.parts.planner import PartsOptions, draft_parts

        return draft_parts(self.model, dict(phases), source, self.layout, self.dtype,
                           PartsOptions(align, held, stream_outputs=self.stream_outputs))

    def _draft(self, phases: Phases, source: int, align: bool, held: tuple[int, ...]) -> tuple[int, Plan, Lifetimes]:
        plan = self._plan(dict(phases), source, align, held)
        life = lifetimes(plan, [self.model.graph])
        # As the run needs it: the arena (the planners reach this bound) plus the largest step's
        # kernel temporaries, which are allocated outside the arena.
        return run_memory(plan, [self.model.graph], life), plan, life

    def __call__(self, phases: Mapping[int, int], source: int, held: tuple[int, ...] = ()) -> Point:
        key = (tuple(sorted((l, p) for l, p in phases.items() if p > 1)), max(source, 1), tuple(sorted(held)))
        if key not in self.seen:
            if self.seen:  # (the first setting is always planned: an answer needs one point)
                check(self.deadline)
            self.seen[key] = self._point(*key)
        return self.seen[key]

    def _point(self, phases: Phases, source: int, held: tuple[int, ...]) -> Point:
        g = self.model.graph
        # Aligned rows shrink each window but keep a lockstep pipeline's first windows alive
        # until its last phases; equal parts let producers run ahead. Neither always wins.
        aligns = (True, False) if phases else (True,)  # nothing split: one plan
        peak, plan, life, align = min(((*self._draft(phases, source, a, held), a) for a in aligns),
                                      key=lambda v: (v[0], not v[3]))
        if self.auto_hold and phases and not held:
            # Cutting the stream where it peaks: the one hold the greedy stage would try first.
            peak_tensors = [t for t, _ in _peak_tensors(g, plan, life)[0]]
            for lid in _hold_candidates(g, dict(phases), (), plan, peak_tensors)[:1]:
                held_peak, held_plan, _ = self._draft(phases, source, align, (lid,))
                if held_peak < peak:
                    peak, plan, held = held_peak, held_plan, (lid,)
        setting = PartsSetting(phases, source, align, held)
        figures = PartsFigures(sum(b.nbytes for b in plan.buffers), len(plan.steps()), plan_work(plan, g))
        return Point(setting, peak, (self.seconds(plan),), (label(setting),), detail=figures)

    def fitting(self, fits: Callable[[Point], bool]) -> list[Point]:
        return [p for p in self.seen.values() if fits(p)]

    def summary(self) -> str:
        smallest = min(self.seen.values(), key=smallest_key)
        return f"{len(self.seen)} plans, smallest {smallest.memory_bytes / 1e6:.3f} MB"


def _fastest_within(g: Graph, base: Point, budget: int, max_rounds: int, evaluate: _Evaluations) -> Point | None:
    """Stages 1-3 for a memory budget: the fastest point found that fits it."""
    fits = lambda p: p.memory_bytes <= budget  # noqa: E731
    if not fits(base) and not _prefixes(g, fits, True, evaluate):
        start = min(evaluate.seen.values(), key=lambda p: (p.memory_bytes, p.seconds))
        _refine_greedy(g, start, fits, lambda p: True, max_rounds, evaluate, evaluate.build)
    ok = evaluate.fitting(fits)
    return _coarsen(g, min(ok, key=lambda p: (p.seconds, p.memory_bytes)), fits, evaluate) if ok else None


def _time_limited(g: Graph, base: Point, fits, max_rounds: int, evaluate: _Evaluations) -> None:
    """Stages 1 and 2 under a time limit, then the budget stages asked for smaller points."""
    smallest_fitting = lambda default: min(evaluate.fitting(fits), key=lambda p: (p.memory_bytes, p.seconds),  # noqa: E731
                                           default=default)
    _prefixes(g, fits, False, evaluate)
    best = _refine_greedy(g, smallest_fitting(base), lambda p: False, fits, max_rounds, evaluate, evaluate.build)
    # Refining from one point follows one path; the budget stages, asked for anything
    # smaller, reach settings it passes by (a cheaper split elsewhere).
    below = 0.0  # how far below the smallest so far to ask; widened after each miss
    for _ in range(TIGHTEN_ROUNDS):
        best = smallest_fitting(best)
        smaller = _fastest_within(g, base, int(best.memory_bytes * (1 - below)) - 1, max_rounds, evaluate)
        below = 0.0 if smaller is not None and fits(smaller) else below + TIGHTEN_STEP


def _smallest_by_memory(g: Graph, base: Point, settings: Iterable[tuple[dict[int, int], int]], max_rounds: int,
                        evaluate, build) -> Point:
    """The memory side: the smallest point of the first setting, `settings` (the exhaustive
    ones, if any) and every splittable layer at P phases for each P, refined by stage 2 taking
    each round the candidate that saves the most bytes, or the most per unit of work added (MEMORY_MOVES),
    then again from the smallest point not refined from yet (MEMORY_RESTARTS refinements in all).
    No time is looked at, so every cost profile gives the same points. Returns the smallest
    point evaluated here."""
    found = [base]

    def collect(*args) -> Point:
        found.append(evaluate(*args))
        return found[-1]

    for phases, source in settings:
        collect(phases, source)
    splittable = splittable_layers(g)
    h_in = min(spatial(g.shape(t))[0] for t in g.inputs)
    top = max([h_in] + [spatial(g.shape(l.output))[0] for l in g.layers])
    p = 2
    while splittable and p <= 2 * top:
        collect({l: min(p, spatial(g.shape(g.layers[l].output))[0]) for l in splittable}, min(p, h_in))
        p *= 2
    refined: set[Point] = set()
    for _ in range(MEMORY_RESTARTS):
        start = min((q for q in found if q not in refined), key=smallest_key, default=None)
        if start is None:
            break
        refined.add(start)
        for by in MEMORY_MOVES:
            _refine_greedy(g, start, lambda q: False, lambda q: True, max_rounds, collect, build, by=by)
    return min(found, key=smallest_key)


@dataclass(frozen=True)
class LadderSettings:
    """Every setting of phase counts 1, 2, 4, ... (capped at the rows) per splittable layer and
    for the source; iterable, with its size known up front."""

    layers: tuple[int, ...]
    choices: tuple[tuple[int, ...], ...]
    sources: tuple[int, ...]

    @property
    def count(self) -> int:
        n = len(self.sources)
        for c in self.choices:
            n *= len(c)
        return n

    def __iter__(self):
        for source in self.sources:
            for counts in itertools.product(*self.choices):
                yield {l: c for l, c in zip(self.layers, counts) if c > 1}, source


def splittable_layers(g: Graph) -> tuple[int, ...]:
    """Ids of the layers that can run in more than one phase."""
    return tuple(l.id for l in g.layers if not needs_whole_input(g, l) and spatial(g.shape(l.output))[0] > 1)


def ladder_settings(g: Graph) -> LadderSettings:
    def ladder(h: int) -> tuple[int, ...]:
        out, p = [1], 2
        while p < 2 * h:
            out.append(min(p, h))
            p *= 2
        return tuple(dict.fromkeys(out))

    layers = splittable_layers(g)
    return LadderSettings(layers, tuple(ladder(spatial(g.shape(g.layers[l].output))[0]) for l in layers),
                          ladder(min(spatial(g.shape(t))[0] for t in g.inputs)))


def _prefixes(g: Graph, ok: Callable[[Point], bool], shortest: bool, evaluate) -> list[Point]:
    """Stage 1: for P = 2, 4, 8, ..., the first `cut` splittable layers at P phases. Memory falls
    and time grows with the cut, so a binary search finds the shortest prefix that is `ok`
    (a memory budget; `shortest`) or the longest (a time limit). Returns the ok points found.
    With a budget, P stops growing once its prefix is slower than the last P's: more phases on a
    shorter prefix only get slower from there (each binary search plans about log2(layers)
    points, and a large P's points are the largest plans)."""
    splittable = splittable_layers(g)
    h_in = min(spatial(g.shape(t))[0] for t in g.inputs)
    top = max([h_in] + [spatial(g.shape(l.output))[0] for l in g.layers])
    found = []
    p = 2
    while p <= 2 * top:
        def at(cut: int, p: int = p) -> Point:
            phases = {lid: min(p, spatial(g.shape(g.layers[lid].output))[0]) for lid in splittable[:cut]}
            return evaluate(phases, min(p, h_in))

        n = len(splittable)
        if shortest and ok(at(n)):
            lo, hi = 0, n  # at(hi) is ok
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if ok(at(mid)) else (mid + 1, hi)
            found.append(at(hi))
            if len(found) > 1 and _seconds(found[-1]) > _seconds(found[-2]):
                break
        elif not shortest:
            lo, hi = 0, n  # at(lo) is ok (cut 0 splits only the input: the least time)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if ok(at(mid)) else (lo, mid - 1)
            if ok(at(lo)):
                found.append(at(lo))
        p *= 2
    return found


def _refine_greedy(g: Graph, point: Point, done: Callable[[Point], bool],
                   allowed: Callable[[Point], bool], max_rounds: int, evaluate, build,
                   by: str = "time") -> Point:
    """Stage 2: refine around the memory peak, over `allowed` candidates, until `done` (or
    nothing lowers the peak). Each round takes the candidate that saves the most bytes per
    second of predicted time added (`by` "time"), per step added or the most bytes
    ("bytes"; ties: fewer steps) or per unit of `work` added ("work")."""
    def best(cands: list[Point], what: Callable[[Point], int]) -> Point:
        if by == "time":
            return max(cands, key=lambda c: _gain(point, c, what))
        if by == "work":
            return max(cands, key=lambda c: ((what(point) - what(c)) / max(1, c.detail.work - point.detail.work),
                                             [-v for v in smallest_key(c)[:2]]))
        return min(cands, key=lambda c: (what(c), smallest_key(c)))

    plateau = 0
    for _ in range(max_rounds):
        if done(point):
            break
        cands = [c for c in (evaluate(*move) for move in _moves(g, point, build(point))) if allowed(c)]
        better = [c for c in cands if c.memory_bytes < point.memory_bytes]
        if better:
            plateau = 0
            point = best(better, _peak)
            continue
        smaller = [c for c in cands if _buffers(c) < _buffers(point)]
        plateau += 1
        if not smaller or plateau > PLATEAU_ROUNDS:
            break
        point = best(smaller, _buffers)
    return point


def _fastest(points: list[Point]) -> Point:
    """The fastest point, where predictions within TIME_RESOLUTION of it count as ties, broken
    by fewer steps: the model times each step alone, and in a run many small steps of layers
    whose weights and windows alternate lose a little more than their isolated timings say
    (VGG 19 with stage 3 in 7-row bands: predicted 1.25% slower than layer by layer, measured
    2.7%), which decides between plans only where their predictions are this close."""
    best = min(_seconds(p) for p in points)
    return min((p for p in points if _seconds(p) <= best * (1 + TIME_RESOLUTION)),
               key=lambda p: (p.detail.steps, _seconds(p), p.memory_bytes))


def _coarsen(g: Graph, point: Point, fits: Callable[[Point], bool], evaluate) -> Point:
    """Stage 3: undo refinements the budget does not need. Sweeps over the source, all split
    layers together, all of them and the source, the split layers of each output height together
    (a stage of the network; halved, and a quarter fewer), and each split layer alone, halving
    the phases (or, for a layer alone, taking it back to one phase), and releases each held
    tensor, when the plan still fits and gets faster, until a sweep changes nothing."""
    def height(lid: int) -> int:
        return spatial(g.shape(g.layers[lid].output))[0]

    changed = True
    while changed:
        changed = False
        setting: PartsSetting = point.config
        heights = [height(l) for l, _ in setting.phases]
        stages = [(h, f) for h in sorted(set(heights)) if heights.count(h) > 1 for f in (0.5, 0.75)]
        sweep = [("source", 2), ("layers", 2), ("all", 2)] + [(("stage", h), f) for h, f in stages]
        # One layer at a time only on networks of a few split layers (each sweep plans two
        # candidates per layer; DenseNet splits hundreds, and its stages coarsen together).
        singles = [(l, d) for l, _ in setting.phases for d in (2, 0)] if len(setting.phases) <= COARSEN_SINGLES else []
        for which, to in sweep + singles + [("held", l) for l in setting.held]:
            current: PartsSetting = point.config  # (the point may have changed in this sweep)
            phases, source, held = current.phases_dict(), current.source_phases, current.held
            if which in ("source", "all"):
                source = max(1, source // 2)
            if which in ("layers", "all"):
                phases = {l: p // 2 for l, p in phases.items()}
            elif isinstance(which, tuple):  # a stage: halved, or a quarter fewer (8 -> 6 phases)
                phases = {l: int(p * to) if height(l) == which[1] else p for l, p in phases.items()}
            elif which == "held":
                held = tuple(l for l in held if l != to)
            elif which in phases:
                phases[which] = phases[which] // to if to else 1
            cand = evaluate(phases, source, tuple(l for l in held if phases.get(l, 1) > 1))
            if fits(cand) and _seconds(cand) < _seconds(point):
                point, changed = cand, True
    return point


def plan_work(plan: Plan, g: Graph) -> int:
    """A time no cost profile sets: multiply-adds of the plan's steps plus STEP_MACS per step."""
    from tightfit.ops import get_op

    total = 0
    for s in plan.steps():
        total += STEP_MACS
        if s.kind == "compute":
            layer = g.layers[s.layer]
            total += get_op(layer.op).macs(layer, s.out.region, [g.shape(t) for t in layer.inputs], g.shape(layer.output))
    return total


def _gain(old: Point, new: Point, what: Callable[[Point], int]) -> float:
    """Bytes saved per second of predicted time added (a faster candidate gains most)."""
    saved = what(old) - what(new)
    added = _seconds(new) - _seconds(old)
    return saved / max(added, 1e-6 * _seconds(old), 1e-12)  # (a search for memory alone times nothing)


def _moves(g: Graph, point: Point, plan: Plan):
    """Candidate settings (phases, source, held): refine alone each of the largest tensors live
    at the arena's peak and the output of the step with the largest scratch; all the tensors at
    the arena's peak together to at least 2, 4 and 8 times the fewest phases among them (a
    residual stage peaks with several tensors live, and refining one at a time would not lower
    it); and hold whole one of the HOLD_MOVES smallest (as whole tensors) streamed tensors at
    the peak, so the stream is cut there (a stream through many layers keeps all their windows
    live at once)."""
    setting: PartsSetting = point.config
    phases, source, held = setting.phases_dict(), setting.source_phases, setting.held
    tensors, scratch_tensor = _peak_tensors(g, plan)
    for tensor in _by_bytes(tensors, scratch_tensor)[:SINGLE_MOVES]:
        move = _refine(g, phases, source, tensor)
        if move is not None:
            yield move + (held,)
    if not tensors:
        return
    least = min(_phases_of(g, phases, source, t) for t, _ in tensors)
    for target in (2 * least, 4 * least, 8 * least):
        joint = (phases, source)
        for tensor, _ in tensors:
            joint = _refine(g, *joint, tensor, target) or joint
        if joint != (phases, source):
            yield joint + (held,)
    for lid in _hold_candidates(g, phases, held, plan, [t for t, _ in tensors])[:HOLD_MOVES]:
        yield phases, source, held + (lid,)


def _hold_candidates(g: Graph, phases: dict[int, int], held: tuple[int, ...], plan: Plan, tensors: list[str]) -> list[int]:
    """Producers of the windowed tensors among `tensors` that could be held (split, not held
    yet), the smallest tensor first."""
    windowed = {a.tensor for s in plan.steps() for a in (s.out,) + s.inputs if plan.buffers[a.buffer].kind == "window"}
    out = []
    for t in tensors:
        producer = _producer(g, t)
        if t in windowed and producer is not None and phases.get(producer.id, 1) > 1 and producer.id not in held:
            out.append(producer)
    return [p.id for p in sorted(out, key=lambda p: math.prod(g.shape(p.output)))]


def _by_bytes(tensors: list[tuple[str, int]], scratch: tuple[str, int] | None) -> list[str]:
    """Tensor names, the most bytes first; the scratch step's output ranks by its scratch."""
    ranked = dict(tensors)
    if scratch is not None:
        ranked[scratch[0]] = max(ranked.get(scratch[0], 0), scratch[1])
    return sorted(ranked, key=lambda t: -ranked[t])


def _peak_tensors(g: Graph, plan: Plan, life: Lifetimes | None = None) -> tuple[list[tuple[str, int]], tuple[str, int] | None]:
    """What sets the run's peak, the arena (the most bytes live at once) plus the largest step
    scratch (allocated outside the arena, so the two add up even at different steps): the
    tensors live where live bytes come within NEAR_PEAK of the arena's peak (lowering one of
    several equal peaks lowers nothing) with their buffer bytes, largest first; and the output
    tensor of the step with the largest scratch with that scratch (a kernel's temporary shrinks
    with its band), None without scratch. `life`: the plan's lifetimes, if already known."""
    life = life or lifetimes(plan, [g])
    live = life.live_bytes()
    top = max(live, default=0)
    near = [i for i, v in enumerate(live) if v >= NEAR_PEAK * top]
    steps = plan.steps()
    tensor_of = buffer_tensors(plan)
    sizes: dict[str, int] = {}
    for (b, _), r in live_at(life, near):
        t = tensor_of[b][1]
        sizes[t] = max(sizes.get(t, 0), r.size)
    scratch = max(life.step_scratch, default=0)
    at = steps[life.step_scratch.index(scratch)].out.tensor if scratch else None
    return sorted(sizes.items(), key=lambda kv: -kv[1]), (at, scratch) if at is not None else None


def _producer(g: Graph, tensor: str):
    return next((l for l in g.layers if l.output == tensor), None)


def _phases_of(g: Graph, phases: dict[int, int], source: int, tensor: str) -> int:
    producer = _producer(g, tensor)
    return source if producer is None else phases.get(producer.id, 1)


def _refine(g: Graph, phases: dict[int, int], source: int, tensor: str,
            target: int | None = None) -> tuple[dict[int, int], int] | None:
    """The tensor's producer takes `target` phases (default: double); its consumers take at
    least as many, so the tensor is consumed a band at a time. None if nothing changes."""
    producer = _producer(g, tensor)
    consumers = [l for l in g.layers if tensor in l.inputs]
    if (producer is not None and needs_whole_input(g, producer)) or any(needs_whole_input(g, c) for c in consumers):
        return None
    h, _ = spatial(g.shape(tensor))
    new = min(h, max(target or 0, 2 * _phases_of(g, phases, source, tensor) if target is None else 0))
    out = dict(phases)
    for c in consumers:
        hc, _ = spatial(g.shape(c.output))
        out[c.id] = max(out.get(c.id, 1), min(hc, new))
    if producer is not None:
        out[producer.id] = max(out.get(producer.id, 1), new)
    new_source = max(source, new) if producer is None else source
    if out == phases and new_source == source:
        return None
    return out, new_source
