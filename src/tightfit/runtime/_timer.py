"""A timing worker: `python -m tightfit.runtime._timer JOB_PICKLE` times one plan in a process of
its own (see `PlanTimer`).

job = {"plan": Plan, "graph": Graph, "seed": int}. The worker builds the executor, runs once to warm up and prints "ready"; then for each line
"N" on stdin it runs the plan N times and prints the seconds of each run as one JSON list.
Each run starts after twice the last-level cache has been written, so that a run's time does
not depend on which plan ran before it (in this worker or in another); with job["stir"] False
the runs follow each other as frames of a stream do (what the cost model predicts); with
job["clock"] "step", runs are timed on the clock the cost model times steps by (cost.timed:
at one thread, the thread's CPU time unless the wall interval is shorter).
"""
from __future__ import annotations

import json
import pickle
import sys
import time


def main() -> None:
    import numpy as np

    from tightfit.analysis.predict import CACHE_BYTES
    from tightfit.runtime.cost import timed
    from tightfit.runtime.executor import ArenaExecutor
    from tightfit.runtime.reference import random_input

    with open(sys.argv[1], "rb") as f:
        job = pickle.load(f)
    plan, graph = job["plan"], job["graph"]
    executor = ArenaExecutor(plan, [graph])
    x = random_input(graph, plan.models[0].batch, job["seed"])
    stir = np.empty(4 * CACHE_BYTES // 4, np.float32)  # CACHE_BYTES is half the last-level cache
    executor.run(x)
    print("ready", flush=True)
    for line in sys.stdin:
        seconds = []
        for _ in range(int(line)):
            if job.get("stir", True):
                stir.fill(1.0)
            if job.get("clock") == "step":
                seconds.append(timed(lambda: executor.run(x)))
                continue
            t0 = time.perf_counter()
            executor.run(x)
            seconds.append(time.perf_counter() - t0)
        print(json.dumps(seconds), flush=True)


if __name__ == "__main__":
    main()
