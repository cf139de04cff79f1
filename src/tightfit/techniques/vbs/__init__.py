"""Variable batch size (Choudhury et al.): the samples of a request run through the layers in
sub-batches that change from layer to layer, the fastest schedule within the budget found by a
dynamic program over per-layer step times. linear_dp.py: the paper's dynamic program over a
linear network; graph_dp.py: over a branched graph's main path, and the plans of schedules."""
from __future__ import annotations

from tightfit.errors import TightfitError
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.techniques.interface import Config, Front, Point, Problem, Technique, run_memory


def draft(model: PlannedModel, config: Config) -> Plan:
    """The plan of `config.settings` "schedule" ((layer id, samples) steps in order), placed by
    `config.planner` (a schedule's plan is always placed; None: the search's planner), with
    "knobs" if given."""
    from tightfit.techniques.vbs.graph_dp import plan_schedule
    from tightfit.techniques.interface import SEARCH_PLANNER

    return plan_schedule(model, config.get("schedule"), config.planner or SEARCH_PLANNER, config.layout, config.dtype,
                         dict(config.get("knobs", {})))


def label(steps) -> str:
    return "variable batch: " + ", ".join(f"{lid}x{b}" for lid, b in steps[:6]) + ("..." if len(steps) > 6 else "")


def search(problem: Problem) -> Front | None:
    """The DP's fastest schedule for the request within the budget (graph_dp.search_vbs).
    `problem.settings`: "unit_bytes", "latency", "batch_factors" (calibration by whole runs, done
    by the command layer), "margin", "fbs_margin". Offers nothing for a request of one sample in
    fit (`brief`), without a budget, or on a graph the DP's main path does not cover."""
    from tightfit.techniques.vbs.graph_dp import DEFAULT_UNIT_BYTES, VbsSettings, make_problem, search_vbs

    if problem.budget_bytes is None or (problem.brief and problem.model.batch == 1):
        return None
    if not hasattr(problem.predict, "step_seconds"):  # a stand-in predicting whole plans only
        return None
    c, s = problem.config, problem.settings
    try:
        dp = make_problem(problem.model, problem.predict, c.layout, batch_factors=s.get("batch_factors"))
        settings = VbsSettings(s.get("unit_bytes") or DEFAULT_UNIT_BYTES, s.get("latency"), margin=s.get("margin", 0.0),
                               fbs_margin=s.get("fbs_margin", 0.0))
        found = search_vbs(problem.model, problem.budget_bytes, problem.predict, settings, c.planner or "improve",
                           c.layout, dp, problem.deadline)
    except TightfitError:  # a graph the DP's main path does not cover (a branch inside a branch)
        if problem.brief:
            return None
        raise
    if found.plan is None:
        return Front((), None, None, False, 0, found.timed_out, found)
    config = Config(c.layout, c.dtype, c.planner or "improve", settings=dict(schedule=found.steps, knobs=found.plan.knobs))
    point = Point(config, run_memory(found.plan), (found.seconds_per_sample * problem.model.batch,), (label(found.steps),))
    return Front((point,), point, point, found.fits, 1, found.timed_out, found)


def offered(front: Front) -> list[Point]:
    return [front.chosen] if front.fits and front.chosen is not None else []


TECHNIQUE = Technique("vbs", "a request's samples in sub-batches that change across layers (Choudhury et al.)",
                      draft, search, fit_source=True, offered=offered)
