"""Golden fronts of `fit` (issue 20, acceptance 2): the same seed and the same cost profile give
the same front and the same pick before and after the search layer's refactor. The profile is
synthetic and fixed: every step shape's stirred time is 20 us plus 1 ns per MAC (hot: 0.8 of
it), the profile constants fixed, so the figures depend on no machine. Run this file to write
the golden fronts again (only when a change of the search is meant to change them):

    PYTHONPATH=src python tests/golden_fit.py
"""
from __future__ import annotations

import json
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
# (name, model, input shape, budget as a fraction of the reuse plan's run memory)
CASES = (("minakova5", "minakova5", None, 0.5),
         ("mobilenet_v1_025_64", "mobilenet_v1_025", (1, 3, 64, 64), 0.5))
SEED = 0
GENERATIONS = 3


def synthetic_seconds(graphs, plan, step) -> float:
    from tightfit.ops import get_op

    seconds = 20e-6
    if step.kind == "compute":
        g = graphs[step.model]
        layer = g.layers[step.layer]
        shapes = [g.shape(t) for t in layer.inputs]
        seconds += 1e-9 * get_op(layer.op).macs(layer, step.out.region, shapes, g.shape(layer.output))
    return seconds


# (partition and llc_decay: added after the goldens were made; no other tenants evict)
CONSTANTS = {"loop": 1e-6, "native_call": 2e-6, "cold_byte": 1e-10, "partition": 0.0, "llc_decay": 0.0}


def figures(case: tuple) -> dict:
    """The front, the search's pick (Alg. 9) and fit's pick (timed by the prediction) of a case."""
    from tightfit import api
    from tightfit.techniques.fit import FitProblem

    name, model, shape, fraction = case
    app = api.load_fit_app(model, shape)
    cost = synthetic_profile()
    problem = FitProblem(app, cost.plan_seconds)
    budget = int(problem.evaluate(problem.reuse_genes()).memory_bytes * fraction)
    predicted = lambda plan, graphs: [1.0 / cost.plan_seconds(plan, graphs)]  # noqa: E731
    o = api.fit(app, budget, cost=cost, measure=False, seed=SEED, generations=GENERATIONS, timer=predicted)
    point = lambda p: {"genes": list(p.genes), "memory_bytes": p.memory_bytes,  # noqa: E731
                       "seconds": list(p.seconds), "labels": list(p.labels)}
    return {"budget": budget, "front": [point(p) for p in o.search.front], "search_pick": point(o.search.chosen),
            "fit_pick": point(o.point), "plan_arena_bytes": o.plan.arena_bytes}


def synthetic_profile():
    """The fixed synthetic profile, for whichever cost interface the search takes."""
    from tightfit.runtime.cost import CostModel

    class Synthetic(CostModel):
        def __init__(self) -> None:
            super().__init__(None)
            self.id = "synthetic"

        def _measure(self, plan, graphs, step, key) -> None:
            if key not in self.seconds:
                s = synthetic_seconds(graphs, plan, step)
                self.seconds[key], self.hot_seconds[key] = s, 0.8 * s

        def _once(self, key, measure) -> float:
            self.seconds[key] = CONSTANTS[key]
            return CONSTANTS[key]

    return Synthetic()


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for case in CASES:
        path = GOLDEN / f"fit_{case[0]}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(figures(case), indent=1) + "\n")
        tmp.replace(path)
        print(path)


if __name__ == "__main__":
    main()
