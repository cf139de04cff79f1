"""The arena executor: outputs equal the reference, every buffer is a view into the arena,
pipelined partitions give the same outputs on a stream, measured memory agrees with the
analysis, and --enforce stops a plan that needs more than its limit."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tightfit
from tightfit.cli import main
from tightfit.kernels.step_args import Array, Context, Struct, View, step_args
from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.measure import measure_subprocess
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.verify import compare

MiB = 2**20


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("name", ["minakova5", "mobilenet_v1_025", "resnet18"])
def test_arena_outputs_equal_reference(name, layout):
    g = tightfit.load(name)
    p = plan_reuse(PlannedModel(g, name), layout=layout)
    ex = ArenaExecutor(p, [g], fill_nan=True)
    x = random_input(g)
    out = ex.run(x)[0][g.outputs[0]]
    assert compare(out, run_reference(g, x)[g.outputs[0]]).ok
    assert np.shares_memory(out, ex.arena)


def _views(value) -> list[View]:
    """The views a step's argument values hold (inline, in arrays, in operands)."""
    if isinstance(value, View):
        return [value]
    if isinstance(value, (Array, Struct)):
        return [v for item in (value.items if isinstance(value, Array) else value.fields) for v in _views(item)]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _views(item)]
    return []


def test_every_bound_view_lives_in_the_arena():
    g = tightfit.load("mobilenet_v1_025")
    plan = plan_reuse(PlannedModel(g, "m"))
    ex = ArenaExecutor(plan, [g])
    ctx = Context(plan, [g], 0)
    views = [v for s in plan.steps() for v in _views(step_args(ctx, s).fields) if v.dims[0]]  # constants: no samples
    assert len(views) >= 2 * len(g.layers)
    for v in views:
        first = v.off + sum(min(0, (d - 1) * s) for d, s in zip(v.dims, v.strides))
        last = v.off + sum(max(0, (d - 1) * s) for d, s in zip(v.dims, v.strides))
        assert 0 <= first <= last < ex.arena.size, v


def test_pipelined_partitions_stream():
    g = tightfit.load("mobilenet_v1_025")
    n = len(g.layers)
    p = plan_reuse(PlannedModel(g, "mobilenet_v1_025"), partitions=[(0, range(0, n // 2)), (0, range(n // 2, n))],
                   concurrent=[[0, 1]])
    check_plan(p, [g])
    assert any(b.copies == 2 for b in p.buffers)  # the tensor passed between stages is double-buffered
    ex = ArenaExecutor(p, [g], fill_nan=True)
    frames = [random_input(g, seed=f) for f in range(6)]
    got: dict[int, np.ndarray] = {}
    count = ex.run_stream(frames, lambda f, outs: got.__setitem__(f, outs[0][g.outputs[0]].copy()))
    assert count == 6 and sorted(got) == list(range(6))
    for f, x in enumerate(frames):
        assert compare(got[f], run_reference(g, x)[g.outputs[0]]).ok, f


def test_several_models_one_arena():
    names = ["minakova5", "mobilenet_v1_025"]
    graphs = [tightfit.load(n) for n in names]
    p = plan_reuse([PlannedModel(g, n) for g, n in zip(graphs, names)])
    rep = check_plan(p, graphs)
    single = max(plan_reuse(PlannedModel(g, n)).arena_bytes for g, n in zip(graphs, names))
    # Models run one after another and share the arena; the first model's output (64 B once
    # aligned) is kept to the end for the caller.
    assert single <= rep.arena_bytes <= single + 64
    xs = [random_input(g) for g in graphs]
    outs = ArenaExecutor(p, graphs, fill_nan=True).run(xs)
    for g, x, o in zip(graphs, xs, outs):
        assert compare(o[g.outputs[0]], run_reference(g, x)[g.outputs[0]]).ok


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_measured_peak_agrees_with_analysis(name, tmp_path):
    g = tightfit.load(name)
    p = plan_reuse(PlannedModel(g, name))
    rep = check_plan(p, [g])
    path = tmp_path / "plan.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(m.run_bytes - rep.peak_bytes) <= 0.10 * rep.peak_bytes + MiB, (m.run_bytes, rep.peak_bytes)


def test_enforce_reuse_completes_where_naive_stops(tmp_path, capsys):
    reuse, naive = tmp_path / "reuse.json", tmp_path / "naive.json"
    assert main(["plan", "mobilenet_v1", "--out", str(reuse), "--json"]) == 0
    limit = json.loads(capsys.readouterr().out)["analysed_peak_bytes"] + 4 * MiB
    assert main(["plan", "mobilenet_v1", "--method", "naive", "--out", str(naive)]) == 0
    capsys.readouterr()
    assert main(["run", str(reuse), "--enforce", "--limit", str(limit)]) == 0
    assert "enforced" in capsys.readouterr().out
    assert main(["run", str(naive), "--enforce", "--limit", str(limit)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of memory" in err[0]
