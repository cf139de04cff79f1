"""Calibration of the cost model's step times per batch size by whole runs, and the comparison
of VBS with FBS and Greedy-VBS. Here, above both the planners and the runtime, because each
plans (techniques/vbs/graph_dp.py) and then times the plans (runtime/vbs_runs.py).

The cost model times each step alone on fresh buffers; for steps of many samples this differs
from the same steps inside a plan run by up to ~30% on this machine, and not the same way at
every batch (googlenet, FBS at batch 1 and 12: 95 and 133 ms per image predicted, 115 and 104
measured). `calibrate` runs the uniform plan of each batch b once and scales every step of b
samples by measured / predicted, so the DP sees how batching really changes run time; the
runs are kept in the cost model's profile like its step times.
"""
from __future__ import annotations

from tightfit.graph.fingerprint import fingerprint
from tightfit.graph.ir import Graph
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.techniques.vbs.graph_dp import (baseline, fbs_steps, make_problem, per_layer_profile, plan_schedule,
                                     predicted_seconds)
from tightfit.techniques.interface import run_memory
from tightfit.runtime.vbs_runs import RUNS_VERSION, paired_medians, time_plans, time_rounds

# How far off the calibrated prediction of a schedule mixing batch sizes was from its run here
# (googlenet, R = 12: 4% faster than FBS predicted, 4-6% slower measured): a mixed schedule
# is preferred to the best uniform one only when predicted faster by more than this.
MIXED_SCHEDULE_ERROR = 0.10
# How far apart paired runs of one plan are on a quiet machine here, and so the least error of a
# calibrated prediction: a schedule is preferred to FBS's only when predicted faster by more.
UNIFORM_SCHEDULE_ERROR = 0.03


def compare_methods(plan: Plan, graph: Graph, cost, planner: str = "improve", layout: str = "nhwc",
                    measure: bool = True, repeats: int = 5) -> dict:
    """A VBS plan beside FBS and Greedy-VBS within the same budget: per-layer sub-batches,
    predicted (cost model) and measured seconds per sample, analysed run memory."""
    model = PlannedModel(graph, plan.models[0].spec, plan.models[0].batch)
    problem = make_problem(model, cost, layout, plan.dtype, batch_factors=calibrate(model, cost, planner, layout))
    budget = int(plan.knobs["budget"])
    steps = [tuple(x) for x in plan.knobs["profile"]]
    rows = {"vbs": (plan, steps, predicted_seconds(problem, steps), plan.knobs.get("batch"))}  # a batch if uniform
    for method in ("fbs", "greedy"):
        rows[method] = baseline(problem, budget, method, planner, layout)
    ran = [m for m, r in rows.items() if r[0] is not None]
    measured = dict(zip(ran, time_plans([rows[m][0] for m in ran], graph, repeats))) if measure else {}
    out = {"budget_bytes": budget, "request": problem.request,
           "profile": {str(k): v for k, v in per_layer_profile(steps).items()}, "methods": {}}
    for m, (p, st, pred, batch) in rows.items():
        out["methods"][m] = {"fits": p is not None, "predicted_seconds_per_sample": pred if p is not None else None,
                             "measured_seconds_per_sample": measured.get(m),
                             "run_bytes": run_memory(p) if p is not None else None,
                             "batch": batch if m != "greedy" or batch is None else {str(k): v for k, v in batch.items()}}
    return out


def calibrate(model: PlannedModel, cost, planner: str = "improve", layout: str = "nhwc",
              repeats: int = 7, sample: int = 0) -> list[float]:
    """Per batch b (index b; 0 unused): measured / predicted seconds of the uniform plan of
    batch b over the request. The plans of every b are timed in interleaved rounds (the median
    of `repeats`), so that the load of a shared machine falls on all of them alike; the times
    are kept in the cost profile. The prediction is from the smoothed profile, as the DP uses it.
    `sample` k > 0 is another, independent calibration (its own rounds, kept apart): a plan
    chosen because one calibration favours it is judged by another, free of that choice's bias."""
    base = make_problem(model, cost, layout)
    apart = f", {sample}" if sample else ""
    keys = [f'["vbs uniform runs", {RUNS_VERSION}, "{fingerprint(model.graph)}", {model.batch}, {b}, "{layout}", "{planner}"{apart}]'
            for b in range(1, model.batch + 1)]
    if any(k not in cost.seconds for k in keys):
        plans = [plan_schedule(model, fbs_steps(base, b), planner, layout) for b in range(1, model.batch + 1)]
        for k, t in zip(keys, paired_medians(time_rounds(plans, model.graph, repeats))):
            cost.record(k, t)
        cost.save()
    return [1.0] + [cost.seconds[k] / predicted_seconds(base, fbs_steps(base, b)) for b, k in enumerate(keys, 1)]
