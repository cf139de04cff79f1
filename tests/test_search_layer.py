"""The search layer (issue 20): techniques behind one interface and one registry, pure searches
over a frozen profile with the profiling stage around them, vbs bounded in time, `fit` with a
minimum fps and no budget."""
from __future__ import annotations

import pytest

import tightfit.stages as F
from tightfit import api
from tightfit.analysis.predict import Predictor, Profile
from tightfit.techniques.deadline import Deadline
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.interface import Config, Point, Problem, pareto
from tightfit.techniques.registry import TECHNIQUES, fit_sources, technique

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_every_technique_drafts_and_the_registry_names_them():
    import tightfit
    from tightfit.errors import OptionError
    from tightfit.plan.check import check_plan

    assert list(TECHNIQUES) == ["reuse", "parts", "tiling", "vbs"] and list(fit_sources()) == ["parts", "tiling", "vbs"]
    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    for name, settings in (("reuse", {}), ("parts", {"rows": 2}), ("tiling", {"tiling": "0-1:2x2"})):
        plan = technique(name).draft(model, Config(settings=settings))
        assert check_plan(plan, [g]).arena_bytes == plan.arena_bytes
    with pytest.raises(OptionError, match="available: reuse, parts, tiling, vbs"):
        technique("nope")


def test_one_pareto_keeps_the_first_of_equal_points_and_drops_dominated_ones():
    points = [Point((i,), m, (s,), (str(i),)) for i, (m, s) in enumerate([(3, 1.0), (1, 3.0), (2, 2.0), (2, 2.0), (3, 2.5)])]
    assert [p.config for p in pareto(points, tiebreak=lambda p: p.config)] == [(1,), (2,), (0,)]


def test_a_search_over_a_frozen_profile_never_measures():
    """The parts search over an empty profile predicts 0 for what it lacks and notes it, with a
    step to measure it by; over the profile completed from those notes it notes nothing."""
    import tightfit
    from tightfit.runtime.profiling import profiled_search
    from golden_fit import synthetic_profile

    g = tightfit.load("minakova5")
    model = PlannedModel(g, "minakova5")
    empty = Predictor(Profile("empty"))
    technique("parts").search(Problem(model, 5000, empty))
    assert empty.missing and all(how is None or how[2].kind for how in empty.missing.values())
    cost = synthetic_profile()
    front, profiling = profiled_search(cost, lambda predict, deadline: technique("parts").search(
        Problem(model, 5000, predict, Config(planner=None), deadline)))
    assert profiling.complete and profiling.passes >= 2 and front.fits
    again = Predictor(cost.frozen())
    assert technique("parts").search(Problem(model, 5000, again, Config(planner=None))).points == front.points
    assert again.complete


def test_vbs_stops_at_its_deadline_with_the_best_found():
    from test_vbs_graph import TableCost, _squeezenet

    from tightfit.techniques.vbs.graph_dp import Problem as DP, fbs_steps, main_path, plan_schedule, profile_seconds
    from tightfit.techniques.vbs.graph_dp import search_vbs, smallest_feasible_budget
    from tightfit.techniques.interface import run_memory

    g = _squeezenet()
    model = PlannedModel(g, "squeezenet1_0", 3)
    cost = TableCost(7)
    problem = DP(model, main_path(g), profile_seconds(model, cost, 3))
    least = smallest_feasible_budget(model, None, None, problem=problem)
    budget = (least + run_memory(plan_schedule(model, fbs_steps(problem, 3)))) // 2
    free = search_vbs(model, budget, cost, problem=problem)
    past = search_vbs(model, budget, cost, problem=problem, deadline=Deadline(0.0))
    assert not free.timed_out and past.timed_out and past.lookup == ()
    assert past.fits and run_memory(past.plan) <= budget  # the uniform schedules still answer


class Steps:
    """A stand-in prediction: 1e-4 s per step."""

    @staticmethod
    def plan_seconds(plan, graphs) -> float:
        return 1e-4 * len(plan.steps())

    @staticmethod
    def steps_seconds(plan, graphs, steps) -> float:
        return 1e-4 * len(steps)


def test_min_fps_without_a_budget_is_the_smallest_plan_meeting_it_as_measured():
    """No budget: the smallest plan whose measured fps (stub: 1000 / steps of its plan, so a plan
    of more steps is slower) meets the minimum, smallest first (Alg. 9)."""
    app = F.load_fit_app("minakova5")
    measured = lambda plan, graphs: [1000.0 / len(plan.steps())]  # noqa: E731
    o = api.fit(app, None, min_fps="60", cost=Steps(), measure=False, generations=1, timer=measured)
    assert o.fits and o.choice.measured_fps[0] >= 60 and o.choice.rule.startswith("memory")
    meeting = [p for p in o.search.front if 1000.0 / len(o.problem.plan(p.genes).steps()) >= 60]
    assert o.point.memory_bytes == min(p.memory_bytes for p in meeting)
    assert o.point.memory_bytes < o.search.reuse.memory_bytes
    from tightfit.report import fit_report, fit_text

    assert "at min fps 60, the smallest" in fit_text(fit_report(o))
    with pytest.raises(F.OptionError, match="--budget SIZE, --min-fps X, or both"):
        api.fit(app, None, cost=Steps(), measure=False)
