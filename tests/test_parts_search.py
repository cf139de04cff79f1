"""The parts search: a pure function of the model, the budget and a cost function. Checked against
exhaustive enumeration on the paper's 5-layer CNN, with a deterministic cost (steps and MACs)."""
from __future__ import annotations

import itertools

import pytest

import tightfit
from tightfit.analysis.csdf import needs_whole_input
from tightfit.cli import main
from tightfit.graph.ir import spatial
from tightfit.ops import get_op
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.offsets import lower_bound
from tightfit.techniques.parts.planner import PartsOptions, plan_parts
from tightfit.techniques.parts import phase_search
from tightfit.techniques.parts.phase_search import _peak_tensors, plan_point, search_parts
from tightfit.techniques.interface import PlannedModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def step_cost(graphs, per_step: float = 50e-6, per_mac: float = 1e-9):
    """A deterministic stand-in for the cost model: a fixed cost per step plus one per MAC."""
    def seconds(plan) -> float:
        total = 0.0
        for s in plan.steps():
            total += per_step
            if s.kind == "compute":
                g = graphs[s.model]
                layer = g.layers[s.layer]
                shapes = [g.shape(t) for t in layer.inputs]
                total += per_mac * get_op(layer.op).macs(layer, s.out.region, shapes, g.shape(layer.output))
        return total

    return seconds


def peak(plan, g) -> int:
    life = lifetimes(plan, [g])
    return lower_bound(life.reqs) + max(life.step_scratch, default=0)


def every_setting(g):
    """All phase counts 1, 2, 4, ... (and one per row) for every splittable layer and the source."""
    ladder = lambda h: sorted({min(p, h) for p in (1, 2, 4, 8, 16, 32, 64)})  # noqa: E731
    layers = [l for l in g.layers if not needs_whole_input(g, l) and spatial(g.shape(l.output))[0] > 1]
    choices = [ladder(spatial(g.shape(l.output))[0]) for l in layers]
    for source in ladder(spatial(g.shape(g.inputs[0]))[0]):
        for counts in itertools.product(*choices):
            yield {l.id: c for l, c in zip(layers, counts) if c > 1}, source


@pytest.fixture(scope="module")
def brute():
    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    seconds = step_cost([g])
    points = []
    for phases, source in every_setting(g):
        # A setting's plan is the better of aligned rows and equal parts (as the search takes it).
        plans = [plan_parts(model, phases, source, "greedy_by_size", options=PartsOptions(align=a)) for a in (True, False)]
        p = min(plans, key=lambda p: peak(p, g))
        points.append((peak(p, g), seconds(p)))
    return g, model, seconds, points


def quantiles(values, qs):
    ordered = sorted(set(values))
    return [ordered[int(q * (len(ordered) - 1))] for q in qs]


QS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


@pytest.mark.parametrize("limit, within", [(None, 1.0), (0, 1.10)])
def test_fastest_within_budget_against_brute_force(brute, limit, within, monkeypatch):
    """Exhaustive on a graph this small (the default): the optimum. The heuristic stages alone
    (no exhaustive pass): within 10% of the optimum time on this graph."""
    g, model, seconds, points = brute
    if limit is not None:
        monkeypatch.setattr(phase_search, "EXHAUSTIVE_LIMIT", limit)
    for budget in quantiles([m for m, _ in points], QS):
        best = min(t for m, t in points if m <= budget)
        found = search_parts(model, seconds, budget)
        assert found.fits and found.chosen.memory_bytes <= budget
        assert best <= found.chosen.seconds[0] + 1e-12 and found.chosen.seconds[0] <= within * best + 1e-12, budget


@pytest.mark.parametrize("limit, within", [(None, 1.0), (0, 1.10)])
def test_smallest_within_time_against_brute_force(brute, limit, within, monkeypatch):
    g, model, seconds, points = brute
    if limit is not None:
        monkeypatch.setattr(phase_search, "EXHAUSTIVE_LIMIT", limit)
    for max_seconds in quantiles([t for _, t in points], QS):
        best = min(m for m, t in points if t <= max_seconds)
        found = search_parts(model, seconds, None, max_seconds)
        assert found.fits and found.chosen.seconds[0] <= max_seconds
        assert best <= found.chosen.memory_bytes <= within * best, max_seconds


def test_no_point_of_the_front_is_dominated(brute):
    g, model, seconds, points = brute
    front = search_parts(model, seconds, None).front
    for a, b in zip(front, front[1:]):
        assert a.memory_bytes < b.memory_bytes and a.seconds > b.seconds


def test_search_on_a_zoo_model_fits_and_runs(tmp_path):
    """The chosen phases give a plan that fits, passes the checker and is reproducible."""
    g = tightfit.load("mobilenet_v1_025")
    model = PlannedModel(g, "mobilenet_v1_025")
    seconds = step_cost([g])
    unsplit = peak(plan_parts(model, {}, 1), g)
    first = search_parts(model, seconds, unsplit // 2)
    assert first.fits and first.chosen.config.phases
    plan = plan_point(model, first.chosen)
    assert check_plan(plan, [g]).peak_bytes <= unsplit // 2
    assert search_parts(model, seconds, unsplit // 2) == first  # pure: same inputs, same answer


def test_unreachable_budget(capsys):
    g = tightfit.load("mobilenet_v1_025")
    found = search_parts(PlannedModel(g, "m"), step_cost([g]), 1000)
    assert not found.fits
    assert found.chosen.memory_bytes == min(p.memory_bytes for p in found.front)
    assert main(["plan", "mobilenet_v1_025", "--method", "parts", "--budget", "1kB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no parts plan of mobilenet_v1_025 fits" in err[0] and "smallest found needs" in err[0]


def test_budget_cli_plan_runs_and_verifies(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "mobilenet_v1_025", "--method", "parts", "--budget", "600kB", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "by parts within" in text and "predicted" in text
    assert main(["run", str(out), "--verify"]) == 0
    assert "OK" in capsys.readouterr().out
    for argv in (["plan", "mobilenet_v1_025", "--budget", "1MB"],
                 ["plan", "mobilenet_v1_025", "--method", "parts", "--budget", "1MB", "--rows", "4"],
                 ["plan", "mobilenet_v1_025", "--method", "parts", "--budget", "lots"]):
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def yolo():
    g = tightfit.load("tiny-yolov2")
    return g, PlannedModel(g, "tiny-yolov2")


def test_peak_tensors_name_the_arena_peak(yolo):
    """The run's peak is the arena plus the largest step scratch; our kernels need no scratch, so
    in tiny-yolov2 split 16 ways up to layer 7 the peak is the arena's, set by the early layers'
    windows, largest first, which hold at least the lower bound."""
    g, model = yolo
    plan = plan_parts(model, {lid: 16 for lid in range(8)}, 16, "greedy_by_size", options=PartsOptions(align=True))
    life = lifetimes(plan, [g])
    arena, scratch = _peak_tensors(g, plan)
    assert max(life.step_scratch) == 0 and scratch is None
    assert arena and [b for _, b in arena] == sorted((b for _, b in arena), reverse=True)
    assert sum(b for _, b in arena) >= lower_bound(life.reqs)


def test_coarsening_unsplits_layers_the_budget_does_not_need(yolo):
    """tiny-yolov2 within 1.5 MB: every early layer must be split (their tensors are MBs), but
    the 13x13 layers after them fit whole. The first stages split
    them all; coarsening takes each split layer back to one phase when that still fits and is
    faster, not only halves its phases (a halved count can fit worse than one phase)."""
    g, model = yolo
    budget = 1_500_000
    found = search_parts(model, step_cost([g], 80e-6, 1 / 80e9), budget)
    assert found.fits
    phases = found.chosen.config.phases_dict()
    assert all(phases.get(lid, 1) > 1 for lid in (0, 1, 2, 3)), phases
    assert all(phases.get(lid, 1) == 1 for lid in range(10, 16)), phases
    plan = plan_point(model, found.chosen)
    assert check_plan(plan, [g]).peak_bytes <= budget


def test_search_holds_a_stream_whole_where_that_lowers_the_peak():
    """A stream of windows through two stages keeps both stages' windows live; holding the
    tensor between them whole (VGG's pooled outputs) lets the first stage's windows die first.
    The smallest plan found on such a network holds one, and is smaller than its phases
    streamed."""
    from onnx_chains import chain_graph
    from test_overlay import DOUBLING

    from tightfit.techniques.parts.planner import draft_parts
    from tightfit.runtime.executor import ArenaExecutor
    from tightfit.reference import run_reference
    from tightfit.runtime.reference import random_input
    from tightfit.verify import compare

    g = chain_graph(DOUBLING, (1, 1, 32, 32), "doubling")
    model = PlannedModel(g, "doubling")
    chosen = search_parts(model, step_cost([g]), None).chosen
    setting = chosen.config
    assert setting.held
    streamed = draft_parts(model, setting.phases_dict(), setting.source_phases, options=PartsOptions(align=setting.align))
    plan = plan_point(model, chosen)
    assert check_plan(plan, [g]).peak_bytes == chosen.memory_bytes < peak(streamed, g)
    x = random_input(g)
    assert compare(ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]], run_reference(g, x)[g.outputs[0]]).ok


def test_a_pick_with_nothing_split_is_drafted_with_nothing_split():
    """Under a budget the layer-by-layer plan fits, the pick splits no layer; the technique's
    draft of its Config is that plan (an empty phases setting once drafted as one row per phase
    everywhere, the paper's setting, so `plan --method parts --budget` ran another plan than the
    one it predicted)."""
    from tightfit.techniques.parts import config_of
    from tightfit.techniques.registry import technique

    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    chosen = search_parts(model, step_cost([g]), 10**9).chosen
    assert chosen.config.phases == ()
    drafted = technique("parts").draft(model, config_of(chosen.config, planner="improve"))
    assert drafted.steps() == plan_point(model, chosen).steps()
