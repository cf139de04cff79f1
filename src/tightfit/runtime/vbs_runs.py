"""Timed runs of whole plans (variable-batch plans and their baselines): each plan in a worker
process of its own, interleaved rounds, paired medians. The calibration and comparison built on
them plan as well, so they live above the planners, in tightfit/vbs_calibration.py.
"""
from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import Sequence

from tightfit import atomic, children
from tightfit.graph.ir import Graph
from tightfit.plan.schema import Plan, dumps

# Names how `time_rounds` measures, in the keys of the runs kept in the cost profile: a new way
# of timing, new runs.
RUNS_VERSION = 2


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
        for t in timers:  # every worker loaded before any is timed (a loading worker takes a core)
            t.run(0)
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
    """One plan loaded and warmed up in a worker process (`runtime/_timer.py`; the kernel library
    runs on one thread); `run(n)` times n runs there (each after a cache stir unless
    `stir` is False: then back to back, as frames of a stream; `clock` "step": timed as the cost
    model times steps, else wall time)."""

    def __init__(self, plan: Plan, graph: Graph, seed: int = 0, stir: bool = True, clock: str = "wall"):
        with tempfile.NamedTemporaryFile("wb", suffix=".pickle", delete=False) as f:
            atomic.track(f.name)
            pickle.dump({"plan": plan, "graph": graph, "seed": seed,
                         "stir": stir, "clock": clock}, f)
        self._job = f.name
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.proc = children.popen([sys.executable, "-m", "tightfit.runtime._timer", self._job], env=env, text=True,
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
        atomic.discard(self._job)


def paired_medians(rounds: list[list[float]]) -> list[float]:
    """Per plan, its median time relative to the mean of its round, times the median round mean:
    the load of a shared machine drifts between rounds, and the plans' ratios are what a
    choice between them rests on."""
    means = [statistics.fmean(r) for r in zip(*rounds)]
    scale = statistics.median(means)
    return [statistics.median(t / m for t, m in zip(times, means)) * scale for times in rounds]
