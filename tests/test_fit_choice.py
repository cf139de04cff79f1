"""How `fit` chooses among the plans that fit (tightfit.stages.choose): with a budget only, the fastest
measured of the plans predicted fastest; with a minimum fps and the memory objective, the smallest
whose measured fps meets it (Alg. 9). Measured fps come from a stub timer, so nothing here depends
on this machine's speed."""
from __future__ import annotations

import pytest

import tightfit.stages as F
from tightfit import api
from tightfit.techniques.fit import FitError, FitPoint, FitProblem

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def point(i: int, memory: int, seconds: float) -> FitPoint:
    return FitPoint((i,), memory, (seconds,), (f"plan {i}",))


# Predicted: 0 fastest, then 1, 2, 3; memory: 3 smallest, then 2, 1, 0.
POINTS = [point(0, 400, 1.0), point(1, 300, 2.0), point(2, 200, 3.0), point(3, 100, 4.0)]


class StubTimer:
    """Measured fps per point id; records what was timed."""

    def __init__(self, fps: dict[int, float | None]):
        self.fps, self.timed = fps, []

    def __call__(self, p: FitPoint):
        self.timed.append(p.genes[0])
        f = self.fps[p.genes[0]]
        return None if f is None else (f,)


def test_budget_only_keeps_the_fastest_measured_of_the_predicted_fastest():
    timer = StubTimer({0: 0.5, 1: 0.9, 2: 0.7, 3: 5.0})  # 1 measures fastest of the first three; 3 is never timed
    c = F.choose(POINTS, (0.0,), "speed", timer)
    assert timer.timed == [0, 1, 2] and c.point.genes == (1,) and c.met and c.measured_fps == (0.9,)
    assert c.rule.startswith("speed")


def test_memory_objective_keeps_the_smallest_whose_measured_fps_meets_the_minimum():
    timer = StubTimer({0: 1.0, 1: 0.6, 2: 0.45, 3: 0.2})
    # Predicted fps 0.25 (3) and 0.33 (2) are within FPS_SLACK of 0.4 only for 2: 3 is not timed.
    c = F.choose(POINTS, (0.4,), "memory", timer)
    assert timer.timed == [2] and c.point.genes == (2,) and c.met and "Alg. 9" in c.rule
    timer = StubTimer({0: 1.0, 1: 0.6, 2: 0.3, 3: 0.2})  # 2 measures too slow: the next smallest is timed
    c = F.choose(POINTS, (0.4,), "memory", timer)
    assert timer.timed == [2, 1] and c.point.genes == (1,) and c.met


def test_speed_objective_with_a_minimum_keeps_the_fastest_that_meets_it_as_measured():
    timer = StubTimer({0: 0.3, 1: 0.5, 2: 0.45, 3: 9.0})  # 0 is predicted fastest but measures below 0.4
    c = F.choose(POINTS, (0.4,), "speed", timer)
    assert c.point.genes == (1,) and c.met


def test_a_minimum_no_timed_plan_meets_is_reported_unmet_with_the_fastest_timed():
    timer = StubTimer({0: 0.3, 1: 0.35, 2: 0.2, 3: 0.1})
    c = F.choose(POINTS, (0.45,), "speed", timer)  # 2 and 3 are predicted too slow to be timed
    assert timer.timed == [0, 1] and not c.met and c.point.genes == (1,) and "none of the 2 timed" in c.rule


def test_a_plan_whose_placement_misses_the_budget_is_passed_over():
    timer = StubTimer({0: None, 1: 0.5, 2: 0.4, 3: 0.3})
    c = F.choose(POINTS, (0.0,), "speed", timer)
    assert timer.timed == [0, 1, 2, 3] and c.point.genes == (1,) and c.timed == 3
    assert F.choose(POINTS, (0.0,), "speed", StubTimer(dict.fromkeys(range(4)))).point is None


def step_seconds(plan, graphs) -> float:
    return 1e-4 * len(plan.steps())


class StepCost:
    plan_seconds = staticmethod(step_seconds)

    @staticmethod
    def steps_seconds(plan, graphs, steps) -> float:
        return 1e-4 * len(steps)


def test_fit_says_when_the_minimum_fps_is_not_met_as_measured():
    """Predicted fast enough, measured (stub) too slow: FitError naming the measured fps; with
    best effort, the fastest timed plan, reported as not meeting the constraints."""
    app = F.load_fit_app("minakova5")
    problem = FitProblem(app, step_seconds)
    budget = problem.evaluate(problem.reuse_genes()).memory_bytes - 1  # reuse alone does not fit
    fast_enough = 0.5 / step_seconds(problem.plan(problem.reuse_genes()), app.graphs)
    slow = lambda plan, graphs: [fast_enough / 10]  # noqa: E731
    options = dict(cost=StepCost(), measure=False, generations=1, timer=slow)
    with pytest.raises(FitError, match="as measured"):
        api.fit(app, budget, min_fps=f"{fast_enough:g}", objective="memory", **options)
    o = api.fit(app, budget, min_fps=f"{fast_enough:g}", objective="memory", best_effort=True, **options)
    assert not o.fits and o.memory_bytes <= budget and "none of the" in o.choice.rule
    from tightfit.report import fit_report, fit_text

    text = fit_text(fit_report(o))
    assert "chosen by memory" in text and "measured" in text


def test_best_effort_takes_the_smallest_plan_evaluated_even_below_the_fronts_floor():
    """The front leaves out time-guided plans below the memory side's smallest; when nothing fits,
    best effort still takes the smallest plan there is (deeplabv3 got reuse, 46.96 MB, while the
    parts search had found 24.06 MB)."""
    app = F.load_fit_app("minakova5")
    problem = FitProblem(app, step_seconds)
    reuse = problem.evaluate_exact(problem.reuse_genes())
    smaller = min((problem.evaluate(g) for g in problem.seeds()), key=lambda p: p.memory_bytes)
    assert smaller.memory_bytes < reuse.memory_bytes
    assert [p.genes for p in problem.front()] == [reuse.genes]  # below the floor: not on the front
    assert F.closest(problem).memory_bytes == smaller.memory_bytes
