"""Processing by parts: plans compiled from the CSDF firing order run with outputs equal to the
reference, pass the checker, and hold only the rows still needed."""
from __future__ import annotations

import numpy as np

import json

import pytest

import tightfit
from tightfit.analysis.csdf import max_phases
from tightfit.cli import main
from tightfit.plan.check import check_plan
from tightfit.techniques.parts.planner import PartsOptions, phases_for_rows, plan_parts
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.runtime.executor import ArenaExecutor
from tightfit.reference import run_reference
from tightfit.verify import compare

# Minakova & Stefanov Table II phase settings on the Fig. 1 CNN (layer 0 = n2, layer 1 = n3).
EXAMPLES = {
    "Ex1": ({}, None),
    "Ex2": ({0: 2}, [24, 8]),
    "Ex3": ({0: 16}, 32),
    "Ex4": ({0: 16, 1: 4}, 32),
}


def _randn(shape) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(tuple(shape), dtype=np.float32)


def _run(plan, g, x):
    return ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_minakova_examples_run_by_parts(example):
    g = tightfit.load("minakova5")
    phases, source = EXAMPLES[example]
    p = plan_parts(PlannedModel(g, "minakova5"), phases, source)
    check_plan(p, [g])
    x = _randn((1, 1, 32, 32))
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


def test_ex4_buffers_hold_the_papers_windows():
    """Ex4: b12 = 17 rows x 32, b23 = 6 rows x 16 x 4, b34 = 48, b45 = 2: 978 elements in all."""
    g = tightfit.load("minakova5")
    p = plan_parts(PlannedModel(g, "minakova5"), *EXAMPLES["Ex4"])
    assert [b.nbytes // 4 for b in p.buffers] == [544, 384, 48, 2]
    assert sum(b.nbytes // 4 for b in p.buffers) == 978


@pytest.mark.parametrize("name", ["mobilenet_v1_025", "squeezenet1_0", "resnet18"])
def test_max_phases_run_and_shrink_the_arena(name):
    g = tightfit.load(name)
    p = plan_parts(PlannedModel(g, name), max_phases(g), g.shape(g.inputs[0])[2])
    rep = check_plan(p, [g])
    whole = check_plan(plan_reuse(PlannedModel(g, name)), [g])
    assert rep.arena_bytes < whole.arena_bytes
    x = _randn(g.shape(g.inputs[0]))
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_rows_per_phase(rows):
    g = tightfit.load("mobilenet_v1_025")
    phases, source = phases_for_rows(g, rows)
    p = plan_parts(PlannedModel(g, "m"), phases, source, options=PartsOptions(slack_rows=rows % 2))
    check_plan(p, [g])
    x = _randn(g.shape(g.inputs[0]))
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


def test_cli_parts_and_bad_phases(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "minakova5", "--method", "parts", "--phases", "0=16,1=4", "--out", str(out)]) == 0
    assert main(["run", str(out), "--verify"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["plan", "minakova5", "--method", "parts", "--phases", "0=16,1=4", "--hold", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["knobs"]["held"] == [0]
    # No phases given: one row per phase everywhere, the paper's setting.
    assert main(["plan", "minakova5", "--method", "parts", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["knobs"]["phases"] == {str(k): v for k, v in max_phases(tightfit.load("minakova5")).items()}
    for argv in (["plan", "minakova5", "--method", "parts", "--phases", "2=4"],
                 ["plan", "minakova5", "--method", "parts", "--phases", "nosuch=2"],
                 ["plan", "minakova5", "--rows", "2"],
                 ["plan", "minakova5", "--method", "parts", "--phases", "0=16", "--hold", "nosuch"],
                 ["plan", "minakova5", "--hold", "1"],
                 ["plan", "minakova5", "--method", "parts", "--budget", "5kB", "--hold", "1"],
                 ["csdf", "minakova5", "--phases", "0=99"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tightfit: error:")


def test_row_source_input_and_measured_peak(tmp_path):
    """The input arrives as row bands; the measured run agrees with the analysed arena."""
    from tightfit.plan import schema
    from tightfit.runtime.executor import RowSource
    from tightfit.runtime.measure import measure_subprocess

    g = tightfit.load("squeezenet1_0")
    phases, source = phases_for_rows(g, 4)
    p = plan_parts(PlannedModel(g, "squeezenet1_0"), phases, source)
    rep = check_plan(p, [g])
    src = RowSource.seeded(g.shape(g.inputs[0]), 3)
    out = ArenaExecutor(p, [g], fill_nan=True).run(src)[0][g.outputs[0]]
    assert compare(out, run_reference(g, src.whole())[g.outputs[0]]).ok
    path = tmp_path / "p.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(m.run_bytes - rep.peak_bytes) <= 0.10 * rep.peak_bytes + 2**20, (m.run_bytes, rep.peak_bytes)


def test_aligned_rows_hold_one_band_plus_halo():
    """Aligned rows per phase: every layer's rows sum to its height, the input arrives in equal
    bands, outputs equal the reference, and the first layer's window holds one band plus the
    halo where equal parts hold two bands."""
    from tightfit.analysis.csdf import split_rows
    from tightfit.graph.ir import spatial
    from tightfit.techniques.parts.planner import aligned_rows

    g = tightfit.load("mobilenet_v1_025")
    phases = {l: 8 for l, p in max_phases(g).items() if p >= 8}
    rows, source = aligned_rows(g, phases, 8)
    assert source == split_rows(224, 8)
    for lid, r in rows.items():
        assert len(r) == 8 and sum(r) == spatial(g.shape(g.layers[lid].output))[0] and min(r) >= 1
    model = PlannedModel(g, "m")
    aligned = plan_parts(model, phases, 8, options=PartsOptions(align=True))
    equal = plan_parts(model, phases, 8)
    first = g.layers[0].output  # 3x3 stride-2 conv, 112 rows in 8 bands of 14
    rows_held = [p.buffers[next(s.out.buffer for s in p.steps() if s.out.tensor == first)].shape[2]
                 for p in (aligned, equal)]
    assert rows_held[0] <= 14 + 2 < 2 * 14 <= rows_held[1]
    x = _randn(g.shape(g.inputs[0]))
    assert compare(_run(aligned, g, x), run_reference(g, x)[g.outputs[0]]).ok


@pytest.mark.parametrize("dim", [0, 2, 3])
@pytest.mark.parametrize("shift", [1, 2, 3, -1, -2])
def test_shift_within_a_buffer_without_a_temporary(shift, dim):
    """The library's copy moves samples, rows or columns within one buffer (source and
    destination overlapping) in the order that reads every place before it is overwritten."""
    import numpy as np

    from tightfit.kernels.step_args import Args, View
    from tightfit.kernels import library

    buf = np.arange(12 * 3 * 12 * 12, dtype=np.float32).reshape(12, 3, 12, 12)
    src0, size = (shift, 7) if shift > 0 else (0, 7)
    dst0 = src0 - shift
    strides = tuple(s // 4 for s in buf.strides)
    dims = tuple(size if d == dim else n for d, n in enumerate(buf.shape))
    x = View(src0 * strides[dim], dims, strides)
    y = View(dst0 * strides[dim], dims, strides)
    expected = buf.take(range(src0, src0 + size), axis=dim).copy()
    table = library.StepTable([Args("copy", "tf_copy_args", (x, y))])
    library.library().tf_run(buf.ctypes.data, buf.ctypes.data, buf.ctypes.data, table.address, 1, None, None, 1)
    assert np.array_equal(buf.take(range(dst0, dst0 + size), axis=dim), expected)

