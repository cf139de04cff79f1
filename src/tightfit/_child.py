"""Entry point of a measurement process: `python -m tightfit._child '<job json>'`, or
`python -m tightfit._child --preload '[[spec, input_shape], ...]'`: started early, it
loads those models, then reads its job as one line on stdin (an empty line: nothing to do).

job = {"kind": "reference", "model": spec, "input_shape": [..] | null, "batch": int | null}
job = {"kind": "plan", "plan": path, "allow_code": bool (its models by module:factory), "enforce_bytes": int | null,
       "threads": int (tf_run's; default 1)}
The model is loaded and its input made before the high-water mark is reset.

A face module, not part of runtime/: it loads models and plans by name (the frontend and
files.load_plan), which the runtime, below both, must not import."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tightfit.files import load_plan
from tightfit.frontend.load import load, load_ref
from tightfit.reference import run_reference
from tightfit.runtime.executor import ArenaExecutor, RowSource
from tightfit.runtime.measure import measure_in_this_process, release_pages
from tightfit.runtime.reference import input_dtype, random_input
from tightfit.stages import plan_inputs


@dataclass(frozen=True)
class Job:
    run: Callable[[], object]
    settle: Callable[[], None] | None = None  # before the baseline is read
    held_bytes: int = 0  # mapped before the measured run but counted by it (a plan's arena)


def _reference_job(job: dict) -> Job:
    graph = load(job["model"], job.get("input_shape"))
    x = random_input(graph, job.get("batch"))

    def run():
        out = run_reference(graph, x)
        out.clear()

    return Job(run)


def _alloc_job(job: dict) -> Job:
    """Calibration: a run that touches exactly `bytes` bytes of fresh memory."""
    n = int(job["bytes"])

    def run():
        t = np.empty(n // 4, dtype=np.float32)
        t.fill(1.0)
        del t

    return Job(run)


def _plan_job(job: dict) -> Job:
    """A plan run. The executor is built and run once before the measured run, and its arena's
    pages are given back before the baseline is read (see runtime/measure.py)."""
    plan, graphs = load_plan(job["plan"], PRELOADED, bool(job.get("allow_code")))
    # A plan that holds only a window of its input gets it as row bands, so the whole input
    # never exists during the run; a plan that holds the whole input gets a loaded tensor (the
    # caller's frame, outside the arena, as in any other run).
    windowed = {(s.model, s.out.tensor) for s in plan.steps()
                if s.kind == "input" and s.out.region.h < graphs[s.model].shape(s.out.tensor)[2]}
    xs = [_sources(g, ref.batch, i, x, windowed) for i, (g, ref, x) in enumerate(zip(graphs, plan.models, plan_inputs(graphs, plan)))]
    executor = ArenaExecutor(plan, graphs, threads=int(job.get("threads", 1)))
    # One run before the baseline: the kernel library's code pages a run touches are the program's
    # code, loaded like any library (a first run in the measured window counted up to 448 KiB of
    # them above minakova5's 8 KiB arena); the arena's pages are then given back, so the measured
    # run counts them again.
    executor.run(xs)
    return Job(lambda: executor.run(xs), lambda: release_pages(executor.arena), executor.arena.nbytes)


def _sources(g, batch: int, m: int, x, windowed: set) -> object:
    """Model `m`'s input: each windowed input as seeded row bands, the others as loaded arrays."""
    def one(t: str, k: int, a):
        seed = m if k == 0 else m + 1000 * k
        shape = (batch,) + tuple(g.shape(t)[1:])
        return RowSource.seeded(shape, seed, input_dtype(g, t)) if (m, t) in windowed else a

    if len(g.inputs) == 1:
        return one(g.inputs[0], 0, x)
    return {t: one(t, k, x[t]) for k, t in enumerate(g.inputs)}


JOBS = {"reference": _reference_job, "alloc": _alloc_job, "plan": _plan_job}


OUT_OF_MEMORY = 3
PRELOADED: dict[tuple[str, tuple[int, ...]], object] = {}  # (spec, input shape) -> Graph


def _preload(models: list) -> None:
    for spec, shape in models:
        try:
            # The caller names what it loaded already (its own command line or a file it vetted).
            first = next(iter(shape.values())) if isinstance(shape, dict) else shape  # a plan's input_shape: the first
            PRELOADED[(spec, tuple(first))] = load_ref(spec, shape, allow_code=True)
        except Exception:  # the job loads it again, and reports what fails then
            pass


def main() -> None:
    if sys.argv[1] == "--preload":
        _preload(json.loads(sys.argv[2]))
        line = sys.stdin.readline()
        if not line.strip():
            return
        job = json.loads(line)
    else:
        job = json.loads(sys.argv[1])
    j = JOBS[job["kind"]](job)
    if job.get("enforce_bytes") is not None:
        j.run()  # warm-up first: weights are prepacked on the first run and stay loaded
        try:
            if j.held_bytes > int(job["enforce_bytes"]):
                raise MemoryError(f"the arena alone is {j.held_bytes} bytes")
            # The arena is mapped already (counted in the data segment the limit starts from).
            m = measure_in_this_process(j.run, warmup=0, settle=j.settle, limit_bytes=int(job["enforce_bytes"]) - j.held_bytes)
        except (MemoryError, RuntimeError) as e:
            print(json.dumps({"out_of_memory": str(e).splitlines()[0][:300]}))
            sys.exit(OUT_OF_MEMORY)
    else:
        m = measure_in_this_process(j.run, warmup=job.get("warmup", 1), settle=j.settle)
    print(json.dumps({"baseline_bytes": m.baseline_bytes, "peak_bytes": m.peak_bytes, "seconds": m.seconds,
                      "uncertainty_bytes": m.uncertainty_bytes}), flush=True)


if __name__ == "__main__":
    main()
    os._exit(0)  # the caller waits for this process: an interpreter's teardown with its libraries loaded takes ~0.5 s
