"""Buffer reuse, layer by layer (planner.py): every tensor whole, buffers placed in one arena
by an offset planner; with config.order "memory", the layer order with the smallest peak."""
from __future__ import annotations

from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse, plan_reuse_overlapping
from tightfit.plan.schema import Plan
from tightfit.techniques.interface import SEARCH_PLANNER, Config, Front, Point, Problem, Technique, run_memory


def draft(model: PlannedModel, config: Config) -> Plan:
    """The layer-by-layer plan (placed: by `config.planner`, or the search's planner if None);
    setting "inplace": outputs over their inputs' bytes where kernels allow (plan_reuse_overlapping)."""
    if config.get("inplace", False):
        return plan_reuse_overlapping(model, config.planner or SEARCH_PLANNER, config.order, config.layout, config.dtype)
    return plan_reuse(model, config.planner or SEARCH_PLANNER, config.order, config.layout, config.dtype)


def search(problem: Problem) -> Front:
    """Reuse has one plan per order: both orders, the pick the fastest that fits."""
    points = []
    for order in ("imported", "memory"):
        config = Config(problem.config.layout, problem.config.dtype, None, order)
        plan = draft(problem.model, config)
        points.append(Point(config, run_memory(plan), (problem.seconds(plan),),
                            (f"layer by layer, {order} order",), exact=True))
    smallest = min(points, key=lambda p: (p.memory_bytes, p.config.order))
    fitting = [p for p in points if problem.budget_bytes is None or p.memory_bytes <= problem.budget_bytes]
    chosen = min(fitting, key=lambda p: (p.seconds, p.memory_bytes)) if fitting else smallest
    from tightfit.techniques.interface import pareto

    return Front(pareto(points), chosen, smallest, bool(fitting), len(points))


TECHNIQUE = Technique("reuse", "layer by layer, buffers reused in one arena", draft, search)
