"""Bounded search time: a deadline passed into the searches (a value on a clock the caller gives)
stops them between candidates, and they answer with the best found so far. Clocks here are
counters, so nothing depends on this machine's speed."""
from __future__ import annotations

import pytest

import tightfit
import tightfit.stages as F
from tightfit.cli import main
from tightfit.techniques.deadline import Deadline
from tightfit.techniques.fit import Constraints, FitProblem, search
from tightfit.techniques.parts.phase_search import search_parts
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.tiling import TilingOptions, search_tiling
from test_parts_search import step_cost

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Ticks:
    """A clock that advances one second each time it is read."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_parts_search_stops_at_its_deadline_with_the_best_found_so_far():
    g = tightfit.load("mobilenet_v1_025")
    model = PlannedModel(g, "m")
    full = search_parts(model, step_cost([g]), 1)
    clock = Ticks()
    lines = []
    cut = search_parts(model, step_cost([g]), 1, deadline=Deadline.after(5, clock), progress=lines.append)
    assert cut.timed_out and not full.timed_out
    assert 1 < cut.evaluated < full.evaluated and cut.chosen.memory_bytes >= full.smallest.memory_bytes
    assert cut.chosen == cut.smallest and any("time is up" in line for line in lines)


def test_tiling_search_stops_at_its_deadline_and_still_answers():
    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    seconds = lambda plan, steps: 1e-4 * len(steps)  # noqa: E731
    full = search_tiling(model, seconds, 1, options=TilingOptions(front_points=0, parts=False))
    cut = search_tiling(model, seconds, 1, options=TilingOptions(front_points=0, parts=False), deadline=Deadline.after(3, Ticks()))
    assert cut.timed_out and cut.evaluated < full.evaluated
    assert cut.smallest_bytes >= full.smallest_bytes and cut.chosen.memory_bytes == cut.smallest_bytes


def test_tiling_search_past_its_deadline_predicts_no_group_it_had_not_predicted():
    """Assembling the answer past the deadline guesses a group's time from its layers' layer-by-
    layer time instead of drafting and predicting it (densenet121 at 1/8 spent 20 s so)."""
    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    timed_plans = []

    def seconds(plan, steps):
        timed_plans.append(plan)
        return 1e-4 * len(steps)

    # (20 clock reads: the deadline passes with 19 group options planned, 69 in the whole space)
    cut = search_tiling(model, seconds, 1, options=TilingOptions(front_points=4, parts=False), deadline=Deadline.after(20, Ticks()))
    assert cut.timed_out and cut.evaluated > 0 and cut.front
    assert len({id(p) for p in timed_plans}) == 1  # the layer-by-layer draft only


def test_fit_search_past_its_deadline_answers_from_the_plans_found():
    app = F.load_fit_app("minakova5")
    seconds = step_cost(app.graphs)
    lines = []
    problem = FitProblem(app, lambda plan, graphs: seconds(plan))
    found = search(problem, Constraints(1, (0.0,)), exhaustive_limit=0, source_budget=1,
                   deadline=Deadline(0.0), say=lines.append)
    full = FitProblem(app, lambda plan, graphs: seconds(plan))
    search(full, Constraints(1, (0.0,)), exhaustive_limit=0, source_budget=1)
    assert found.front and len(problem.points) < len(full.points)
    assert any(line.startswith("fit: seeds") for line in lines) and any("time is up" in line for line in lines)


def test_fit_sources_share_the_time_left_less_the_seeds_reserve():
    """Each source gets its share (`fit_share`) of the time left, less the seeds' reserve; one
    that ends early leaves its time to the next (the first took all 60 s on inception_v3)."""
    from tightfit.techniques.fit import problem as fit_problem
    from tightfit.techniques.interface import Technique

    now = [0.0]
    clock = lambda: now[0]  # noqa: E731
    given = []

    def search(problem):
        given.append(problem.deadline.at - now[0])
        now[0] += 1.0  # each source takes 1 s
        return None

    sources = {n: Technique(n, n, lambda model, config: None, search, fit_source=True, fit_share=w)
               for n, w in (("a", 2.0), ("b", 1.0), ("c", 1.0))}
    app = F.load_fit_app("minakova5")
    problem = FitProblem(app, lambda plan, graphs: 1.0)
    problem.deadline = Deadline(100.0, clock)
    problem.add_candidates(sources, 1)
    reserve = fit_problem.SEEDS_SHARE * 100.0
    assert given == pytest.approx([(100 - reserve) / 2, (99 - reserve) / 2, 98 - reserve])


def test_plan_budget_with_a_time_limit_prints_progress_and_a_checked_plan(capsys):
    assert main(["plan", "minakova5", "--method", "parts", "--budget", "5kB", "--time-limit", "30", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "parts search:" in err and "(counted)" in err


@pytest.mark.parametrize("name", ["onnxzoo-squeezenet"])  # SqueezeNet 1.1 from the ONNX zoo (no torch needed)
def test_tiling_search_past_its_deadline_from_the_start_answers_layer_by_layer(name):
    """Time up before the coarse pass: the fine pass's new segments still get their
    layer-by-layer option (they had none, and the chain over them failed with a KeyError)."""
    g = tightfit.load(name)
    model = PlannedModel(g, name)
    seconds = lambda plan, steps: 1e-4 * len(steps)  # noqa: E731
    cut = search_tiling(model, seconds, 1, options=TilingOptions(front_points=0, parts=False), deadline=Deadline(0.0))
    assert cut.timed_out and cut.evaluated == 0 and cut.chosen.memory_bytes == cut.smallest_bytes


def _fake_profiling(monkeypatch, seconds_per_shape: float):
    """A CostModel in memory whose constants are known and whose every step shape takes
    `seconds_per_shape` of a fake clock to measure (its time: 1 us per unit of work)."""
    from tightfit.analysis.predict import CONSTANTS, step_work
    from tightfit.runtime import profiling
    from tightfit.runtime.cost import CostModel

    now = [0.0]
    cost = CostModel(None)
    for key in CONSTANTS:
        cost.record(key, 0.0)

    def measure(plan, graphs, step, key):
        now[0] += seconds_per_shape
        cost._keep(key, {"s": 1e-6 * step_work(key)[1], "h": 1e-6 * step_work(key)[1], "n": True})

    monkeypatch.setattr(cost, "_measure", measure)
    monkeypatch.setattr(profiling, "MEASURE_CHUNK", 1)
    return cost, (lambda: now[0])


def test_profiling_within_the_limit_measures_what_the_search_asked_for_most(monkeypatch):
    """With a time limit, the stage stops measuring at MEASURE_UNTIL of it: minakova5 by parts
    (more step shapes than the limit lets it measure at 2 s a shape), limit 10 s: 4 shapes
    measured (the last one started before 7 s had passed), the rest predicted from the kernels' rates fitted to those 7 and said so; without a
    limit every shape is measured and the last pass is complete."""
    from tightfit.analysis.predict import step_key
    from tightfit.runtime.profiling import profiled_search
    from tightfit.techniques.parts.planner import plan_parts

    g = tightfit.load("minakova5")
    plan = plan_parts(PlannedModel(g, "minakova5"), {0: 4, 1: 2}, 8, "greedy_by_size")
    keys = {step_key(plan, [g], s) for s in plan.steps()}
    assert len(keys) > 4
    cost, clock = _fake_profiling(monkeypatch, 2.0)
    seen = []

    def search(predictor, deadline):
        seen.append(deadline.left() if deadline else None)
        return predictor.plan_seconds(plan, [g])

    predicted, report = profiled_search(cost, search, lambda: Deadline.after(10.0, clock))
    assert report.shapes == 4 and report.predicted == len(keys) - 4 and not report.complete
    assert seen == [pytest.approx(3.5), pytest.approx(2.0)]  # the first search's share, then what is left
    assert predicted > 0 and "predicted from the kernels' measured rates" in report.line("parts search", 10.0)
    cost, _ = _fake_profiling(monkeypatch, 2.0)
    whole, report = profiled_search(cost, search)
    assert report.complete and report.shapes == len(keys) and report.predicted == 0


def test_kernel_rates_predict_a_shape_from_its_family():
    """A step shape not measured costs its family's seconds per unit of work times its work: a
    conv key twice the work of measured ones, twice their time; an empty profile, the defaults."""
    from tightfit.analysis.predict import DEFAULT_MAC_SECONDS, KernelRates, Profile, step_key, step_work
    from tightfit.techniques.reuse.planner import plan_reuse

    g = tightfit.load("minakova5")
    plan = plan_reuse(PlannedModel(g, "minakova5"))
    convs = [step_key(plan, [g], s) for s in plan.steps() if s.kind == "compute" and g.layers[s.layer].op == "conv"]
    measured = {k: 2e-9 * step_work(k)[1] for k in convs[:-1]}
    rates = KernelRates(Profile("p", measured))
    assert rates.seconds(convs[-1]) == pytest.approx(2e-9 * step_work(convs[-1])[1])
    # A VBS calibration's runs share the profile (vbs_calibration): not a step, not a rate.
    calibrated = {**measured, '["vbs uniform runs", 2, "dc30ca5835c2bb03", 3, 1, "nhwc", "improve"]': 0.5}
    assert KernelRates(Profile("p", calibrated)).seconds(convs[-1]) == pytest.approx(rates.seconds(convs[-1]))
    assert KernelRates(Profile("empty")).seconds(convs[-1]) == pytest.approx(DEFAULT_MAC_SECONDS * step_work(convs[-1])[1])
