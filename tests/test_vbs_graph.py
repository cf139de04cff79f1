"""Variable batch size on graphs: the DP in the plans accounting against a brute-force oracle on
tiny random networks (linear and branched), executed plans on a branched zoo model, CLI errors.

The oracle enumerates every schedule of the DP's space (a pivot per segment; the parts before
and after it run uniformly or split into sub-batches; a special layer's branches one after
another), walks each one holding the buffers a plan holds (an event simulation, not the DP's
recurrences), builds its plan and asks the analyser (check_plan) and the cost model's numbers.
"""
from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
import pytest
from onnx import helper

import tightfit
from onnx_chains import conv, model_of
from tightfit.frontend.onnx_import import import_model
from tightfit.graph.ir import Graph
from tightfit.plan.check import check_plan
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.vbs.linear_dp import INF
from tightfit.techniques.vbs.graph_dp import (Problem, Special, VbsSettings, fbs_steps, main_path, plan_schedule, profile_seconds,
                                     run_memory, search_vbs, smallest_feasible_budget, solve_problem, baseline)


class TableCost:
    """A cost model whose step times are a seeded table over (step kind, layer, samples): the
    profile and the plans' own steps read the same numbers, as with CostModel's disk cache."""

    id = "table"
    loop_seconds = 0.0

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.table: dict = {}

    def step_seconds(self, plan, graphs, step) -> float:
        key = (step.kind, step.layer, step.out.region.n)
        if key not in self.table:
            n = step.out.region.n
            # per-sample time falls with the batch, by a random amount per layer
            self.table[key] = n * self.rng.uniform(1.0, 3.0) * (0.55 + 0.45 / n) * (0.2 if step.kind == "input" else 1.0)
        return self.table[key]

    def save(self) -> None:
        pass


def tiny_net(rng: random.Random, branched: bool) -> Graph:
    """A stem conv, then a conv, a pool and a head (a chain), or two branches joined by an
    identity shortcut (Add) where their channels agree, else by a Concat, then the head."""
    c = [rng.randint(2, 6) for _ in range(6)]
    b2_out = c[0] if rng.random() < 0.5 else c[3]
    add = branched and b2_out == c[0]
    weights = np.random.default_rng(rng.randrange(2**32))
    nodes, inits = [], []

    def layer(name: str, x: str, cin: int, cout: int, k: int, relu: bool = True) -> str:
        node, w, _ = conv(weights, name, x, cin, [1, cin, 8, 8], cout, k, k // 2)
        nodes.append(node)
        inits.extend(w)
        if relu:
            nodes.append(helper.make_node("Relu", [f"t{name}"], [f"r{name}"]))
        return f"r{name}" if relu else f"t{name}"

    x = layer("stem", "x", 3, c[0], 3)
    if not branched:
        nodes.append(helper.make_node("MaxPool", [layer("a", x, c[0], c[1], 1)], ["pool"], kernel_shape=[2, 2], strides=[2, 2]))
        y, cy, hw = "pool", c[1], 4
    else:
        y = layer("b2", layer("b1", x, c[0], c[2], 1), c[2], b2_out, 3)
        if add:  # identity shortcut
            nodes.append(helper.make_node("Add", [x, y], ["join"]))
            cy = c[0]
        else:
            nodes.append(helper.make_node("Concat", [layer("a", x, c[0], c[1], 1), y], ["join"], axis=1))
            cy = c[1] + b2_out
        y, hw = "join", 8
    out = layer("head", y, cy, c[4], 1, relu=False)
    return import_model(model_of(nodes, inits, (1, 3, 8, 8), out, (1, c[4], hw, hw)), None, "tiny")


# --- the oracle: every schedule of the DP's space, walked holding what plans hold -------------

def _memo(gen):
    cache: dict = {}

    def run(*args):
        if args not in cache:
            cache[args] = tuple(gen(*args))
        return cache[args]

    return run


class Walk:
    """Events of one schedule: ('alloc', units) / ('free', units) / ('step', layer id, batch)."""

    def __init__(self, problem: Problem, unit_bytes: int):
        self.p, self.u = problem, unit_bytes
        self.units = problem.units
        for name in ("opt", "exact", "unit_step"):  # each sub-problem's schedules, enumerated once
            setattr(self, name, _memo(getattr(self, name)))

    def size(self, tensor: str, b: int) -> int:
        return -(-self.p.bytes_of(tensor, b) // self.u)

    def opt(self, chain, i, j, b):
        """Sub-batches b1, b2, ... through units i..j, each exactly (one unit takes all of it)."""
        if b == 0:
            yield ()
            return
        for b1 in range(1, b + 1):
            for first in self.exact(chain, i, j, b1):
                for rest in self.opt(chain, i, j, b - b1):
                    yield first + rest

    def exact(self, chain, i, j, b):
        for k in range(i, j + 1):
            pin = self.size(self.p.in_tensor(chain[k]), b)
            pout = self.size(self.p.out_tensor(chain[k]), b)
            befores = [()] if k == i else [self.uniform(chain, i, k - 1, b, after_pivot=False)] + [
                (("alloc", pin),) + t for t in self.opt(chain, i, k - 1, b)]
            afters = [()] if k == j else [self.uniform(chain, k + 1, j, b, after_pivot=True)] + [
                t + (("free", pout),) for t in self.opt(chain, k + 1, j, b)]
            for pivot in self.unit_step(chain[k], b, k < j):
                for before in befores:
                    for after in afters:
                        yield before + pivot + ((("free", pin),) if k > i else ()) + after

    def uniform(self, chain, i, j, b, after_pivot):
        """Units i..j once each at b; an output lives from its step to the next unit's step.
        Before a pivot, the last output stays for it; after a pivot, the first unit frees the
        pivot's output and the last one writes into the caller's buffer."""
        events = ()
        for u in range(i, j + 1):
            events += next(iter(self.unit_step(chain[u], b, u < j or not after_pivot)))
            if u > i or after_pivot:
                events += (("free", self.size(self.p.in_tensor(chain[u]), b)),)
        return events

    def unit_step(self, unit, b, alloc_out):
        """The steps of one unit at b: a layer (the first one loads its input chunk), or a special
        layer's branches (each any schedule of its chain) and its join."""
        out = (("alloc", self.size(self.p.out_tensor(unit), b)),) if alloc_out else ()
        if not isinstance(unit, Special):
            chunk = self.size(self.p.graph.inputs[0], b) if unit == self.units[0] else 0
            yield (("alloc", chunk),) + out + (("step", unit, b), ("free", chunk))
            return
        yield from self._branches(unit, 0, b, 0, out)

    def _branches(self, unit, a, b, held, out):
        if a == len(unit.branches):
            yield out + (("step", unit.join, b), ("free", held))
            return
        chain = unit.branches[a]
        if not chain:
            yield from self._branches(unit, a + 1, b, held, out)
            return
        cum = sum(self.p.bytes_of(self.p.graph.layers[c[-1]].output, b) for c in unit.branches[: a + 1] if c)
        grow = -(-cum // self.u) - held
        for inner in self.opt(chain, 0, len(chain) - 1, b):
            for rest in self._branches(unit, a + 1, b, held + grow, out):
                yield (("alloc", grow),) + inner + rest

    def schedules(self):
        """(layer-id steps, peak units) of every schedule of the request."""
        top = self.size(self.p.out_tensor(self.units[-1]), self.p.request)
        for events in self.opt(self.units, 0, len(self.units) - 1, self.p.request):
            held, peak, steps = top, top, []
            for e in events:
                if e[0] == "alloc":
                    held += e[1]
                elif e[0] == "free":
                    held -= e[1]
                else:
                    steps.append((e[1], e[2]))
                    peak = max(peak, held)
            yield tuple(steps), peak


def _oracle_case(seed: int, branched: bool):
    rng = random.Random(seed)
    g = tiny_net(rng, branched)
    request = 3 if seed == 0 else 2  # three samples multiply the schedules by ~20
    model = PlannedModel(g, "tiny", request)
    cost = TableCost(seed)
    problem = Problem(model, main_path(g), profile_seconds(model, cost, request))
    return g, model, cost, problem


@pytest.mark.parametrize("branched", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_dp_agrees_with_every_schedule_scored_by_analyser_and_cost_model(seed, branched):
    g, model, cost, problem = _oracle_case(seed, branched)
    assert any(isinstance(u, Special) for u in problem.units) == branched
    unit = 256
    scored: dict = {}
    for steps, peak in Walk(problem, unit).schedules():
        scored[steps] = min(peak, scored.get(steps, peak))
    plans = {}
    for steps, peak in scored.items():
        plan = plan_schedule(model, steps)
        report = check_plan(plan, [g])
        # the analyser: the plan never holds more than the walk counted
        assert report.lower_bound <= peak * unit
        seconds = sum(cost.step_seconds(plan, [g], s) + cost.loop_seconds for s in plan.steps()) / problem.request
        plans[steps] = (peak, seconds, report)
    peaks = sorted({p for p, _, _ in plans.values()})
    scratch = problem.scratch_bytes()
    for memory in sorted({peaks[0] - 1, peaks[0], peaks[len(peaks) // 2], peaks[-1]}):
        best = min((s for p, s, _ in plans.values() if p <= memory), default=INF)
        solved = solve_problem(problem, memory, unit)
        assert solved.per_sample(memory) == pytest.approx(best)
        budget = memory * unit + scratch
        found = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=unit, lookup=False), problem=problem)
        if best == INF:
            assert not found.fits or found.plan.knobs["source"] == "uniform"
            continue
        # the search also takes a uniform schedule the DP's rounding and reservations missed
        assert found.fits and found.seconds_per_sample <= best + 1e-12
        if found.plan.knobs["source"] == "dp":
            assert found.seconds_per_sample == pytest.approx(best) and plans[found.steps][1] == pytest.approx(best)
        assert check_plan(found.plan, [g]).peak_bytes <= budget  # the plan's analysed run memory
    least = smallest_feasible_budget(model, None, None, unit, problem=problem)
    assert least == min(peaks[0] * unit + scratch, run_memory(plan_schedule(model, fbs_steps(problem, 1))))


def test_fbs_is_in_the_space_and_counted_exactly():
    """Uniform runs are counted as plans hold them: FBS at batch b fits the DP at its plan's own
    peak, plus the model output (held for the whole request from the start) and rounding."""
    g, model, cost, problem = _oracle_case(3, True)
    unit = 64
    output = problem.bytes_of(g.outputs[0], problem.request)
    for b in (1, problem.request):
        steps = fbs_steps(problem, b)
        report = check_plan(plan_schedule(model, steps), [g])
        budget = report.peak_bytes + output + 2 * unit * len(g.layers) + problem.scratch_bytes()
        found = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=unit, lookup=False), problem=problem)
        assert found.fits and found.seconds_per_sample <= sum(problem.seconds[l][c] for l, c in steps) / problem.request + 1e-12


def test_fbs_margin_keeps_fbs_unless_the_gain_exceeds_it():
    """A schedule is preferred to FBS's only when predicted faster by more than `fbs_margin`."""
    gains = []
    for seed in range(4):
        g, model, cost, problem = _oracle_case(seed, seed % 2 == 1)
        unit = 256
        for peak in sorted({p for _, p in Walk(problem, unit).schedules()}):
            budget = peak * unit + problem.scratch_bytes()
            free = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=unit, lookup=False), problem=problem)
            fbs = baseline(problem, budget, "fbs")
            if not free.fits or fbs[0] is None:
                continue
            gain = (fbs[2] - free.seconds_per_sample) / fbs[2]
            gains.append(gain)
            for margin in (gain / 2, gain * 2 + 1e-9):
                kept = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=unit, lookup=False, fbs_margin=margin), problem=problem)
                if gain > margin:
                    assert kept.steps == free.steps
                else:
                    assert tuple(kept.steps) == tuple(fbs[1])
                assert check_plan(kept.plan, [g]).peak_bytes <= budget
    assert max(gains) > 0.01  # some case where a schedule beats FBS


@lru_cache(maxsize=1)
def _squeezenet():
    return tightfit.load("onnxzoo-squeezenet")


def test_executed_vbs_plan_on_a_branched_zoo_model(kernel_runs, monkeypatch, tmp_path):
    """The ONNX zoo's SqueezeNet 1.1 (fire modules: special layers) for a request of 3 within a
    budget between the least feasible one and what batch 3 needs: the plan passes the checker
    and fits the budget, its kernels run exactly the planned sub-batches, every sample's output
    equals the reference executor's on that sample alone, and a fresh process measures what
    was analysed."""
    from tightfit.plan import schema
    from tightfit.runtime.executor import ArenaExecutor
    from tightfit.runtime.measure import measure_subprocess
    from tightfit.reference import run_reference
    from tightfit.verify import compare

    g = _squeezenet()
    model = PlannedModel(g, "onnxzoo-squeezenet", 3)
    cost = TableCost(7)
    problem = Problem(model, main_path(g), profile_seconds(model, cost, 3))
    least = smallest_feasible_budget(model, None, None, problem=problem)
    full = run_memory(plan_schedule(model, fbs_steps(problem, 3)))
    budget = (least + full) // 2
    found = search_vbs(model, budget, cost, problem=problem)
    assert found.fits and len({b for _, b in found.steps}) > 1
    report = check_plan(found.plan, [g])
    assert report.peak_bytes <= budget
    ran = kernel_runs(g)
    x = np.random.default_rng(0).standard_normal((3,) + g.shape(g.inputs[0])[1:], dtype=np.float32)
    out = ArenaExecutor(found.plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]
    assert ran == list(found.steps)
    monkeypatch.undo()
    for n in range(3):
        assert compare(out[n : n + 1], run_reference(g, x[n : n + 1])[g.outputs[0]]).ok
    path = tmp_path / "vbs.json"
    path.write_text(schema.dumps(found.plan))
    measured = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(measured.run_bytes - report.peak_bytes) <= 2**20


def test_graph_without_main_path_is_refused():
    from tightfit.errors import OptionError

    # a branch inside a branch: x + (b(a(x)) + c(a(x))) + d(x), every conv 1x1 over 2 channels
    rng = np.random.default_rng(0)
    convs = {n: conv(rng, n, x, 2, [1, 2, 4, 4], 2, 1, 0) for n, x in (("a", "x"), ("b", "ta"), ("c", "ta"), ("d", "x"))}
    adds = [helper.make_node("Add", ["tb", "tc"], ["s1"]), helper.make_node("Add", ["x", "s1"], ["s2"]),
            helper.make_node("Add", ["s2", "td"], ["y"])]
    nested = model_of([node for node, _, _ in convs.values()] + adds, [w for _, ws, _ in convs.values() for w in ws],
                      (1, 2, 4, 4), "y", (1, 2, 4, 4))
    with pytest.raises(OptionError, match="main path"):
        main_path(import_model(nested, None, "nested"))


def test_cli_errors(capsys):
    from tightfit.cli import main

    assert main(["plan", "onnxzoo-squeezenet", "--method", "vbs", "--batch", "4", "--budget", "1MB"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "smallest feasible budget is" in err
    assert main(["plan", "onnxzoo-squeezenet", "--method", "vbs", "--batch", "4"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert main(["plan", "onnxzoo-squeezenet", "--method", "reuse", "--unit", "2MB"]) == 2
    assert main(["plan", "onnxzoo-squeezenet", "--method", "vbs", "--batch", "0", "--budget", "9MB"]) == 2
    assert "--batch" in capsys.readouterr().err


def test_latency_bound_and_lookup_table():
    """A latency bound (the time of one sample through the network) admits the schedule of
    single samples and keeps every step within it (each step is some pivot's segment); the
    plan's lookup table holds, per memory level, the optimal profile, its last level the plan's."""
    from tightfit.techniques.vbs.graph_dp import per_layer_profile

    g, model, cost, problem = _oracle_case(1, True)
    budget = 10**6
    free = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=256), problem=problem)
    levels = free.plan.knobs["lookup"]
    assert [t for _, t, _ in levels] == sorted((t for _, t, _ in levels), reverse=True)
    assert levels[-1][2] == {str(k): v for k, v in per_layer_profile(free.steps).items()}
    one = sum(problem.seconds[l][1] for l, _ in fbs_steps(problem, 1)) / problem.request  # a sample, layer by layer
    bounded = search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=256, latency=one * 1.01, lookup=False), problem=problem)
    assert bounded.fits and bounded.seconds_per_sample >= free.seconds_per_sample
    assert all(problem.seconds[l][b] <= one * 1.01 for l, b in bounded.steps)
    tiny = min(min(s[1:]) for s in problem.seconds.values()) / 2
    assert not search_vbs(model, budget, cost, settings=VbsSettings(unit_bytes=256, latency=tiny, lookup=False), problem=problem).fits


def test_time_rounds_runs_each_distinct_plan_in_a_worker():
    """Interleaved timing: one worker process per distinct plan; a plan given twice shares its
    times; times are per sample."""
    from tightfit.runtime.vbs_runs import time_rounds

    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5", 2)
    problem = Problem(model, main_path(g), profile_seconds(model, TableCost(2), 2))
    one, two = (plan_schedule(model, fbs_steps(problem, b)) for b in (1, 2))
    rounds = time_rounds([one, two, two], g, repeats=3)
    assert [len(r) for r in rounds] == [3, 3, 3]
    assert rounds[1] == rounds[2] and rounds[0] != rounds[1]
    assert all(0 < t < 1 for r in rounds for t in r)
