"""One search over every technique (Minakova thesis ch. 6, Algorithms 8-10, and beyond it): for one
CNN or an application of several, the plans on the memory/throughput Pareto front, and the one
that fits a memory budget and every CNN's minimum fps with the least memory.

The problem (pymoo style, separate from the algorithm): a genome per CNN, concatenated.
  [technique, order, align, source, group_1 .. group_G]
- technique 0: the layer genome below; technique i > 0: the i-th candidate plan a technique
  source produced for this CNN (SOURCES: a dict of functions with one signature, networkx-style
  strategies: `source(ctx: CNNContext) -> Sequence[Candidate]`);
- order: with no layer split, imported (0) or the memory-minimising order (1);
- align: rows per phase aligned to the producers' phases (1) or equal parts (0);
- source: the input arrives in 2^gene row bands;
- group_g: every splittable layer of group g computes its output in 2^gene phases (capped at its
  rows), i.e. k = rows / phases rows per phase. A small CNN has a group per layer; a large one
  groups contiguous layers of one resolution, long runs cut after their smallest tensor (at
  most `max_groups` genes).
Buffer reuse is always applied across every CNN of the application, pipeline-aware: one plan
holds every CNN's partitions, its buffers placed together (place()), partitions that run at the
same time never share memory and a tensor crossing pipelined partitions is a FIFO of two copies.
In a CNN with several partitions, the layers next to a crossing tensor stay whole (so the
crossing tensor is whole and every partition's steps keep their order).

Objectives: the application's run memory (from the analyser: the arena, i.e. its lower bound,
or with concurrent partitions the placed arena, plus the largest step's kernel temporaries; plus
the parameters with `with_params`) and the predicted seconds of every CNN (cost model).
Evaluations are memoised per genome and per CNN. The front is the Pareto set of every plan
evaluated, seeds included (reuse only, parts everywhere, the first groups by parts, every
source's candidates, and the combinations of each CNN's two smallest seeds), so it is never
worse than any of them; NSGA-II is followed by a local search around the front.

The memory side is timing-independent. Times guide NSGA-II, the local search and the sources'
fastest picks, so what they find depends on the cost profile. The memory side never looks at a
time: reuse only, the layer-genome seeds, every source's smallest plan (found by its own memory
side), the combinations of each CNN's smallest of these, a descent on memory alone from the
smallest, or in a small space every genome of these. The front keeps no point below the memory
side's smallest, so the smallest plan `fit` reports, and whether a budget can be met, are the
same under any cost profile (and the same seed).
"""
from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from tightfit import children
from tightfit.errors import TightfitError
from tightfit.graph.ir import Graph, spatial
from tightfit.plan.deadline import Deadline, expired
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.offsets import lower_bound
from tightfit.plan.reuse import PlannedModel, _fifo_copies
from tightfit.plan.schema import Buffer, Partition, Plan, Step

# The search places only plans with concurrent partitions (the others' run memory is their lower
# bound) and fast; the chosen plan is placed by "improve".
SEARCH_PLANNER = "greedy_by_size"
MAX_GROUPS = 8
POP_SIZE = 16
GENERATIONS = 20
EXHAUSTIVE_LIMIT = 512  # spaces at most this large are enumerated instead of searched
# Work bound of the genetic search, in steps of the CNN plans it builds (building and timing a
# plan costs about its steps): small CNNs run every generation, a large one stops early, the
# same way for the same seed.
MAX_STEPS = 100_000
# A CNN this large (DenseNet-121: 250 layers; the zoo's next is 124) takes about a second per plan
# to build and time (finest parts: ~6,700 steps), so by default it is searched quickly: its layer
# seeds are reuse only and parts everywhere (one alignment), its tiling source searches grids up to
# QUICK_GRID_LIMIT over QUICK_CUTS cuts, the parts search is left out (the parts-everywhere seed
# stands for it), and the genetic search does not run. `thorough` searches it as any other.
QUICK_LAYERS = 160
QUICK_GRID_LIMIT = 4
QUICK_CUTS = 4
HEAD = 4  # genes before the groups: technique, order, align, source
MEMORY_ROUNDS = 16  # moves of the memory side's descent (each plans at most two per gene)


class FitError(TightfitError):
    """No plan meets the constraints; names the smallest memory and best fps reachable."""


@dataclass(frozen=True)
class Candidate:
    """A one-model plan a technique source offers for one CNN (model index 0, one partition)."""

    technique: str
    label: str
    build: Callable[[], Plan]
    # The source's smallest plan, found by its memory side (no time looked at): the same under
    # any cost profile, so it may seed the search's memory side.
    exact: bool = False


def _silent(line: str) -> None:
    pass


@dataclass(frozen=True)
class CNNContext:
    """What a technique source gets: the CNN (its `batch` is the request size), its run-memory
    budget (bytes, parameters excluded; None: no budget), the cost model's predicted seconds of
    a one-model plan, and the cost model itself (None when the search runs on a plain function)."""

    model: PlannedModel
    budget_bytes: int | None
    seconds: Callable[[Plan], float]
    cost: Any = None
    layout: str = "nhwc"
    dtype: str = "fp32"
    quick: bool = False  # a large CNN searched quickly (QUICK_LAYERS)
    deadline: Deadline | None = None  # sources stop past it and offer what they found so far
    progress: Callable[[str], None] = _silent


TechniqueSource = Callable[[CNNContext], Sequence[Candidate]]


def parts_search_source(ctx: CNNContext) -> list[Candidate]:
    """The parts search's pick for the budget and the smallest plan it found."""
    from tightfit.plan.parts import draft_parts
    from tightfit.plan.parts_search import search_parts

    if ctx.budget_bytes is None or ctx.quick:
        return []
    found = search_parts(ctx.model, ctx.seconds, ctx.budget_bytes, layout=ctx.layout, dtype=ctx.dtype,
                         deadline=ctx.deadline, progress=ctx.progress)
    points = [found.smallest] + ([found.chosen] if found.chosen != found.smallest else [])
    exact = not found.timed_out
    return [Candidate("parts_search", f"parts search: {len(p.phases)} layers split, source {p.source_phases}",
                      lambda p=p: draft_parts(ctx.model, p.phases_dict(), p.source_phases, ctx.layout, ctx.dtype,
                                              align=p.align, held=p.held), exact=exact and p == found.smallest)
            for p in points]


def tiling_source(ctx: CNNContext) -> list[Candidate]:
    """The tiling search's pick for the budget and the smallest configuration it reached. It times
    parts of plans (segments), so it needs the cost model itself; kept to two groups and a short
    front so that it costs about what the parts search does."""
    from tightfit.plan.tiling import (candidate_cuts, cost_seconds, default_grids, draft_tiling, search_tiling,
                                      smallest_key)

    if ctx.budget_bytes is None or ctx.cost is None:
        return []
    g = ctx.model.graph
    space = dict(grids=default_grids(QUICK_GRID_LIMIT), cuts=candidate_cuts(g, QUICK_CUTS)) if ctx.quick else {}
    found = search_tiling(ctx.model, cost_seconds(ctx.cost, g), ctx.budget_bytes, max_groups=2,
                          layout=ctx.layout, dtype=ctx.dtype, timed_per_segment=1, front_points=0, parts=False,
                          deadline=ctx.deadline, progress=ctx.progress, **space)
    smallest = min(found.points or (found.chosen,), key=smallest_key)
    points = [p for p in dict.fromkeys([smallest, found.chosen]) if p.groups]
    return [Candidate("tiling", f"fused tiling {p.spec}",
                      lambda p=p: draft_tiling(ctx.model, p.groups, ctx.layout, ctx.dtype),
                      exact=p == smallest and not found.timed_out)
            for p in points]


def vbs_source(ctx: CNNContext) -> list[Candidate]:
    """For a request of several samples (`fit --batch R`): the variable-batch plan that fits."""
    from tightfit.plan.vbs_graph import search_vbs

    if ctx.model.batch == 1 or ctx.budget_bytes is None or ctx.cost is None:
        return []
    try:
        found = search_vbs(ctx.model, None, ctx.budget_bytes, ctx.cost, layout=ctx.layout)
    except TightfitError:  # a graph the DP's main path does not cover (a branch inside a branch)
        return []
    if not found.fits or found.plan is None:
        return []
    label = "variable batch: " + ", ".join(f"{lid}x{b}" for lid, b in found.steps[:6]) + ("..." if len(found.steps) > 6 else "")
    return [Candidate("vbs", label, lambda: found.plan)]


# Technique sources: each returns candidate plans for one CNN (networkx-style strategies).
SOURCES: dict[str, TechniqueSource] = {"parts_search": parts_search_source, "tiling": tiling_source,
                                       "vbs": vbs_source}
# Sources that only plan and look up step times (no kernel runs): on a large CNN each runs in a
# forked process beside the others and beside the seeds' planning, which saves a large CNN's
# `fit` most of their time on a machine with several cores. A forked source never measures a
# step (its process would time it beside the others): one that meets an unprofiled step is run
# again here, as any source that fails there. Results are the same either way.
FORKED_SOURCES = ("parts_search", "tiling")
FORK_MIN_LAYERS = 40  # smaller CNNs' sources take less time than a process costs


class _Unprofiled(Exception):
    """A forked source needs a step time the profile does not hold."""


def _run_forked(jobs: Sequence[Callable[[], Any]], meanwhile: Callable[[], None]) -> list[tuple[bool, Any]]:
    """Each job in a forked process (at most one per core at a time), `meanwhile` here; per job
    (True, its result) or (False, why it failed there)."""
    import multiprocessing as mp
    import os
    from multiprocessing.connection import wait

    fork = mp.get_context("fork")
    limit = max(1, os.cpu_count() or 1)
    results: list[tuple[bool, Any]] = [(False, "not run")] * len(jobs)
    todo = list(range(len(jobs)))
    running: dict[Any, tuple[int, Any]] = {}

    def start() -> None:
        while todo and len(running) < limit:
            i = todo.pop(0)
            receive, send = fork.Pipe(duplex=False)
            proc = fork.Process(target=_forked_job, args=(jobs[i], send, os.getpid()), daemon=True)
            proc.start()
            children.adopt(proc)
            send.close()
            running[receive] = (i, proc)

    try:
        start()
        meanwhile()
        while running:
            for conn in wait(list(running)):
                i, proc = running.pop(conn)
                try:
                    results[i] = conn.recv()
                except EOFError:
                    results[i] = (False, f"process ended with {proc.exitcode}")
                conn.close()
                proc.join()
                children.LIVE.pop(proc.pid, None)
            start()
    finally:  # after an error here: no process is left behind
        for conn, (_, proc) in running.items():
            proc.terminate()
            proc.join()
            conn.close()
            children.LIVE.pop(proc.pid, None)
    return results


def _forked_job(job: Callable[[], Any], send, parent: int) -> None:
    children.in_forked_child(parent)
    try:
        send.send((True, job()))
    except BaseException as e:  # reported to the parent, which runs the job itself
        send.send((False, repr(e)))
    finally:
        send.close()


def _refuse(*args, **kwargs):
    raise _Unprofiled()


def _forbid_measuring(cost: Any) -> None:
    """In a forked process: the profile stays the parent's, and a step it lacks is not timed."""
    if cost is not None:
        cost.path = None
        cost._bound_step = _refuse


@contextmanager
def _profiled_only(cost: Any):
    """Step times from the profile only (a step it lacks raises _Unprofiled): other processes
    are busy, and a step timed now would be timed slow."""
    if cost is None:
        yield
        return
    cost._bound_step = _refuse
    try:
        yield
    finally:
        del cost._bound_step


def _candidates_forked(source: TechniqueSource, ctx: CNNContext) -> list[tuple[str, str, Plan, bool]]:
    """A source's candidates with their plans built (a plan, unlike a build function, can be
    sent back from a forked process; the search builds every candidate's plan anyway)."""
    _forbid_measuring(ctx.cost)
    return [(c.technique, c.label, c.build(), c.exact) for c in source(ctx)]


# --- the application ----------------------------------------------------------------------------

@dataclass(frozen=True)
class FitApp:
    """CNNs, their partitions (model, layer ids) in run order, and the partitions that run at the
    same time (pipeline sets of partition ids)."""

    models: tuple[PlannedModel, ...]
    names: tuple[str, ...]
    partitions: tuple[tuple[int, tuple[int, ...]], ...]
    concurrent: tuple[tuple[int, ...], ...] = ()

    @staticmethod
    def single(model: PlannedModel, name: str | None = None) -> "FitApp":
        return FitApp((model,), (name or model.spec,), ((0, tuple(range(len(model.graph.layers)))),))

    @property
    def graphs(self) -> list[Graph]:
        return [m.graph for m in self.models]


@dataclass(frozen=True)
class FitPoint:
    """One evaluated application plan."""

    genes: tuple[int, ...]
    memory_bytes: int  # run memory (+ parameters when the budget bounds them)
    seconds: tuple[float, ...]  # predicted, per CNN
    labels: tuple[str, ...]  # per CNN: what it runs

    @property
    def fps(self) -> tuple[float, ...]:
        return tuple(1.0 / s if s > 0 else math.inf for s in self.seconds)

    def objectives(self) -> tuple[float, ...]:
        return (float(self.memory_bytes),) + self.seconds


def pareto(points: Sequence[FitPoint]) -> tuple[FitPoint, ...]:
    """Points no other point dominates (memory and every CNN's seconds), by increasing memory."""
    ordered = sorted(set(points), key=lambda p: (p.objectives(), p.genes))
    front: list[FitPoint] = []
    for p in ordered:
        if not any(dominates(q, p) or q.objectives() == p.objectives() for q in front):
            front.append(p)
    return tuple(front)


def dominates(a: FitPoint, b: FitPoint) -> bool:
    oa, ob = a.objectives(), b.objectives()
    return all(x <= y for x, y in zip(oa, ob)) and oa != ob


# --- one CNN's space ----------------------------------------------------------------------------

def _log2_top(h: int) -> int:
    """The largest gene that still changes phases for h rows: 2^gene >= h first at this gene."""
    return max(0, math.ceil(math.log2(h))) if h > 1 else 0


@dataclass
class CNNSpace:
    """The genome of one CNN and the plans it decodes to (memoised)."""

    index: int
    model: PlannedModel
    partitions: tuple[tuple[int, ...], ...]  # this CNN's partitions' layers, app order
    pids: tuple[int, ...]  # their partition ids in the application
    local_concurrent: tuple[tuple[int, ...], ...]  # pipeline sets in local partition indices
    groups: tuple[tuple[int, ...], ...]
    source_top: int
    candidates: tuple[Candidate, ...] = ()
    layout: str = "nhwc"
    dtype: str = "fp32"
    quick: bool = False  # searched quickly (QUICK_LAYERS)
    _plans: dict = field(default_factory=dict)
    _memory: dict = field(default_factory=dict)
    planned_steps: int = 0

    @property
    def width(self) -> int:
        return HEAD + len(self.groups)

    def upper(self) -> list[int]:
        g = self.model.graph
        tops = [max(_log2_top(spatial(g.shape(g.layers[l].output))[0]) for l in grp) for grp in self.groups]
        return [len(self.candidates), 1, 1, self.source_top] + tops

    def decode(self, genes: Sequence[int]) -> tuple:
        """A canonical key: genomes that give the same plan give the same key."""
        technique, order, align, source, *levels = (int(v) for v in genes)
        if technique > 0:
            return ("candidate", technique)
        g = self.model.graph
        phases = {}
        for grp, level in zip(self.groups, levels):
            for l in grp:
                p = min(2 ** level, spatial(g.shape(g.layers[l].output))[0])
                if p > 1:
                    phases[l] = p
        src = min(2 ** source, spatial(g.shape(g.inputs[0]))[0])
        if not phases and src == 1:
            return ("whole", ("imported", "memory")[order])
        return ("parts", tuple(sorted(phases.items())), src, bool(align))

    def label(self, key: tuple) -> str:
        if key[0] == "candidate":
            return self.candidates[key[1] - 1].label
        if key[0] == "whole":
            return f"layer by layer, {key[1]} order"
        return f"by parts: {len(key[1])} layers split, input in {key[2]} bands" + (", aligned rows" if key[3] else "")

    def plan(self, key: tuple) -> Plan:
        """This CNN's plan: model index 0, its steps split into its partitions."""
        if key not in self._plans:
            self._plans[key] = split_partitions(self._one_partition(key), self.model.graph, self.partitions,
                                                self.local_concurrent)
            self.planned_steps += sum(len(p.steps) for p in self._plans[key].partitions)
        return self._plans[key]

    def memory(self, key: tuple) -> int:
        """Run memory of this CNN's plan alone."""
        if key not in self._memory:
            self._memory[key] = run_memory(self.plan(key), [self.model.graph])
        return self._memory[key]

    def _one_partition(self, key: tuple) -> Plan:
        from tightfit.plan.parts import draft_parts
        from tightfit.plan.reuse import plan_reuse

        if key[0] == "candidate":
            return self.candidates[key[1] - 1].build()
        if key[0] == "whole":
            return plan_reuse(self.model, SEARCH_PLANNER, key[1], self.layout, self.dtype)
        return draft_parts(self.model, dict(key[1]), key[2], self.layout, self.dtype, align=key[3])


def _groups(g: Graph, layers: Sequence[int], max_groups: int) -> tuple[tuple[int, ...], ...]:
    """One group per layer if few; else runs of layers with the same output rows, adjacent runs
    merged (the smallest pair first) down to `max_groups`, or the longest run cut after its
    smallest output up to `max_groups` (a whole group after a split one then starts from a
    small tensor: the split layers' windows die there and their memory is reused)."""
    if len(layers) <= max_groups:
        return tuple((l,) for l in layers)
    rows = lambda l: spatial(g.shape(g.layers[l].output))[0]  # noqa: E731
    runs: list[list[int]] = []
    for l in layers:
        if runs and rows(runs[-1][-1]) == rows(l):
            runs[-1].append(l)
        else:
            runs.append([l])
    while len(runs) > max_groups:
        i = min(range(len(runs) - 1), key=lambda i: len(runs[i]) + len(runs[i + 1]))
        runs[i:i + 2] = [runs[i] + runs[i + 1]]
    while len(runs) < max_groups:
        i = max(range(len(runs)), key=lambda i: len(runs[i]))
        run = runs[i]
        if len(run) < 4:
            break
        cut = min(range(1, len(run) - 1), key=lambda k: (g.tensors[g.layers[run[k]].output].nbytes(), -k)) + 1
        runs[i:i + 1] = [run[:cut], run[cut:]]
    return tuple(tuple(r) for r in runs)


def _fixed_whole(g: Graph, partitions: Sequence[Sequence[int]]) -> tuple[set[int], bool]:
    """Layers that must stay whole because a tensor they write or read crosses partitions, and
    whether the input crosses (then it arrives whole)."""
    if len(partitions) < 2:
        return set(), False
    part_of = {l: i for i, p in enumerate(partitions) for l in p}
    producer = {l.output: l.id for l in g.layers}
    fixed: set[int] = set()
    input_parts = {part_of[l.id] for l in g.layers if g.inputs[0] in l.inputs}
    for layer in g.layers:
        for t in layer.inputs:
            if t in producer and part_of[producer[t]] != part_of[layer.id]:
                fixed.update((producer[t], layer.id))
    return fixed, len(input_parts) > 1


def cnn_spaces(app: FitApp, max_groups: int = MAX_GROUPS, layout: str = "nhwc", dtype: str = "fp32",
               thorough: bool = False) -> list[CNNSpace]:
    from tightfit.plan.parts_search import splittable_layers

    spaces = []
    for m, model in enumerate(app.models):
        g = model.graph
        pids = tuple(i for i, (mm, _) in enumerate(app.partitions) if mm == m)
        parts = tuple(tuple(app.partitions[i][1]) for i in pids)
        local = tuple(tuple(pids.index(i) for i in c if i in pids) for c in app.concurrent)
        local = tuple(c for c in local if len(c) > 1)
        fixed, input_crosses = _fixed_whole(g, parts)
        layers = [l for l in splittable_layers(g) if l not in fixed]
        source_top = 0 if input_crosses else _log2_top(spatial(g.shape(g.inputs[0]))[0])
        spaces.append(CNNSpace(m, model, parts, pids, local, _groups(g, layers, max_groups), source_top,
                               layout=layout, dtype=dtype, quick=not thorough and len(g.layers) >= QUICK_LAYERS))
    return spaces


def split_partitions(plan: Plan, g: Graph, partitions: Sequence[Sequence[int]],
                     concurrent: Sequence[Sequence[int]] = ()) -> Plan:
    """A one-partition plan's steps distributed over `partitions` (layer ids), each keeping its
    order: a compute step goes with its layer, a copy with the tensor's producer, the input
    with its first consumer. Valid when every tensor crossing partitions is written whole
    before it is read (the fit genome keeps the layers next to crossing tensors whole)."""
    if len(partitions) == 1:
        return replace(plan, partitions=(replace(plan.partitions[0], layers=tuple(partitions[0])),))
    part_of = {l: i for i, p in enumerate(partitions) for l in p}
    producer = {l.output: l.id for l in g.layers}
    first_use = min(part_of[l.id] for l in g.layers if g.inputs[0] in l.inputs)
    per: list[list[Step]] = [[] for _ in partitions]
    for s in plan.steps():
        if s.kind == "compute":
            k = part_of[s.layer]
        else:
            k = part_of[producer[s.out.tensor]] if s.out.tensor in producer else first_use
        per[k].append(s)
    parts = tuple(Partition(i, 0, tuple(l for l in plan.partitions[0].layers if part_of[l] == i), tuple(steps))
                  for i, steps in enumerate(per))
    return replace(plan, partitions=parts, concurrent=tuple(tuple(c) for c in concurrent))


def merge(app: FitApp, plans: Sequence[Plan]) -> Plan:
    """One application plan from every CNN's plan: buffers renumbered, steps and partitions
    given their model and application ids, FIFO copies for buffers two concurrent partitions
    share; offsets not placed yet."""
    buffers: list[Buffer] = []
    slots: list[tuple[int, Partition]] = []  # (application partition id, partition)
    knobs = []
    for m, plan in enumerate(plans):
        base = len(buffers)
        buffers.extend(replace(b, id=b.id + base, offsets=(0,), overlay=None if b.overlay is None else
                               (b.overlay[0] + base, b.overlay[1])) for b in plan.buffers)
        pids = [i for i, (mm, _) in enumerate(app.partitions) if mm == m]
        for pid, p in zip(pids, plan.partitions):
            steps = p.steps if base == 0 and all(s.model == m for s in p.steps) else tuple(
                replace(s, model=m, out=replace(s.out, buffer=s.out.buffer + base),
                        inputs=tuple(replace(a, buffer=a.buffer + base) for a in s.inputs)) for s in p.steps)
            slots.append((pid, Partition(pid, m, p.layers, steps)))
        knobs.append(dict(plan.knobs))
    parts = tuple(p for _, p in sorted(slots, key=lambda s: s[0]))
    copies = _fifo_copies(parts, app.concurrent, len(buffers))
    # Overlays are for plans whose steps run one after another (the checker's simulation is
    # sequential): with concurrent partitions they are dropped (more memory, still correct).
    buffers = [replace(b, offsets=(0,) * c, overlay=b.overlay if not app.concurrent else None) for b, c in zip(buffers, copies)]
    dtype = plans[0].dtype
    return Plan(tuple(m.ref() for m in app.models), dtype, tuple(buffers), parts,
                tuple(tuple(c) for c in app.concurrent), 0, {"method": "fit", "cnns": knobs})


def run_memory(plan: Plan, graphs: Sequence[Graph]) -> int:
    """The analyser's run memory of an unplaced plan: the arena plus the largest step's kernel
    temporaries. The arena is its lower bound, which the offset planners reach on plans without
    concurrent partitions; with them, it is what the search's placement gives (the chosen
    plan's final placement is never larger)."""
    from tightfit.plan.place import place

    life = lifetimes(plan, graphs)
    arena = place(plan, graphs, SEARCH_PLANNER).arena_bytes if plan.concurrent else lower_bound(life.reqs)
    return arena + max(life.step_scratch, default=0)


# --- the problem --------------------------------------------------------------------------------

class FitProblem:
    """Decodes genomes, evaluates them (memoised) and keeps every point evaluated."""

    def __init__(self, app: FitApp, cost_seconds: Callable[[Plan, Sequence[Graph]], float],
                 param_bytes: int = 0, max_groups: int = MAX_GROUPS, layout: str = "nhwc", dtype: str = "fp32",
                 cost: Any = None, thorough: bool = False):
        self.app = app
        self.cost_seconds = cost_seconds
        self.cost = cost
        self.param_bytes = param_bytes
        self.spaces = cnn_spaces(app, max_groups, layout, dtype, thorough)
        self.points: dict[tuple, FitPoint] = {}
        self.exact: set[tuple] = set()  # keys of the points the memory side evaluated
        self._memory: dict[tuple, int] = {}
        self._seconds: dict[tuple[int, tuple], float] = {}
        self.on_evaluate: Callable[[int], None] = lambda n: None
        self.max_steps = math.inf
        self.deadline: Deadline | None = None  # the genetic search and the sources stop past it
        self.say: Callable[[str], None] = _silent

    @property
    def upper(self) -> list[int]:
        return [u for s in self.spaces for u in s.upper()]

    @property
    def size(self) -> int:
        return math.prod(u + 1 for u in self.upper)

    def split(self, genes: Sequence[int]) -> list[Sequence[int]]:
        out, i = [], 0
        for s in self.spaces:
            out.append(genes[i:i + s.width])
            i += s.width
        return out

    def keys(self, genes: Sequence[int]) -> tuple:
        return tuple(s.decode(x) for s, x in zip(self.spaces, self.split(genes)))

    def plan(self, genes: Sequence[int]) -> Plan:
        """The application plan of a genome (unplaced)."""
        return merge(self.app, [s.plan(k) for s, k in zip(self.spaces, self.keys(genes))])

    @property
    def planned_steps(self) -> int:
        return sum(s.planned_steps for s in self.spaces)

    def evaluate(self, genes: Sequence[int]) -> FitPoint:
        genes = tuple(int(v) for v in genes)
        keys = self.keys(genes)
        if keys not in self.points:
            if self.planned_steps > self.max_steps or (self.max_steps < math.inf and expired(self.deadline)):
                raise _OutOfWork
            memory = self.memory(genes)
            seconds = tuple(self._cnn_seconds(s, k) for s, k in zip(self.spaces, keys))
            self.points[keys] = FitPoint(genes, memory, seconds, tuple(s.label(k) for s, k in zip(self.spaces, keys)))
            self.on_evaluate(len(self.points))
        return self.points[keys]

    def memory(self, genes: Sequence[int]) -> int:
        """A genome's memory (as FitPoint.memory_bytes) without predicting its time."""
        keys = self.keys(genes)
        if keys not in self._memory:
            if len(self.spaces) == 1 and not self.app.concurrent:  # the application's plan is the CNN's
                self._memory[keys] = self.spaces[0].memory(keys[0]) + self.param_bytes
            else:
                plan = merge(self.app, [s.plan(k) for s, k in zip(self.spaces, keys)])
                self._memory[keys] = run_memory(plan, self.app.graphs) + self.param_bytes
        return self._memory[keys]

    def exact_genes(self, genes: Sequence[int]) -> bool:
        """Whether every CNN runs its layer genome or an exact candidate (no time-guided plan)."""
        return all(x[0] == 0 or s.candidates[x[0] - 1].exact for s, x in zip(self.spaces, self.split(genes)))

    def evaluate_exact(self, genes: Sequence[int]) -> FitPoint:
        """Evaluate for the memory side (which then counts the point)."""
        p = self.evaluate(genes)
        self.exact.add(self.keys(p.genes))
        return p

    def _cnn_seconds(self, space: CNNSpace, key: tuple) -> float:
        if (space.index, key) not in self._seconds:
            self._seconds[(space.index, key)] = self.cost_seconds(space.plan(key), [space.model.graph])
        return self._seconds[(space.index, key)]

    def add_candidates(self, sources: Mapping[str, TechniqueSource], budget_bytes: int | None,
                       meanwhile: Callable[[], None] = lambda: None) -> None:
        """Ask every technique source for candidates for each CNN that runs as one partition
        (a source plans a whole CNN; a CNN split into partitions keeps the layer genome). The
        FORKED_SOURCES of a large CNN run in forked processes while `meanwhile` runs here."""
        import os

        asked: list[tuple[CNNSpace, str, CNNContext]] = []
        for s in self.spaces:
            if len(s.partitions) > 1:
                continue
            g = s.model.graph
            ctx = CNNContext(s.model, budget_bytes, lambda p, g=g: self.cost_seconds(p, [g]), self.cost, s.layout, s.dtype,
                             s.quick, self.deadline, self.say)
            asked += [(s, name, ctx) for name in sources]
        forked = [i for i, (s, name, _) in enumerate(asked) if name in FORKED_SOURCES
                  and len(s.model.graph.layers) >= FORK_MIN_LAYERS and (os.cpu_count() or 1) > 1]
        if forked and self.cost is not None:
            self.cost.loop_seconds  # measured here, before the forked processes read it
        done = _run_forked([lambda i=i: _candidates_forked(sources[asked[i][1]], asked[i][2]) for i in forked], meanwhile)
        found = dict(zip(forked, done))
        per_space: dict[int, list[Candidate]] = {}
        for i, (s, name, ctx) in enumerate(asked):
            ok, result = found.get(i, (False, None))
            if ok:
                cands = [Candidate(t, label, lambda plan=plan: plan, exact) for t, label, plan, exact in result]
            else:
                cands = list(sources[name](ctx))
            per_space.setdefault(s.index, []).extend(cands)
        for s in self.spaces:
            if s.index in per_space:
                # The exact candidates first: their genes then do not depend on how many
                # time-guided candidates a source offered.
                s.candidates = tuple(sorted(per_space[s.index], key=lambda c: not c.exact))

    def seeds(self) -> list[tuple[int, ...]]:
        """Reuse only (both orders), parts everywhere (one row per phase; both alignments), the
        first groups by parts and the rest whole or in two parts (early layers hold the large
        tensors; the rest reuses memory after them), and every candidate of every source; each
        CNN alike."""
        genomes = []
        per_cnn = []
        for s in self.spaces:
            n = len(s.groups)
            candidates = [[i, 0, 0, 0] + [0] * n for i in range(1, len(s.candidates) + 1)]
            per_cnn.append(self._layer_seeds(s) + candidates)
        for k in range(max(len(c) for c in per_cnn)):
            genomes.append(tuple(v for c in per_cnn for v in c[min(k, len(c) - 1)]))
        return list(dict.fromkeys(genomes))

    @staticmethod
    def _layer_seeds(s: CNNSpace) -> list[list[int]]:
        """One CNN's seeds of the layer genome (technique 0)."""
        up = s.upper()
        n = len(s.groups)
        whole = [[0, 0, 0, 0] + [0] * n, [0, 1, 0, 0] + [0] * n]
        finest = [[0, 0, 0] + up[3:], [0, 0, 1] + up[3:]]
        if s.quick:
            return whole + finest[:1]
        prefixes = [[0, 0, 0] + up[3:5 + k] + [min(rest, u) for u in up[5 + k:]]
                    for rest in (0, 1) for k in range(n - 1)]
        return whole + finest + prefixes

    def build_layer_seeds(self) -> None:
        """Every CNN's plans of its layer-genome seeds, their memory and (from step times the
        profile holds; others are timed later, alone) their seconds: kept for the seeds'
        evaluation."""
        for s in self.spaces:
            for x in self._layer_seeds(s):
                key = s.decode(x)
                s.memory(key)
                try:
                    with _profiled_only(self.cost):
                        self._cnn_seconds(s, key)
                except _Unprofiled:
                    pass

    def smallest_of_each(self, genomes: Sequence[Sequence[int]], per_cnn: int = 2) -> list[tuple[int, ...]]:
        """Per CNN, the `per_cnn` slices of `genomes` whose plans of that CNN alone need the least
        memory, in every combination (smallest first): CNNs that run one after another share
        memory, so the application's smallest plan combines small plans of each CNN, but not
        always each one's smallest (merged, a CNN's many small tile buffers may place worse than
        another's windows: app 6 of Table 6.6 needed 0.18 MB more from the smallest of each)."""
        best = []
        for s, slices in zip(self.spaces, zip(*(self.split(g) for g in genomes))):
            ranked = sorted({tuple(x) for x in slices}, key=lambda x: (s.memory(s.decode(x)), x))
            best.append(ranked[:per_cnn])
        return [tuple(int(v) for x in combo for v in x) for combo in itertools.product(*best)]

    def reuse_genes(self) -> tuple[int, ...]:
        return tuple(v for s in self.spaces for v in [0, 0, 0, 0] + [0] * len(s.groups))

    def floor(self) -> int | None:
        """The memory side's smallest memory (None before it ran)."""
        return min((self.points[k].memory_bytes for k in self.exact), default=None)

    def front(self) -> tuple[FitPoint, ...]:
        """The Pareto front of the points evaluated, less those below the memory side's smallest
        (found by time-guided search: another cost profile would not find them)."""
        floor = self.floor()
        return pareto([p for p in self.points.values() if floor is None or p.memory_bytes >= floor])


# --- the search ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Constraints:
    budget_bytes: int | None  # bounds FitPoint.memory_bytes
    min_fps: tuple[float, ...]  # per CNN (0: none)

    def met(self, p: FitPoint) -> bool:
        return ((self.budget_bytes is None or p.memory_bytes <= self.budget_bytes)
                and all(f >= need for f, need in zip(p.fps, self.min_fps)))


@dataclass(frozen=True)
class FitSearch:
    chosen: FitPoint
    front: tuple[FitPoint, ...]
    evaluated: int
    fits: bool
    early_exit: bool
    reuse: FitPoint  # the reuse-only plan (Alg. 9 line 1)


def _smallest_first(p: FitPoint) -> tuple:
    return (p.memory_bytes, sum(p.seconds), p.genes)


def meeting(front: Sequence[FitPoint], constraints: Constraints) -> list[FitPoint]:
    """The points meeting every constraint, smallest memory first (then fastest)."""
    return sorted((p for p in front if constraints.met(p)), key=_smallest_first)


def select(front: Sequence[FitPoint], constraints: Constraints) -> tuple[FitPoint, bool]:
    """Alg. 9 lines 9-16: the smallest memory among the points meeting every constraint; if none,
    the smallest memory of the front (and False)."""
    ok = meeting(front, constraints)
    return (ok[0], True) if ok else (min(front, key=_smallest_first), False)


def search(problem: FitProblem, constraints: Constraints, seed: int = 0, pop_size: int = POP_SIZE,
           generations: int = GENERATIONS, exhaustive_limit: int = EXHAUSTIVE_LIMIT,
           sources: Mapping[str, TechniqueSource] | None = None, source_budget: int | None = None,
           max_steps: int = MAX_STEPS, progress: Callable[[int, int], None] | None = None,
           deadline: Deadline | None = None, say: Callable[[str], None] = _silent) -> FitSearch:
    """Alg. 9: reuse alone if it meets the constraints (early exit); else a multi-objective
    genetic search (NSGA-II) seeded with every other planner's plans and polished by a local
    search around its front, or every genome when the
    space has at most `exhaustive_limit` of them. `sources` (default SOURCES) are asked for
    candidates with `source_budget` (run memory per CNN). The genetic search stops early once
    its plans reach `max_steps` steps in all (seeds are always evaluated), and does not run when
    a CNN is searched quickly (QUICK_LAYERS). Deterministic for a given seed. Past `deadline`
    (checked between plans: the sources, the memory side's rounds, the enumeration, the genetic
    search) the search goes on to the next phase and answers from the plans found so far
    (reuse and the seeds are always evaluated); `say` gets a line per phase (what, how far,
    best so far)."""

    report = progress or (lambda done, total: None)
    reuse = problem.evaluate_exact(problem.reuse_genes())
    say(f"fit: reuse only: {_best(problem)}")
    if constraints.met(reuse):
        report(1, 1)
        return FitSearch(reuse, (reuse,), len(problem.points), True, True, reuse)
    problem.deadline, problem.say = deadline, say
    # A space too large to enumerate even without candidates is searched from the seeds: their
    # plans are built while the sources run.
    seeded = problem.size > exhaustive_limit
    problem.add_candidates(SOURCES if sources is None else sources, source_budget,
                           problem.build_layer_seeds if seeded else lambda: None)
    size = problem.size
    if size <= exhaustive_limit:
        total = size
        problem.on_evaluate = lambda n: report(n, total)
        for genes in itertools.product(*(range(u + 1) for u in problem.upper)):
            if expired(deadline):
                say(f"fit: time is up during the enumeration of {total} plans")
                break
            (problem.evaluate_exact if problem.exact_genes(genes) else problem.evaluate)(genes)
        say(f"fit: enumerated: {_best(problem)}")
    else:
        total = pop_size * (generations + 1)
        problem.on_evaluate = lambda n: report(min(n, total), total)
        seeds = problem.seeds()
        for genes in seeds + problem.smallest_of_each(seeds):
            problem.evaluate(genes)
        # The memory side: the seeds and combinations no time chose, and a descent on memory alone.
        exact = [g for g in seeds if problem.exact_genes(g)]
        for genes in exact + problem.smallest_of_each(exact):
            problem.evaluate_exact(genes)
        say(f"fit: seeds: {_best(problem)}")
        quick = any(s.quick for s in problem.spaces)
        before = problem.planned_steps
        if not quick:
            _descend_memory(problem, deadline=deadline)
            say(f"fit: memory side: {_best(problem)}")
        # The work bound counts the seeds' and the genetic search's plans, not the descent's.
        max_steps += problem.planned_steps - before
        problem.max_steps = max_steps
        evaluate_report = problem.on_evaluate

        def on_evaluate(n: int) -> None:
            evaluate_report(n)
            if n % pop_size == 0:
                say(f"fit: genetic search: {_best(problem)}")

        problem.on_evaluate = on_evaluate
        try:
            if problem.planned_steps > max_steps or quick:
                # The seeds took the work (any new plan would stop it), or a CNN is searched quickly.
                raise _OutOfWork
            _nsga2(problem, seed, pop_size, generations)
            _polish(problem)
        except _OutOfWork:
            if expired(deadline):
                say("fit: time is up: the genetic search stops")
        problem.max_steps = math.inf
    report(total, total)
    front = problem.front()
    say(f"fit: search done: {_best(problem)}")
    chosen, fits = select(front, constraints)
    return FitSearch(chosen, front, len(problem.points), fits, False, reuse)


def _best(problem: FitProblem) -> str:
    """How far the search is and the best so far: plans evaluated, smallest memory, best fps."""
    points = list(problem.points.values())
    smallest = min(p.memory_bytes for p in points)
    fps = [max(p.fps[m] for p in points) for m in range(len(problem.spaces))]
    return (f"{len(points)} plans evaluated, smallest {smallest / 1e6:.3f} MB, best predicted fps "
            + ", ".join(f"{f:.1f}" for f in fps))


def _descend_memory(problem: FitProblem, rounds: int = MEMORY_ROUNDS, deadline: Deadline | None = None) -> None:
    """The memory side's local search: from its smallest point, every gene one step up and
    down (layer genome and exact candidates only), the move that lowers the memory most (ties:
    the smaller genome), until none does. Neighbours are planned, not timed: no time is looked
    at, and no new step shape is profiled for a plan that is not taken."""
    upper = problem.upper
    start = min((problem.points[k] for k in problem.exact), key=lambda p: (p.memory_bytes, p.genes))
    genes, best = start.genes, start.memory_bytes
    for _ in range(rounds):
        if expired(deadline):
            return
        moves = [m for m in (genes[:i] + (v,) + genes[i + 1:] for i, u in enumerate(upper)
                             for v in (genes[i] - 1, genes[i] + 1) if 0 <= v <= u) if problem.exact_genes(m)]
        step = min(moves, key=lambda m: (problem.memory(m), m), default=None)
        if step is None or problem.memory(step) >= best:
            return
        genes, best = step, problem.memory(step)
        problem.evaluate_exact(genes)


def _polish(problem: FitProblem) -> None:
    """Local search after the genetic one: every gene of every front point one step up and
    down, until the front stops changing (or the work bound stops it)."""
    upper = problem.upper
    tried: set[tuple[int, ...]] = set()
    while True:
        todo = [p.genes for p in problem.front() if p.genes not in tried]
        if not todo:
            return
        for genes in todo:
            tried.add(genes)
            for i, u in enumerate(upper):
                for v in (genes[i] - 1, genes[i] + 1):
                    if 0 <= v <= u:
                        problem.evaluate(genes[:i] + (v,) + genes[i + 1:])


class _OutOfWork(Exception):
    """The genetic search reached its work bound."""


def _nsga2(problem: FitProblem, seed: int, pop_size: int, generations: int) -> None:
    import numpy as np
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.sbx import SBX
    from pymoo.operators.mutation.pm import PM
    from pymoo.operators.repair.rounding import RoundingRepair
    from pymoo.optimize import minimize

    upper = np.array(problem.upper, dtype=float)
    n_obj = 1 + len(problem.spaces)

    class _Pymoo(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=len(upper), n_obj=n_obj, xl=np.zeros(len(upper)), xu=upper, vtype=int)

        def _evaluate(self, X, out, *args, **kwargs) -> None:
            out["F"] = np.array([problem.evaluate(np.rint(x).astype(int)).objectives() for x in X])

    rng = np.random.default_rng(seed)
    seeds = np.array(problem.seeds(), dtype=float)
    extra = rng.integers(0, upper + 1, size=(max(0, pop_size - len(seeds)), len(upper))).astype(float)
    start = np.vstack([seeds, extra])[: max(pop_size, len(seeds))]
    algorithm = NSGA2(pop_size=len(start), sampling=start, crossover=SBX(prob=0.9, eta=3, vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=3, vtype=float, repair=RoundingRepair()), eliminate_duplicates=True)
    minimize(_Pymoo(), algorithm, ("n_gen", generations + 1), seed=seed, verbose=False)


def parse_min_fps(text: str | None, n: int) -> tuple[float, ...]:
    """'' -> no minimum; 'X' -> every CNN; 'X,Y,...' -> one per CNN."""
    from tightfit.errors import OptionError

    if not text:
        return (0.0,) * n
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise OptionError(f"cannot read --min-fps {text!r}: write a number, or one per CNN separated by commas") from None
    if len(values) == 1:
        values *= n
    if len(values) != n or any(v < 0 or not math.isfinite(v) for v in values):
        raise OptionError(f"--min-fps needs one non-negative number or {n} (one per CNN), got {text!r}")
    return tuple(values)
