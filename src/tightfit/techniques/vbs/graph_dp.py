"""Variable batch size on real graphs (Choudhury et al. Sec. III): the main path with special
layers, profiles from the analyser and the cost model, the dynamic program in the plans
accounting (linear_dp.py), and plans of sample-range steps whose buffers hold what it counts.

A graph is a main path of units: a layer, or a *special layer*: a fork tensor F read by p
branches (chains of layers; an empty chain is an identity shortcut) whose last outputs meet in
one join layer J (a concat or an add). The special layer runs its b samples branch after branch,
each branch a linear network solved by the same DP with mem' = mem minus what the special layer
holds: F and J's output (reserved by the main path like any unit's input and output) and the
outputs of the branches run so far, including the current one (J reads them all at once).

Every step of a plan here covers whole samples; a tensor's buffers are its *groups*: maximal
sample ranges that no producer or consumer step straddles, each alive from its first write to
its last read (the model input arrives a sub-batch at a time, just before the first layer takes
it; the model output is one buffer of the whole request). Kernel scratch lives outside the arena,
so the DP is given the budget less the largest scratch of any step, and counts no scratch.
"""
from __future__ import annotations

import time as _time
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, itemsize, last_reads
from tightfit.ops import get_op
from tightfit.ops.registry import step_workspace
from tightfit.ops.base import Region
from tightfit.techniques.deadline import Deadline, expired
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import dense_nhwc, layout_for
from tightfit.plan.schema import Access, Buffer, Partition, Plan, Step
from tightfit.techniques.interface import run_memory
from tightfit.techniques.vbs.linear_dp import INF, LinearProfile, PivotStep, layer_base, plans_schedule, solve_plans

PAPER_UNIT_BYTES = 2 * 10**6  # the paper's memory granularity for images
# Ours by default: finer, because every buffer a table entry holds is rounded up to whole units
# (so a plan never exceeds what the DP counts), and at 2 MB that rounding alone costs several
# MB on networks whose batch-1 plans need 4-10 MB; the DP still takes about a second.
DEFAULT_UNIT_BYTES = 10**5


@dataclass(frozen=True)
class Special:
    fork: str
    branches: tuple[tuple[int, ...], ...]
    join: int



def main_path(graph: Graph) -> tuple:
    """The graph's units in order; OptionError for a graph that is not a main path with
    branches between two of its points (e.g. a branch inside a branch), or of several inputs."""
    if len(graph.inputs) != 1:  # its DP follows one path from the one input
        raise OptionError(f"{graph.name}: variable batch plans take a model of one input; this one has "
                          f"{len(graph.inputs)} ({', '.join(graph.inputs)})")
    consumers: dict[str, list[int]] = {}
    for layer in graph.layers:
        for t in dict.fromkeys(layer.inputs):
            consumers.setdefault(t, []).append(layer.id)
    units: list = []
    cur = graph.inputs[0]
    done = 0
    while done < len(graph.layers):
        cons = consumers.get(cur, [])
        if len(cons) == 1 and graph.layers[cons[0]].inputs == (cur,):
            units.append(cons[0])
            cur = graph.layers[cons[0]].output
            done += 1
            continue
        special = _special(graph, cur, cons, consumers)
        if special is None or not units:
            raise OptionError(f"{graph.name}: variable batch plans need a main path whose branches run between two of "
                              f"its points (tensor {cur!r} is not such a fork)")
        units.append(special)
        cur = graph.layers[special.join].output
        done += sum(len(b) for b in special.branches) + 1
    if cur not in graph.outputs or len(graph.outputs) != 1:
        raise OptionError(f"{graph.name}: variable batch plans need one model output at the end of the main path")
    return tuple(units)


def _special(graph: Graph, fork: str, cons: list[int], consumers: dict[str, list[int]]) -> Special | None:
    joins, branches = set(), []
    for c in cons:
        chain = []
        lid = c
        while len(graph.layers[lid].inputs) == 1:
            chain.append(lid)
            nxt = consumers.get(graph.layers[lid].output, [])
            if len(nxt) != 1:
                return None
            lid = nxt[0]
        joins.add(lid)
        branches.append(tuple(chain))
    if len(joins) != 1:
        return None
    join = joins.pop()
    ends = {graph.layers[b[-1]].output if b else fork for b in branches}
    if ends != set(graph.layers[join].inputs) or len(ends) != len(branches):
        return None
    return Special(fork, tuple(branches), join)


def unit_layers(unit) -> list[int]:
    if isinstance(unit, Special):
        return [lid for b in unit.branches for lid in b] + [unit.join]
    return [unit]


# --- profiles ---------------------------------------------------------------------------------

def profile_seconds(model: PlannedModel, cost, max_batch: int, layout: str = "nhwc", dtype: str = "fp32") -> dict[int, list[float]]:
    """time(i, b) as seconds of one step of layer i on b whole samples (index b; 0 unused),
    predicted by `cost` (a Predictor over a frozen profile, or the runtime's CostModel): the
    step bound as in a plan of this request, on buffers of b samples, plus the executor's loop
    overhead; the first layer also loads its input chunk."""
    g = model.graph
    out: dict[int, list[float]] = {}
    for layer in g.layers:
        out[layer.id] = [INF] + [_step_seconds(model, cost, layer.id, b, layout, dtype) for b in range(1, max_batch + 1)]
    return out


def _step_seconds(model: PlannedModel, cost, lid: int, b: int, layout: str, dtype: str) -> float:
    g = model.graph
    layer = g.layers[lid]
    tensors = list(dict.fromkeys(layer.inputs)) + [layer.output]
    buffers = tuple(Buffer(k, "samples", (b,) + g.shape(t)[1:], layout_for((b,) + g.shape(t)[1:], layout), (0,), g.tensors[t].item_bytes(dtype))
                    for k, t in enumerate(tensors))
    where = {t: k for k, t in enumerate(tensors)}
    steps = [_compute(g, model.batch, lid, 0, b, {t: (where[t], 0) for t in tensors}, layout, dtype)]
    if g.inputs[0] in layer.inputs:
        steps.append(_input_step(g, 0, b, where[g.inputs[0]], 0))
    draft = Plan((model.ref(),), dtype, buffers, (Partition(0, 0, (lid,), tuple(steps)),), (), 0, {})
    return sum(cost.step_seconds(draft, [g], s) + cost.loop_seconds for s in steps)


def _units(nbytes: int, unit_bytes: int) -> int:
    return -(-int(nbytes) // unit_bytes)


@dataclass(frozen=True)
class Problem:
    """What the DP needs of a model: units, per-layer seconds, and sizes (bytes per sample)."""

    model: PlannedModel
    units: tuple
    seconds: dict[int, list[float]]
    dtype: str = "fp32"

    @property
    def graph(self) -> Graph:
        return self.model.graph

    @property
    def request(self) -> int:
        return self.model.batch

    def bytes_of(self, tensor: str, b: int) -> int:
        return self.graph.tensors[tensor].nbytes(self.dtype, b)

    def in_tensor(self, unit) -> str:
        return unit.fork if isinstance(unit, Special) else self.graph.layers[unit].inputs[0]

    def out_tensor(self, unit) -> str:
        return self.graph.layers[unit.join if isinstance(unit, Special) else unit].output

    def scratch_bytes(self) -> int:
        """The largest kernel scratch of any step of any batch up to the request."""
        from tightfit.analysis.memory import layer_workspace

        return max((layer_workspace(self.graph, l.id, self.dtype, batch=self.request) for l in self.graph.layers), default=0)

    def chain_profile(self, layers: Sequence, unit_bytes: int) -> LinearProfile:
        n, big_b = len(layers), self.request
        shape = (n, big_b + 1)
        time, inp, out = np.full(shape, INF), np.zeros(shape, int), np.zeros(shape, int)
        for k, u in enumerate(layers):
            for b in range(1, big_b + 1):
                inp[k, b] = _units(self.bytes_of(self.in_tensor(u), b), unit_bytes)
                out[k, b] = _units(self.bytes_of(self.out_tensor(u), b), unit_bytes)
                if not isinstance(u, Special):
                    time[k, b] = self.seconds[u][b] / b
        return LinearProfile(time, inp, out, np.zeros(shape, int))


@dataclass(frozen=True)
class Solved:
    """The DP's tables for the main path and every branch, at one granularity."""

    problem: Problem
    unit_bytes: int
    memory: int  # units
    main: object  # PlanTables
    branches: dict  # (unit index, branch index) -> PlanTables
    held: dict  # (unit index, branch index) -> (B + 1,) units held while that branch runs

    def per_sample(self, memory: int) -> float:
        """Least seconds per sample for the request within `memory` units (the output held)."""
        m = memory - self._output_units()
        return self.main.opt_at(0, self.main.profile.layers - 1, self.problem.request, m)

    def _output_units(self) -> int:
        p = self.main.profile
        return int(p.out[p.layers - 1, self.problem.request])

    def schedule(self, memory: int) -> list[tuple[int, int]]:
        """(layer id, batch) steps in order; [] if nothing fits."""
        units = self.problem.units
        steps = plans_schedule(self.main, self.problem.request, memory - self._output_units())
        out: list[tuple[int, int]] = []
        for s in steps:
            self._expand(units[s.unit], s, out)
        return out

    def _expand(self, unit, s: PivotStep, out: list) -> None:
        if not isinstance(unit, Special):
            out.append((unit, s.batch))
            return
        for a, chain in enumerate(unit.branches):
            if not chain:
                continue
            t = self.branches[(s.unit, a)]
            m = s.memory - int(self.held[(s.unit, a)][s.batch])
            out.extend((chain[x.unit], x.batch) for x in plans_schedule(t, s.batch, m))
        out.append((unit.join, s.batch))


def solve_problem(problem: Problem, memory: int, unit_bytes: int, latency: float | None = None) -> Solved:
    """Branch tables first (each branch a linear network whose input and output the special
    layer holds), then the main path with the special layers' pivot steps as their base."""
    units = problem.units
    main_profile = problem.chain_profile(units, unit_bytes)
    base = layer_base(main_profile, memory)
    base_out = np.stack([np.stack([_shift(base[k, b], int(main_profile.out[k, b])) for b in range(problem.request + 1)])
                         for k in range(len(units))])
    branches, held = {}, {}
    for k, unit in enumerate(units):
        if not isinstance(unit, Special):
            continue
        base[k], base_out[k] = _special_base(problem, k, unit, memory, unit_bytes, latency, branches, held,
                                             main_profile.out[k])
    main = solve_plans(main_profile, memory, base, latency, base_out)
    return Solved(problem, unit_bytes, memory, main, branches, held)


def _special_base(problem: Problem, k: int, unit: Special, memory: int, unit_bytes: int, latency, branches, held,
                  out_units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The special layer's step at b for every memory m left around its fork: its branches one
    after another, then its join; with the join's output held by the caller, or by the step
    (allocated when the join runs)."""
    big_b = problem.request
    g = problem.graph
    total = np.zeros((big_b + 1, memory + 1))
    total[0] = INF
    outs = [np.array([0] + [problem.bytes_of(g.layers[c[-1]].output, b) for b in range(1, big_b + 1)]) if c else None
            for c in unit.branches]
    cum = np.zeros(big_b + 1, dtype=np.int64)
    for a, chain in enumerate(unit.branches):
        if not chain:
            continue
        cum = cum + outs[a]
        held[(k, a)] = np.array([_units(x, unit_bytes) for x in cum])
        prof = problem.chain_profile(chain, unit_bytes)
        t = solve_plans(prof, memory, layer_base(prof, memory, first_input=False), latency)
        branches[(k, a)] = t
        for b in range(1, big_b + 1):
            row = t.opt[0, len(chain) - 1, b]
            total[b] += _shift(row, int(held[(k, a)][b]))
    join_seconds = problem.seconds[unit.join]
    with_out = total.copy()
    for b in range(1, big_b + 1):
        need = _units(int(cum[b]), unit_bytes)  # J reads every branch output at once
        total[b, :need] = INF
        with_out[b, :need + int(out_units[b])] = INF
        total[b] += join_seconds[b] / b
        with_out[b] += join_seconds[b] / b
    return total, with_out


def _shift(row: np.ndarray, units: int) -> np.ndarray:
    out = np.full_like(row, INF)
    if units < len(row):
        out[units:] = row[: len(row) - units]
    return out


# --- plans ------------------------------------------------------------------------------------

def _input_step(g: Graph, n0: int, n1: int, buffer: int, base: int) -> Step:
    t = g.inputs[0]
    region = Region.whole((n1 - n0,) + g.shape(t)[1:]).with_samples(n0, n1)
    return Step("input", 0, -1, Access(t, buffer, region, (n0 - base, 0, 0)))


def _compute(g: Graph, request: int, lid: int, n0: int, n1: int, place: dict, layout: str, dtype: str) -> Step:
    """Layer `lid` on samples [n0, n1); place[tensor] = (buffer, first sample it holds)."""
    layer = g.layers[lid]
    op = get_op(layer.op)
    out_shape = (request,) + g.shape(layer.output)[1:]
    region = Region.whole(out_shape).with_samples(n0, n1)
    in_shapes = [(request,) + g.shape(t)[1:] for t in layer.inputs]
    wins = op.input_windows(layer, region, in_shapes)
    ins = tuple(Access(t, place[t][0], w.region, (w.region.n0 - place[t][1], w.region.h0, w.region.w0))
                for t, w in zip(layer.inputs, wins))
    ob, obase = place[layer.output]
    scratch = step_workspace(layer, region, in_shapes, out_shape, itemsize(dtype), "none", dense_nhwc(out_shape, layout), layout == "nhwc")
    return Step("compute", 0, lid, Access(layer.output, ob, region, (n0 - obase, 0, 0)), ins, scratch)


def _groups(intervals: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Maximal sample ranges that no interval straddles."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def plan_schedule(model: PlannedModel, steps: Sequence[tuple[int, int]], planner: str = "improve",
                  layout: str = "nhwc", dtype: str = "fp32", knobs: dict | None = None) -> Plan:
    """A plan running (layer id, batch) steps over the request: each layer takes its samples in
    order; each tensor's groups become buffers (see the module docstring)."""
    from tightfit.plan.place import place

    g, request = model.graph, model.batch
    counter = {l.id: 0 for l in g.layers}
    ranged = []
    for lid, b in steps:
        ranged.append((lid, counter[lid], counter[lid] + b))
        counter[lid] += b
    if any(c != request for c in counter.values()):
        raise OptionError(f"a variable batch schedule must run every layer on all {request} samples")
    spans: dict[str, list[tuple[int, int]]] = {t: [] for t in g.tensors}
    for lid, n0, n1 in ranged:
        layer = g.layers[lid]
        for t in set(layer.inputs) | {layer.output}:
            spans[t].append((n0, n1))
    for t in g.outputs:
        spans[t].append((0, request))
    buffers: list[Buffer] = []
    group_of: dict[str, list[tuple[int, int, int]]] = {}
    for t in [g.inputs[0]] + [l.output for l in g.layers]:
        group_of[t] = []
        for a, b in _groups(spans[t]):
            shape = (b - a,) + g.shape(t)[1:]
            group_of[t].append((a, b, len(buffers)))
            buffers.append(Buffer(len(buffers), "whole" if b - a == request else "samples", shape,
                                  layout_for(shape, layout), (0,), g.tensors[t].item_bytes(dtype)))

    def where(t: str, n0: int) -> tuple[int, int]:
        return next((buf, a) for a, b, buf in group_of[t] if a <= n0 < b)

    plan_steps = []
    for lid, n0, n1 in ranged:
        layer = g.layers[lid]
        place_at = {t: where(t, n0) for t in set(layer.inputs) | {layer.output}}
        if g.inputs[0] in layer.inputs:
            buf, base = place_at[g.inputs[0]]
            plan_steps.append(_input_step(g, n0, n1, buf, base))
        plan_steps.append(_compute(g, request, lid, n0, n1, place_at, layout, dtype))
    all_knobs = {"method": "vbs", "planner": planner, "layout": layout, "profile": [[lid, b] for lid, b in steps]}
    all_knobs.update(knobs or {})
    draft = Plan((model.ref(),), dtype, tuple(buffers), (Partition(0, 0, tuple(range(len(g.layers))), tuple(plan_steps)),),
                 (), 0, all_knobs)
    return place(draft, [g], planner)


def per_layer_profile(steps: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """Layer id -> its sub-batches in order (the paper's Fig. 9)."""
    out: dict[int, list[int]] = {}
    for lid, b in steps:
        out.setdefault(lid, []).append(b)
    return out


def predicted_seconds(problem: Problem, steps: Sequence[tuple[int, int]]) -> float:
    """Seconds per sample of a schedule by the profile: the sum of its steps' times."""
    return sum(problem.seconds[lid][b] for lid, b in steps) / problem.request


# --- baselines --------------------------------------------------------------------------------

def fbs_steps(problem: Problem, batch: int) -> list[tuple[int, int]]:
    """Chunks of `batch` samples (the last shorter), each through every layer in order."""
    r = problem.request
    chunks = [batch] * (r // batch) + ([r % batch] if r % batch else [])
    order = [lid for u in problem.units for lid in unit_layers(u)]
    return [(lid, c) for c in chunks for lid in order]


def greedy_steps(problem: Problem, batches: dict[int, int]) -> list[tuple[int, int]]:
    """Layer after layer over the whole request, each in chunks of its own batch."""
    r = problem.request
    out = []
    for u in problem.units:
        for lid in unit_layers(u):
            b = batches[lid]
            out.extend((lid, c) for c in [b] * (r // b) + ([r % b] if r % b else []))
    return out


def greedy_batches(problem: Problem, budget: int) -> dict[int, int] | None:
    """Greedy-VBS (the paper's second baseline): each layer takes the largest batch that fits
    while the tensors live at it hold all the request's samples (its input and output, and in a
    special layer the fork and the branch outputs made so far). None if some layer cannot run."""
    g, r = problem.graph, problem.request
    order = [lid for u in problem.units for lid in unit_layers(u)]
    last = last_reads(g, order)
    from tightfit.analysis.memory import layer_workspace

    live = {g.inputs[0]}
    out = {}
    for pos, lid in enumerate(order):
        live.add(g.layers[lid].output)
        held = sum(problem.bytes_of(t, r) for t in live)
        fits = [b for b in range(1, r + 1) if held + layer_workspace(g, lid, problem.dtype, batch=b) <= budget]
        if not fits:
            return None
        out[lid] = max(fits)
        live = {t for t in live if last.get(t, len(order)) > pos or t in g.outputs}
    return out


# --- the search -------------------------------------------------------------------------------

@dataclass(frozen=True)
class VbsResult:
    """search_vbs's answer: the plan (None if nothing fits), its schedule, the seconds per
    sample the profile predicts, and the memory levels tried."""

    plan: Plan | None
    steps: tuple[tuple[int, int], ...]
    seconds_per_sample: float
    fits: bool
    budget_bytes: int
    dp_memory_bytes: int
    run_bytes: int
    solve_seconds: float
    lookup: tuple = field(default=())  # (memory bytes, seconds per sample, profile) per level
    timed_out: bool = False  # the deadline passed: the best plan found by then


def make_problem(model: PlannedModel, cost, layout: str = "nhwc", dtype: str = "fp32", smooth: bool = True,
                 batch_factors: Sequence[float] | None = None) -> Problem:
    """The DP's problem for a model and request, timed by `cost` (see `smoothed`); every step
    of b samples scaled by `batch_factors[b]` if given (see tightfit/vbs_calibration.calibrate)."""
    seconds = profile_seconds(model, cost, model.batch, layout, dtype)
    seconds = smoothed(seconds) if smooth else seconds
    if batch_factors is not None:
        seconds = {lid: [t * f for t, f in zip(row, batch_factors)] for lid, row in seconds.items()}
    return Problem(model, main_path(model.graph), seconds, dtype)


def smoothed(seconds: dict[int, list[float]]) -> dict[int, list[float]]:
    """Each layer's step time as a fixed part plus a part per sample, fitted (least squares) to
    its medians at b = 1..B. On this shared machine neighbouring batches' medians differ by
    10-30% at random; a DP given the raw medians picks those dips in every layer and predicts
    gains that no run shows (googlenet: 38% predicted, 0% measured). The fit keeps what
    batching really changes, the fixed cost spread over more samples."""
    out = {}
    for lid, row in seconds.items():
        b = np.arange(1, len(row), dtype=float)
        t = np.asarray(row[1:], dtype=float)
        fixed, per = np.linalg.lstsq(np.stack([np.ones_like(b), b], 1), t, rcond=None)[0]
        if fixed < 0 or per < 0:  # keep both parts non-negative
            fixed, per = (0.0, float(np.sum(t * b) / np.sum(b * b))) if fixed < 0 else (float(np.mean(t)), 0.0)
        out[lid] = [INF] + [float(fixed + per * x) for x in b]
    return out


@dataclass(frozen=True)
class VbsSettings:
    """The DP's settings: memory granularity `unit_bytes`, the `latency` bound of every pivot's
    samples (None: none), whether to build the `lookup` table of profiles per memory level, and
    the `margin` and `fbs_margin` a schedule must win by (see search_vbs)."""

    unit_bytes: int = DEFAULT_UNIT_BYTES
    latency: float | None = None
    lookup: bool = True
    margin: float = 0.0
    fbs_margin: float = 0.0


def search_vbs(model: PlannedModel, budget_bytes: int, cost, settings: VbsSettings = VbsSettings(),
               planner: str = "improve", layout: str = "nhwc", problem: Problem | None = None,
               deadline: Deadline | None = None) -> VbsResult:
    """The fastest variable-batch plan for the request (model.batch samples) whose analysed run
    memory (arena + largest scratch) fits `budget_bytes`, by the DP at `settings.unit_bytes`
    granularity. The DP gets the budget less the largest scratch; the placed plan
    is checked against the budget, and in the rare case the offset planner leaves a gap that
    breaks it, the DP is asked again with one unit less.

    The DP's accounting never undercounts, but it overcounts a little (a split part reserves
    its pivot's buffer from its start, the model output is held from the beginning, sizes are
    rounded up to units), so near a uniform batch's exact need it may miss that schedule. The
    uniform schedules are schedules of the same space, so the search also takes the fastest
    uniform one whose plan fits (knob "source": "dp" or "uniform"). With a `margin`, the DP's
    schedule is kept only if it is predicted faster than that by this fraction (the error of
    the predictions for mixed schedules: a uniform one's time can be calibrated exactly). With an
    `fbs_margin`, any schedule is kept only if predicted faster than FBS's (the largest uniform
    batch that fits) by that fraction, the error of calibrated predictions: a smaller gain is
    not one the prediction can promise, and FBS's schedule is returned instead.

    Past `deadline` (checked between plans: the DP's one solve is not cut) no more memory
    levels, lookup rows or uniform batches are planned, and the best plan found so far is
    returned (`timed_out`)."""
    unit_bytes, latency, margin = settings.unit_bytes, settings.latency, settings.margin
    problem = problem or make_problem(model, cost, layout)
    scratch = problem.scratch_bytes()
    memory = max((budget_bytes - scratch) // unit_bytes, 0)
    t0 = _time.perf_counter()
    solved = solve_problem(problem, memory, unit_bytes, latency)
    solve_seconds = _time.perf_counter() - t0
    table = _lookup(problem, solved, memory) if settings.lookup and not expired(deadline) else ()
    knobs = {"budget": budget_bytes, "unit_bytes": unit_bytes, "cost_profile": cost.id if cost is not None else "",
             "request": problem.request, "lookup": [list(x) for x in table]}
    if latency is not None:
        knobs["latency"] = latency
    found = None
    for m in range(memory, -1, -1):
        if solved.per_sample(m) == INF or expired(deadline):
            break
        steps = solved.schedule(m)
        plan = plan_schedule(problem.model, steps, planner, layout, problem.dtype,
                             dict(knobs, source="dp", dp_memory_bytes=m * unit_bytes,
                                  predicted_seconds_per_sample=predicted_seconds(problem, steps)))
        if run_memory(plan) <= budget_bytes:
            found = (plan, steps, m * unit_bytes)
            break
    best = predicted_seconds(problem, found[1]) if found else INF
    timed_out = expired(deadline)
    uniform = _fastest_uniform(problem, budget_bytes, latency, best / (1 - margin), planner, layout, knobs,
                               None if found is None else deadline)
    if uniform is not None:
        found = uniform + (0,)
    if found is not None and settings.fbs_margin > 0 and latency is None:  # FBS knows no latency bound
        fbs_plan, fbs_steps_, fbs_seconds, fbs_batch = baseline(problem, budget_bytes, "fbs", planner, layout)
        if fbs_plan is not None and predicted_seconds(problem, found[1]) > fbs_seconds * (1 - settings.fbs_margin):
            plan = plan_schedule(problem.model, fbs_steps_, planner, layout, problem.dtype,
                                 dict(knobs, source="uniform", batch=fbs_batch, predicted_seconds_per_sample=fbs_seconds))
            found = (plan, fbs_steps_, 0)
    if found is None:
        return VbsResult(None, (), INF, False, budget_bytes, 0, 0, solve_seconds, table, timed_out)
    plan, steps, dp_bytes = found
    return VbsResult(plan, tuple(steps), predicted_seconds(problem, steps), True, budget_bytes, dp_bytes,
                     run_memory(plan), solve_seconds, table, timed_out)


def _fastest_uniform(problem: Problem, budget: int, latency: float | None, faster_than: float, planner: str,
                     layout: str, knobs: dict, deadline: Deadline | None = None):
    """(plan, steps) of the fastest uniform batch predicted faster than `faster_than` whose plan
    fits (and each chunk within the latency bound); None if there is none or `deadline` passed
    before one was found."""
    candidates = []
    for b in range(1, problem.request + 1):
        steps = fbs_steps(problem, b)
        chunk = sum(problem.seconds[lid][c] for lid, c in steps[: len(steps) // -(-problem.request // b)])
        if latency is None or chunk <= latency:
            candidates.append((predicted_seconds(problem, steps), b, steps))
    for seconds, b, steps in sorted(candidates):
        if seconds >= faster_than or expired(deadline):
            return None
        plan = plan_schedule(problem.model, steps, planner, layout, problem.dtype,
                             dict(knobs, source="uniform", batch=b, predicted_seconds_per_sample=seconds))
        if run_memory(plan) <= budget:
            return plan, steps
    return None


def _lookup(problem: Problem, solved: Solved, memory: int) -> tuple:
    """The paper's lookup table: per memory level that changes the answer, the optimal
    per-layer profile ({layer id: sub-batches}) and its seconds per sample."""
    out, last = [], None
    for m in range(memory + 1):
        t = solved.per_sample(m)
        if t == INF or t == last:
            continue
        last = t
        prof = per_layer_profile(solved.schedule(m))
        out.append((m * solved.unit_bytes + problem.scratch_bytes(), t, {str(k): v for k, v in prof.items()}))
    return tuple(out)


def memory_problem(model: PlannedModel, dtype: str = "fp32") -> Problem:
    """The DP's problem with every step taking one second: enough to decide what fits."""
    return Problem(model, main_path(model.graph), {l.id: [INF] + [1.0] * model.batch for l in model.graph.layers}, dtype)


def smallest_feasible_budget(model: PlannedModel, request: int | None = None, cost=None,
                             unit_bytes: int = DEFAULT_UNIT_BYTES, layout: str = "nhwc",
                             problem: Problem | None = None, planner: str = "improve") -> int:
    """The least budget (bytes) at which search_vbs finds a plan (without a latency bound): the
    DP's least, or the plan of batch 1 everywhere if that needs less. Memory alone decides it,
    so no cost model is needed (`cost` is accepted for symmetry with search_vbs)."""
    if request is not None and request != model.batch:
        model = replace(model, batch=request)
    problem = problem or memory_problem(model)
    scratch = problem.scratch_bytes()
    one = plan_schedule(problem.model, fbs_steps(problem, 1), planner, layout, problem.dtype)
    hi = 2 * _units(run_memory(one), unit_bytes) + 4 * len(problem.units)
    while True:
        solved = solve_problem(problem, hi, unit_bytes)
        feasible = [m for m in range(hi + 1) if solved.per_sample(m) < INF]
        if feasible:
            break
        hi *= 2
    for m in range(feasible[0], hi + 1):
        plan = plan_schedule(problem.model, solved.schedule(m), planner, layout, problem.dtype)
        if run_memory(plan) <= m * unit_bytes + scratch:
            return min(m * unit_bytes + scratch, run_memory(one))  # batch 1 everywhere: a uniform schedule
    raise AssertionError("a DP schedule whose plan exceeds the DP's memory at every level")  # offsets leave gaps


def baseline(problem: Problem, budget_bytes: int, method: str, planner: str = "improve", layout: str = "nhwc"):
    """(plan, steps, predicted seconds per sample, batch(es)) of FBS (the largest uniform batch
    whose plan fits) or Greedy-VBS; (None, [], inf, None) if it cannot run within the budget."""
    if method == "fbs":
        for b in range(problem.request, 0, -1):
            steps = fbs_steps(problem, b)
            plan = plan_schedule(problem.model, steps, planner, layout, problem.dtype, {"baseline": "fbs", "batch": b})
            if run_memory(plan) <= budget_bytes:
                return plan, steps, predicted_seconds(problem, steps), b
        return None, [], INF, None
    batches = greedy_batches(problem, budget_bytes)
    if batches is None:
        return None, [], INF, None
    steps = greedy_steps(problem, batches)
    plan = plan_schedule(problem.model, steps, planner, layout, problem.dtype, {"baseline": "greedy"})
    if run_memory(plan) > budget_bytes:
        return None, [], INF, None
    return plan, steps, predicted_seconds(problem, steps), batches
