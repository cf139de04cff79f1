"""Repeated steps as loops (kernels/loops.py, tf_run's REPEAT rows): a parts or tiled plan's tables
hold a run of steps repeated over bands or tiles once, with the fields that move; the executor and the
exported program walk the same rows and give the reference's outputs."""
from __future__ import annotations

import ctypes
from dataclasses import replace
import shutil

import numpy as np
import pytest

import tightfit
from tightfit.api import plan_inputs
from tightfit.export import codegen
from tightfit.kernels import loops
from tightfit.kernels.library import STRUCTS
from tightfit.kernels.step_args import Args, Context, View, step_args
from tightfit.reference import run_reference
from tightfit.runtime.executor import ArenaExecutor

# (model, plan, the largest share of its steps its tables keep as rows). mobilenet_v1_025 by parts: its
# layers' firings interleave differently from band to band (five downsamplings), so few runs repeat.
SPLIT = [("minakova5", {"method": "parts", "rows": 1}, 0.5), ("mobilenet_v1_025", {"method": "parts", "rows": 2}, 1.0),
         ("mobilenet_v1_025", {"method": "tiling", "tiling": "0-5:8x8:reuse"}, 0.8)]


def _copy(off: int, h0: int) -> Args:
    return Args("copy", "tf_copy_args", (View(off, (1, 2, 1, 4), (8, 4, 4, 1)), View(100 + h0, (1, 2, 1, 4), (8, 4, 4, 1))))


def _input(h0: int) -> Args:
    return Args("input", "tf_input_args", (View(0, (1, 2, 1, 4), (8, 4, 4, 1)), 0, h0, 0))


def test_a_run_repeated_with_steady_moves_is_one_loop_and_a_change_of_step_ends_it():
    args = [a for r in range(5) for a in (_input(r), _copy(8 * r, 3 * r))] + [_copy(999, 0)]
    layers = [-1] * len(args)
    found = loops.find_loops([loops.flatten(l, a) for l, a in zip(layers, args)])
    assert [(f.first, f.body, f.count) for f in found] == [(0, 2, 5)]
    rows = loops.table_rows(layers, args)
    assert [a.kind for a in rows] == ["repeat", "input", "copy", "copy"] and loops.expand(rows) == len(args)
    body, count, n, deltas = rows[0].fields
    assert (body, count, n) == (2, 5, 3)  # h0 of the input; x.off and y.off of the copy
    moved = {(d.fields[0], int(d.fields[2]), d.fields[3]) for d in deltas.items}
    copy_x = STRUCTS["tf_copy_args"].x.offset
    assert moved == {(0, STRUCTS["tf_input_args"].h0.offset, 1), (1, copy_x, 8), (1, STRUCTS["tf_copy_args"].y.offset, 3)}
    assert deltas.items[0].fields[1] == ctypes.sizeof(STRUCTS["tf_input_args"])
    irregular = args[:4] + [_copy(17, 3)] + args[5:]  # the third copy moves by another amount
    assert all(f.first + f.body * f.count <= 4 or f.first >= 4
               for f in loops.find_loops([loops.flatten(l, a) for l, a in zip(layers, irregular)]))


def test_fields_other_than_integers_must_stay_for_a_loop():
    lrn = [Args("lrn", "tf_lrn_args", (View(r, (1, 1, 1, 1), (1, 1, 1, 1)), View(50 + r, (1, 1, 1, 1), (1, 1, 1, 1)),
                                       3, 1e-4 * (r + 1), 0.75, 1.0)) for r in range(4)]  # alpha (a float) moves
    assert loops.find_loops([loops.flatten(0, a) for a in lrn]) == []
    assert loops.table_rows([0] * 4, lrn) == lrn
    assert len(loops.table_rows([0] * 4, [replace(a, fields=a.fields[:3] + (1e-4,) + a.fields[4:]) for a in lrn])) == 2


def test_sizes_and_offsets_are_the_targets_in_c():
    args = [_copy(8 * r, r) for r in range(3)]
    rows = loops.table_rows([4] * 3, args)
    text = codegen.value_c(rows[0].fields[3])
    assert "sizeof(tf_copy_args)" in text and "offsetof(tf_copy_args, x.off)" in text


@pytest.mark.parametrize("model,kw,share", SPLIT, ids=[f"{m}-{kw['method']}" for m, kw, _ in SPLIT])
def test_split_plans_run_as_loops_with_the_references_outputs(model, kw, share):
    plan, graphs = tightfit.api.plan(model, **kw)
    xs = plan_inputs(graphs, plan)
    ref = run_reference(graphs[0], xs[0])
    ex = ArenaExecutor(plan, graphs, fill_nan=True)
    steps = sum(len(p.steps) for p in plan.partitions)
    rows = sum(part.table.count for part in ex.frames[0])
    assert rows <= steps * share, f"{model} {kw}: {rows} table rows for {steps} steps"
    out = ex.run(xs)[0]
    for t in graphs[0].outputs:
        assert np.array_equal(out[t], np.asarray(ref[t])), t


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_the_exported_program_walks_the_same_loops(tmp_path):
    from tightfit.api import check_export
    from tightfit.export import export

    plan, graphs = tightfit.api.plan("mobilenet_v1_025", method="tiling", tiling="0-5:8x8:reuse")
    sources = export(plan, graphs, tmp_path / "out")
    text = sources.files[f"{sources.name}.c"].decode()
    ctx = Context(plan, graphs, 0)
    rows = loops.table_rows([s.layer for s in plan.partitions[0].steps], [step_args(ctx, s) for s in plan.partitions[0].steps])
    assert text.count("{TF_STEP_REPEAT,") == sum(a.kind == "repeat" for a in rows) > 0
    chk = check_export(plan, graphs, sources, tmp_path / "out", runs=1)
    assert chk.ok, chk.max_abs_diff


def _walked(args: list[Args], threads: int = 1) -> np.ndarray:
    """An arena of 4,000 floats after tf_run walks `args` as a table."""
    from tightfit.kernels import library

    arena = np.arange(4000, dtype=np.float32)
    table = library.StepTable(args)
    status = library.library().tf_run(arena.ctypes.data, arena.ctypes.data, arena.ctypes.data, table.address,
                                      table.count, None, None, threads)
    assert status == 0
    return arena


def test_loops_within_loops_walk_the_same_steps_in_c():
    """Rows of 4 copies moving along the row, the rows moving down (and their copies growing): a
    loop of loops, whose steps tf_run walks as it walks the steps one by one (the same bits)."""
    def copy(x: int, y: int, n: int) -> Args:
        return Args("copy", "tf_copy_args", (View(x, (1, 1, 1, n), (n, n, n, 1)), View(y, (1, 1, 1, n), (n, n, n, 1))))

    args = [copy(7 * c + 100 * r, 2000 + 3 * c + 50 * r, 2 + r) for r in range(5) for c in range(4)]
    rows = loops.table_rows([1] * len(args), args)
    assert [(i, a.fields[:2]) for i, a in enumerate(rows) if a.kind == "repeat"] == [(0, (2, 5)), (1, (1, 4))]
    assert len(rows) == 3 and loops.expand(rows) == len(args)
    plain = _walked(args)
    assert np.array_equal(_walked(rows), plain) and not np.array_equal(plain, np.arange(4000, dtype=np.float32))
    assert np.array_equal(_walked(rows, threads=3), plain)


def test_a_table_nested_deeper_than_the_library_walks_fails_the_run():
    from tightfit.kernels import library

    inner = [Args("copy", "tf_copy_args", (View(0, (1, 1, 1, 1), (1, 1, 1, 1)), View(10, (1, 1, 1, 1), (1, 1, 1, 1))))]
    for _ in range(loops.MAX_DEPTH + 1):
        inner = [Args("repeat", "tf_repeat_args", (len(inner), 2, 0, loops.Array("tf_delta", ())))] + inner
    arena = np.zeros(64, np.float32)
    table = library.StepTable(inner)
    assert library.library().tf_run(arena.ctypes.data, arena.ctypes.data, arena.ctypes.data, table.address,
                                    table.count, None, None, 1) == -1
