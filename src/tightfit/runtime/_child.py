"""Entry point of a measurement process: `python -m tightfit.runtime._child '<job json>'`.

job = {"kind": "reference", "model": spec, "input_shape": [..] | null, "batch": int | null}
The model is loaded and its input made before the high-water mark is reset."""
from __future__ import annotations

import json
import sys

import torch


def _reference_job(job: dict):
    import tightfit
    from tightfit.runtime.reference import load_params, random_input, run_reference

    graph = tightfit.load(job["model"], job.get("input_shape"))
    params = load_params(graph)
    x = random_input(graph, job.get("batch"))

    def run():
        out = run_reference(graph, x, params=params)
        out.clear()

    return run


def _alloc_job(job: dict):
    """Calibration: a run that touches exactly `bytes` bytes of fresh memory."""
    n = int(job["bytes"])

    def run():
        t = torch.empty(n // 4, dtype=torch.float32)
        t.fill_(1.0)
        del t

    return run


def _plan_job(job: dict):
    """A plan run: the executor (and so its arena) is made inside the measured run."""
    import tightfit
    from tightfit.runtime.executor import ArenaExecutor
    from tightfit.runtime.reference import load_params

    plan, graphs = tightfit.api.load_plan(job["plan"])
    params = [load_params(g) for g in graphs]
    xs = tightfit.api.plan_inputs(graphs, plan)

    def run():
        ex = ArenaExecutor(plan, graphs, params)
        ex.run(xs)
        del ex

    return run


JOBS = {"reference": _reference_job, "alloc": _alloc_job, "plan": _plan_job}


OUT_OF_MEMORY = 3


def main() -> None:
    from tightfit.runtime.measure import measure_in_this_process

    job = json.loads(sys.argv[1])
    torch.set_grad_enabled(False)
    run = JOBS[job["kind"]](job)
    if job.get("enforce_bytes") is not None:
        from tightfit.runtime.enforce import enforce_limit

        run()  # warm-up first: weights are prepacked on the first run and stay loaded
        enforce_limit(None, int(job["enforce_bytes"]))
        try:
            m = measure_in_this_process(run, warmup=0)
        except (MemoryError, RuntimeError) as e:
            print(json.dumps({"out_of_memory": str(e).splitlines()[0][:300]}))
            sys.exit(OUT_OF_MEMORY)
    else:
        m = measure_in_this_process(run, warmup=job.get("warmup", 1))
    print(json.dumps({"baseline_bytes": m.baseline_bytes, "peak_bytes": m.peak_bytes, "seconds": m.seconds}))


if __name__ == "__main__":
    main()
