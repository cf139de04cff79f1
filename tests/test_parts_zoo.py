"""Every zoo model by parts, every splittable layer in more than one phase: outputs equal the
reference executor's, the plan checker passes, and the measured peak of a fresh process agrees
with the analysed one (as for buffer reuse: within 10% + 1 MiB)."""
from __future__ import annotations

import pytest

import tightfit
from tightfit.frontend import zoo
from tightfit.graph.ir import spatial
from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.techniques.parts.planner import PartsOptions, plan_parts
from tightfit.techniques.parts.phase_search import splittable_layers
from tightfit.techniques.interface import PlannedModel
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.measure import measure_subprocess
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.verify import compare

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def phases_everywhere(g, p: int) -> dict[int, int]:
    """p phases (at most one per row) for every layer that can be split."""
    return {lid: min(p, spatial(g.shape(g.layers[lid].output))[0]) for lid in splittable_layers(g)}


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_by_parts(name, tmp_path):
    g = tightfit.load(name)
    phases = phases_everywhere(g, 4)
    assert phases and all(p > 1 for p in phases.values())
    # Aligned rows (as the search plans) on most models; equal parts on every third, so both
    # ways of cutting rows run on every kind of layer.
    align = zoo.names().index(name) % 3 != 0
    p = plan_parts(PlannedModel(g, name), phases, 4, options=PartsOptions(align=align))
    rep = check_plan(p, [g])
    x = random_input(g)
    outs = ArenaExecutor(p, [g], fill_nan=True).run(x)[0]
    ref = run_reference(g, x)
    for t in g.outputs:
        result = compare(outs[t], ref[t])
        assert result.ok, f"{name} output {t}: {result}"
    path = tmp_path / "plan.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(m.run_bytes - rep.peak_bytes) <= 0.10 * rep.peak_bytes + 2**20, (m.run_bytes, rep.peak_bytes)
