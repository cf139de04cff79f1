"""In-place and overlapping buffers (issue 40 point 4): a layer's output laid over its own input's
bytes where its kernel's walk (ops/walks.py) is done reading them first. Plans that do it run
equal to the plain reuse plan (bit-exact for int8, exact for float); the checker refuses an
overlap the walk does not make safe; the planner's position is the best the checker accepts."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from tightfit.frontend.onnx_import import load_onnx
from tightfit.ops.walks import ROWS, kernel_walks
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import block_positions
from tightfit.plan.overlay import ALIGN, cell_bytes
from tightfit.plan.place import place
from tightfit.plan.schema import PlanError
from tightfit.runtime.executor import ArenaExecutor
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse, plan_reuse_overlapping

from int8_models import Builder, quantize

UNSAFE = "writes over the input cells it reads"


def inverted_residuals(shape=(1, 8, 12, 12), seed: int = 0) -> onnx.ModelProto:
    """Two MobileNetV2 blocks: expand + ReLU6, depthwise + ReLU6, project, the residual add; then
    one of stride 2 without the add."""
    b = Builder(shape, seed)
    c = shape[1]
    x = "x"
    e = b.clip(b.conv(x, c, 3 * c, k=1, pad=0), 0.0, 6.0)
    d = b.clip(b.conv(e, 3 * c, 3 * c, groups=3 * c), 0.0, 6.0)
    x = b.node("Add", [b.conv(d, 3 * c, c, k=1, pad=0), x])
    e = b.clip(b.conv(x, c, 3 * c, k=1, pad=0), 0.0, 6.0)
    d = b.clip(b.conv(e, 3 * c, 3 * c, stride=2, groups=3 * c), 0.0, 6.0)
    return b.model(b.conv(d, 3 * c, 2 * c, k=1, pad=0))


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inplace")
    fp32 = folder / "ir.onnx"
    onnx.save(inverted_residuals(), fp32)
    return {"fp32": fp32, "int8": quantize(inverted_residuals(), folder / "ir_int8.onnx")}


def _x(g) -> np.ndarray:
    return np.random.default_rng(3).standard_normal(g.shape(g.inputs[0]), dtype=np.float32)


def _run(plan, g, threads: int = 1) -> np.ndarray:
    return ArenaExecutor(plan, [g], fill_nan=True, threads=threads).run(_x(g))[0][g.outputs[0]].copy()


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_overlapping_plan_runs_equal_and_is_smaller(paths, kind):
    g = load_onnx(paths[kind])
    model = PlannedModel(g, str(paths[kind]))
    plain, over = plan_reuse(model), plan_reuse_overlapping(model)
    check_plan(over, [g])
    assert any(b.overlay for b in over.buffers)
    assert over.arena_bytes < plain.arena_bytes
    whole = _run(plain, g)
    assert np.array_equal(_run(over, g), whole)
    assert np.array_equal(_run(over, g, threads=3), whole)  # a shared step's rows would race: one thread runs it


def _overlaid_steps(plan, g):
    """(step, layer) of the compute steps whose output lies in the block of one of their inputs."""
    pos = block_positions(plan.buffers)
    root = lambda b: pos.get(b, (b, 0))[0]  # noqa: E731
    return [(s, g.layers[s.layer]) for s in plan.steps() if s.kind == "compute"
            and any(root(a.buffer) == root(s.out.buffer) and a.buffer != s.out.buffer for a in s.inputs)]


def test_int8_convolutions_overlap_their_inputs(paths):
    """The in-place depthwise convolution of MCUNet/TinyEngine, and int8 pointwise ones, whose
    kernel walks pixel by pixel."""
    g = load_onnx(paths["int8"])
    over = plan_reuse_overlapping(PlannedModel(g, "x"))
    layers = [l for _, l in _overlaid_steps(over, g)]
    assert layers and all(l.op == "conv" and ROWS in kernel_walks(g, l) for l in layers)


def _moved(plan, g, guest: int, root: int, shift: int):
    """The plan with buffer `guest` laid `shift` bytes from buffer `root` (its block's), placed again."""
    buffers = tuple(replace(b, overlay=(root, shift)) if b.id == guest else b for b in plan.buffers)
    return place(replace(plan, buffers=buffers), [g], "improve")


def test_int8_pointwise_conv_over_its_input_in_several_blocks_of_channels(tmp_path):
    """A 1x1 int8 convolution of more output channels than its kernel takes at a time (64), its output
    laid over its input the least far back the checker accepts: every block of channels of a row
    comes before the next row's ("rows"; a chunk of pixels spanning rows broke it on MobileNetV2)."""
    path = quantize(inverted_residuals((1, 72, 10, 10)), tmp_path / "wide.onnx")
    g = load_onnx(path)
    plain = plan_reuse(PlannedModel(g, str(path)))
    step = next(s for s in plain.steps() if s.kind == "compute" and g.layers[s.layer].attrs.get("groups") == 1
                and g.shape(s.inputs[0].tensor)[1] == 216 and g.shape(g.layers[s.layer].output)[1] == 72)
    host, guest = plain.buffers[step.inputs[0].buffer], plain.buffers[step.out.buffer]
    unit = math.lcm(ALIGN, cell_bytes(host), cell_bytes(guest))
    for k in range(1, 5):
        over = _moved(plain, g, guest.id, host.id, -k * unit)
        try:
            check_plan(over, [g])
            break
        except PlanError:
            continue
    else:
        pytest.fail("the checker accepts no overlay of the output a few cells before its input")
    assert np.array_equal(_run(over, g), _run(plain, g))


def test_checker_refuses_an_output_over_input_rows_still_to_be_read(paths):
    """The depthwise output moved one row later than the planner put it: its first row lands on
    input the second output row still reads."""
    g = load_onnx(paths["int8"])
    over = plan_reuse_overlapping(PlannedModel(g, "x"))
    step, layer = next((s, l) for s, l in _overlaid_steps(over, g) if l.attrs["groups"] > 1)
    guest = over.buffers[step.out.buffer]
    root, shift = guest.overlay
    host = over.buffers[step.inputs[0].buffer]
    row = host.shape[3] * cell_bytes(host)
    bad = _moved(over, g, guest.id, root, shift + math.lcm(row, ALIGN))
    with pytest.raises(PlanError, match=UNSAFE):
        check_plan(bad, [g])


def test_checker_refuses_a_dense_float_conv_over_its_input(paths):
    """fp32 dense convolutions walk all pixels once per pass over output channels: no overlap is
    safe, not even the one the row walk would allow (before this checker, an overlay block let
    the step's output lie on its input unchecked)."""
    g = load_onnx(paths["fp32"])
    plain = plan_reuse(PlannedModel(g, "x"))
    step = next(s for s in plain.steps() if s.kind == "compute" and g.layers[s.layer].attrs.get("groups") == 1
                and g.shape(g.layers[s.layer].output)[1] < g.shape(s.inputs[0].tensor)[1])
    host, guest = step.inputs[0].buffer, step.out.buffer
    out_bytes = plain.buffers[guest].nbytes
    for shift in (0, -out_bytes // plain.buffers[guest].shape[2]):  # exactly over it; one output row before it
        buffers = tuple(replace(b, overlay=(host, shift)) if b.id == guest else b for b in plain.buffers)
        with pytest.raises(PlanError, match=UNSAFE):
            check_plan(place(replace(plain, buffers=buffers), [g], "improve"), [g])


def test_checker_refuses_an_add_a_position_ahead_of_its_operand(paths):
    """An elementwise kernel may write its output over its operand at the same position or
    earlier ones, never later ones (those are still to be read)."""
    g = load_onnx(paths["fp32"])
    plain = plan_reuse(PlannedModel(g, "x"), inplace=False)
    step = next(s for s in plain.steps() if s.kind == "compute" and g.layers[s.layer].op == "add")
    host, guest = step.inputs[0].buffer, step.out.buffer
    cell = cell_bytes(plain.buffers[guest])
    for shift, ok in ((0, True), (-math.lcm(cell, ALIGN), True), (math.lcm(cell, ALIGN), False)):
        buffers = tuple(replace(b, overlay=(host, shift)) if b.id == guest else b for b in plain.buffers)
        moved = place(replace(plain, buffers=buffers), [g], "improve")
        if ok:
            check_plan(moved, [g])
            assert np.array_equal(_run(moved, g), _run(plain, g))
        else:
            with pytest.raises(PlanError, match=UNSAFE):
                check_plan(moved, [g])


def _block_extent(plan, root: int) -> int:
    members = [(b, p) for b, (r, p) in block_positions(plan.buffers).items() if r == root]
    return max(p + plan.buffers[b].nbytes for b, p in members) - min(p for _, p in members)


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_planner_position_is_the_best_the_checker_accepts(paths, kind):
    """Brute force over every aligned position of the depthwise output about its input: the
    planner's block is as small as any the checker accepts."""
    g = load_onnx(paths[kind])
    over = plan_reuse_overlapping(PlannedModel(g, "x"))
    step, _ = next((s, l) for s, l in _overlaid_steps(over, g) if l.attrs["groups"] > 1)
    guest = over.buffers[step.out.buffer]
    root = block_positions(over.buffers)[guest.id][0]
    if root == guest.id:
        pytest.skip("the depthwise output is the block's root")
    found = _block_extent(over, root)
    members = [(b, p) for b, (r, p) in block_positions(over.buffers).items() if r == root and b != guest.id]
    lo, hi = min(p for _, p in members), max(p + over.buffers[b].nbytes for b, p in members)
    step_bytes = math.lcm(ALIGN, cell_bytes(guest))
    best = None
    for shift in range((lo - guest.nbytes) // step_bytes * step_bytes, hi + step_bytes, step_bytes):
        try:
            check_plan(_moved(over, g, guest.id, root, shift), [g])
        except PlanError as e:
            assert UNSAFE in str(e) or "do not hold" in str(e), e
            continue
        extent = max(hi, shift + guest.nbytes) - min(lo, shift)
        best = extent if best is None else min(best, extent)
    assert best == found


def test_threads_leave_an_overlapping_step_to_one_thread(tmp_path):
    """Threads split a float convolution's output rows; over its own input, a later share would
    write rows an earlier share still reads (tf_kernels.c's shared_step runs such a step on one
    thread). A layer large enough that the second thread's first rows land long before the first
    thread reads them."""
    b = Builder((1, 32, 96, 96), 1)
    path = tmp_path / "dw.onnx"
    onnx.save(b.model(b.clip(b.conv("x", 32, 32, groups=32), 0.0, 6.0)), path)
    g = load_onnx(path)
    over = plan_reuse_overlapping(PlannedModel(g, "x"))
    assert _overlaid_steps(over, g)
    whole = _run(plan_reuse(PlannedModel(g, "x")), g)
    for threads in (2, 4):
        assert np.array_equal(_run(over, g, threads), whole)


def test_cli_plans_in_place(paths, tmp_path, capsys):
    """`tightfit plan --inplace` writes a checked plan no larger than without it; with a naive
    planner it is one line and exit 2."""
    from tightfit.cli import main
    from tightfit.files import load_plan

    for extra, name in (([], "plain.json"), (["--inplace"], "over.json")):
        assert main(["plan", str(paths["int8"]), "--out", str(tmp_path / name), *extra]) == 0
    plain, over = (load_plan(tmp_path / n)[0] for n in ("plain.json", "over.json"))
    assert over.arena_bytes < plain.arena_bytes and any(b.overlay for b in over.buffers)
    capsys.readouterr()
    assert main(["plan", str(paths["int8"]), "--inplace", "--planner", "naive"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--inplace" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_live_buffers_share_bytes_only_in_declared_overlays(paths, kind):
    """Two buffers live at one step whose bytes meet are members of one overlay block (the
    declared in-place pairs), never two unrelated buffers."""
    g = load_onnx(paths[kind])
    over = plan_reuse_overlapping(PlannedModel(g, "x"))
    steps = over.steps()
    first, last = {}, {}
    for i, s in enumerate(steps):
        for a in (s.out, *s.inputs):
            first.setdefault(a.buffer, i)
            last[a.buffer] = i
    root = {b.id: block_positions(over.buffers).get(b.id, (b.id, 0))[0] for b in over.buffers}
    declared = 0
    for a in over.buffers:
        for b in over.buffers[a.id + 1:]:
            live = a.id in first and b.id in first and first[a.id] <= last[b.id] and first[b.id] <= last[a.id]
            meet = a.offsets[0] < b.offsets[0] + b.nbytes and b.offsets[0] < a.offsets[0] + a.nbytes
            if live and meet:
                assert root[a.id] == root[b.id], (a, b)
                declared += 1
    assert declared


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_split_plans_in_place_equal_the_unsplit_run(paths, kind):
    """Parts and tiling plans with --inplace pass the checker and give the layer-by-layer run's
    outputs exactly, at no more memory than without it."""
    from tightfit import api

    g = load_onnx(paths[kind])
    whole = _run(plan_reuse(PlannedModel(g, "x")), g)
    last = max(l.id for l in g.layers if len(g.shape(l.output)) == 4)
    for method, kw in (("parts", dict(rows=2)), ("parts", dict(phases="max")), ("tiling", dict(tiling=f"0-{last}:2x2"))):
        plain, _ = api.plan(str(paths[kind]), method=method, **kw)
        over, gs = api.plan(str(paths[kind]), method=method, inplace=True, **kw)
        check_plan(over, gs)
        assert over.arena_bytes <= plain.arena_bytes, (method, kw)
        assert np.array_equal(_run(over, gs[0]), whole), (method, kw)


def test_bench_rows_for_int8_files(paths):
    """bench/inplace.py's `int8_rows` (bench/int8.py's reuse and parts rows): every plan checked,
    in-place never larger, the input left out never larger."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import inplace

    rows = inplace.int8_rows(paths["int8"], tiling=False)
    assert [r.name.endswith("in-place") for r in rows] == [False, True, False, True]
    for plain, over in zip(rows[::2], rows[1::2]):
        assert over.with_input <= plain.with_input and over.without_input <= plain.without_input
    assert all(r.without_input <= r.with_input for r in rows)
    assert rows[1].with_input < rows[0].with_input


def strided_shortcut(shape=(1, 8, 12, 12), seed: int = 0) -> onnx.ModelProto:
    """A ResNet downsampling block: a 3x3 stride-2 conv + ReLU, a 3x3 conv, and the shortcut, a
    1x1 stride-2 conv that never reads the input's odd rows, added."""
    b = Builder(shape, seed)
    c = shape[1]
    y = b.conv(b.node("Relu", [b.conv("x", c, 2 * c, stride=2)]), 2 * c, 2 * c)
    return b.model(b.node("Relu", [b.node("Add", [y, b.conv("x", c, 2 * c, k=1, stride=2, pad=0)])]))


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_in_place_over_rows_a_strided_conv_skips(tmp_path, kind):
    """Rows of an input no window reads (a 1x1 stride-2 conv's odd rows) live through the step."""
    path = tmp_path / f"{kind}.onnx"
    onnx.save(strided_shortcut(), path) if kind == "fp32" else quantize(strided_shortcut(), path)
    g = load_onnx(path)
    model = PlannedModel(g, str(path))
    plain, over = plan_reuse(model), plan_reuse_overlapping(model)
    check_plan(over, [g])
    assert over.arena_bytes <= plain.arena_bytes
    assert np.array_equal(_run(over, g), _run(plain, g))
