"""Runs of variable-batch plans: interleaved timing, the comparison of VBS with FBS and
Greedy-VBS, and the calibration of the cost model's step times per batch size by whole runs.

The cost model times each step alone on fresh buffers; for steps of many samples this differs
from the same steps inside a plan run by up to ~30% on this machine, and not the same way at
every batch (googlenet, FBS at batch 1 and 12: 95 and 133 ms per image predicted, 115 and 104
measured). `calibrate` runs the uniform plan of each batch b once and scales every step of b
samples by measured / predicted, so the DP sees how batching really changes run time; the
runs are kept in the cost model's profile like its step times.
"""
from __future__ import annotations

# How far off the calibrated prediction of a schedule mixing batch sizes was from its run here
# (googlenet, R = 12: 4% faster than FBS predicted, 4-6% slower measured): a mixed schedule
# is preferred to the best uniform one only when predicted faster by more than this.
MIXED_SCHEDULE_ERROR = 0.10
# How far apart paired runs of one plan are on a quiet machine here, and so the least error of a
# calibrated prediction: a schedule is preferred to FBS's only when predicted faster by more.
UNIFORM_SCHEDULE_ERROR = 0.03
# Names how `time_rounds` measures, in the keys of the runs kept in the cost profile: a new way
# of timing, new runs.
RUNS_VERSION = 2

import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import Sequence

from tightfit.graph.ir import Graph
from tightfit.plan.reuse import PlannedModel
from tightfit.plan.schema import Plan, dumps, fingerprint
from tightfit.plan.vbs_graph import (baseline, fbs_steps, make_problem, per_layer_profile, plan_schedule,
                                     predicted_seconds, run_memory)


def time_plans(plans: Sequence[Plan], graph: Graph, repeats: int = 5, seed: int = 0) -> list[float]:
    """Measured seconds per sample of each plan: the median of `repeats` runs, interleaved
    (plan 1, plan 2, ..., plan 1, ...) so that machine noise falls on all of them alike."""
    return [statistics.median(t) for t in time_rounds(plans, graph, repeats, seed)]


def time_rounds(plans: Sequence[Plan], graph: Graph, repeats: int = 5, seed: int = 0) -> list[list[float]]:
    """Seconds per sample of each plan in each of `repeats` rounds (a round runs every plan
    once, in reverse order every other round so that no plan always follows the same one;
    after one warm-up run each). Plans that are the same are run once and share their times.

    Each plan runs in a process of its own (`PlanTimer`), one process at a time: timed in one
    process beside other executors, the same pair of plans measured 2.7-7.0% apart depending
    on which other plans shared the process (mobilenet_v1, batch 4 vs 12), which made a
    calibration and a later comparison disagree."""
    texts = [dumps(replace(p, knobs={})) for p in plans]  # the same steps and buffers
    distinct = list(dict.fromkeys(texts))
    timers = [PlanTimer(plans[texts.index(t)], graph, seed) for t in distinct]
    try:
        measured: list[list[float]] = [[] for _ in distinct]
        for r in range(repeats):
            order = range(len(distinct)) if r % 2 == 0 else reversed(range(len(distinct)))
            for k in order:
                measured[k] += timers[k].run(1)
    finally:
        for t in timers:
            t.close()
    times = [measured[distinct.index(t)] for t in texts]
    return [[x / p.models[0].batch for x in t] for t, p in zip(times, plans)]


class PlanTimer:
    """One plan loaded and warmed up in a worker process (`runtime/_timer.py`) with this
    process's torch thread count; `run(n)` times n runs there."""

    def __init__(self, plan: Plan, graph: Graph, seed: int = 0):
        import torch

        with tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False) as f:
            pickle.dump({"plan": plan, "graph": graph, "seed": seed, "threads": torch.get_num_threads()}, f)
        self._job = f.name
        env = dict(os.environ, OMP_NUM_THREADS=str(torch.get_num_threads()))
        self.proc = subprocess.Popen([sys.executable, "-m", "tightfit.runtime._timer", self._job], env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._ready = False

    def run(self, n: int) -> list[float]:
        if not self._ready:
            self._expect("ready")
            self._ready = True
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        return json.loads(self._expect(None))

    def _expect(self, word: str | None) -> str:
        line = self.proc.stdout.readline()
        if not line or (word is not None and line.strip() != word):
            self.close()
            raise RuntimeError(f"timing worker failed: {self.proc.stderr.read().strip()[-2000:]}")
        return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        if os.path.exists(self._job):
            os.remove(self._job)


def paired_medians(rounds: list[list[float]]) -> list[float]:
    """Per plan, its median time relative to the mean of its round, times the median round mean:
    the load of a shared machine drifts between rounds, and the plans' ratios are what a
    choice between them rests on."""
    means = [statistics.fmean(r) for r in zip(*rounds)]
    scale = statistics.median(means)
    return [statistics.median(t / m for t, m in zip(times, means)) * scale for times in rounds]


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
