"""Attention blocks and token tensors (issue 38): a small hybrid model (conv trunk, tokens, one
attention block, back to a map, convs) written as exporters write it, at opset 17 and at opset 13
(LayerNormalization spelled as ReduceMean / Sub / Pow / Sqrt / Div, GELU as erf), with the Shape /
Gather / Unsqueeze / Concat chains of a dynamic reshape: it imports into the fused ops, matches
onnxruntime, and parts and tiling split its convolutions and end a group at the block.
The SVTR-style corpus model is checked whole in tests/test_corpus.py (slow)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tightfit.api import execute
from tightfit.frontend.onnx_import import import_model
from tightfit.ops.base import Region
from tightfit.plan.check import check_plan
from tightfit.plan.schema import PlanError
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.parts.planner import plan_parts
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.techniques.tiling.groups import TileGroup
from tightfit.techniques.tiling.planner import plan_tiling
from tightfit.verify import onnxruntime_outputs


def assert_partial_row_refused(plan, g, i: int, w0: int, w1: int) -> None:
    """The checker refuses `plan` with its step i cut to columns [w0, w1) of its rows (a row-banded
    op that needs whole rows: a part of a row would be normalised or multiplied alone)."""
    steps = plan.steps()
    r = steps[i].out.region
    cut = replace(steps[i], out=replace(steps[i].out, region=Region(r.n0, r.n1, r.h0, r.h1, w0, w1)))
    part = plan.partitions[0]  # (step i is in the first partition in these one-partition plans)
    bad = replace(plan, partitions=(replace(part, steps=part.steps[:i] + (cut,) + part.steps[i + 1:]),) + plan.partitions[1:])
    with pytest.raises(PlanError, match="needs whole rows"):
        check_plan(bad, [g])


C, H, W, HEADS = 8, 4, 6, 2
T = H * W


class _Model:
    """Nodes and weights of an ONNX graph, written node by node."""

    def __init__(self, opset: int, seed: int = 0) -> None:
        self.opset, self.nodes, self.inits, self.rng, self.count = opset, [], {}, np.random.default_rng(seed), 0

    def const(self, value, dtype=np.float32) -> str:
        name = f"k{len(self.inits)}"
        self.inits[name] = np.asarray(value, dtype)
        return name

    def weight(self, *shape: int) -> str:
        return self.const(self.rng.standard_normal(shape) / np.sqrt(shape[0] if len(shape) == 2 else np.prod(shape[1:])))

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"/{op}_{self.count}", **attrs))
        return out

    def linear(self, x: str, cin: int, cout: int) -> str:
        return self.node("Add", [self.node("MatMul", [x, self.weight(cin, cout)]), self.weight(cout)])

    def layer_norm(self, x: str) -> str:
        scale, bias = self.const(1 + 0.1 * self.rng.standard_normal(C)), self.weight(C)
        if self.opset >= 17:
            return self.node("LayerNormalization", [x, scale, bias], axis=-1, epsilon=1e-6)
        axes = {"axes": [-1]}
        mean = self.node("ReduceMean", [x], **axes)
        d = self.node("Sub", [x, mean])
        var = self.node("ReduceMean", [self.node("Pow", [d, self.const(2.0)])], **axes)
        norm = self.node("Div", [d, self.node("Sqrt", [self.node("Add", [var, self.const(1e-6)])])])
        return self.node("Add", [self.node("Mul", [norm, scale]), bias])

    def gelu(self, x: str) -> str:
        if self.opset >= 20:
            return self.node("Gelu", [x])
        erf = self.node("Erf", [self.node("Div", [x, self.const(np.sqrt(2.0))])])
        return self.node("Mul", [self.node("Mul", [x, self.node("Add", [erf, self.const(1.0)])]), self.const(0.5)])

    def dynamic_shape(self, x: str, dims: list[int]) -> str:
        """[N of x, *dims] as exporters compute a reshape target: Shape, Gather, Unsqueeze, Concat."""
        batch = self.node("Gather", [self.node("Shape", [x]), self.const(0, np.int64)], axis=0)
        first = self.node("Unsqueeze", [batch, self.const([0], np.int64)]) if self.opset >= 13 else \
            self.node("Unsqueeze", [batch], axes=[0])
        return self.node("Concat", [first, self.const(dims, np.int64)], axis=0)

    def expand_over_batch(self, w: str, x: str) -> str:
        """`w.expand(x.shape[0], -1, -1)` as torch writes it: the -1s replaced by ones through
        Equal and Where, ConstantOfShape making the ones, then Expand (all folded at import)."""
        target = self.dynamic_shape(x, [-1, -1])
        ones = self.node("ConstantOfShape", [self.const([3], np.int64)],
                         value=numpy_helper.from_array(np.ones(1, np.int64)))
        fixed = self.node("Where", [self.node("Equal", [target, self.const(-1, np.int64)]), ones, target])
        return self.node("Expand", [w, fixed])

    def model(self, x: str, out: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "hybrid", [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 3, H, W])],
                                  [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model


def hybrid(opset: int) -> onnx.ModelProto:
    """conv -> tokens (N, T, C) -> LayerNorm -> qkv -> q k^T / sqrt d -> softmax -> @ v -> proj ->
    residual -> LayerNorm -> MLP (GELU) -> residual -> back to (N, C, H, W) -> conv -> ReduceL2 over C."""
    m = _Model(opset)
    x = m.node("Relu", [m.node("Conv", ["image", m.weight(C, 3, 3, 3), m.weight(C)], pads=[1, 1, 1, 1])])
    tokens = m.node("Transpose", [m.node("Reshape", [x, m.dynamic_shape(x, [C, T])])], perm=[0, 2, 1])
    qkv = m.linear(m.layer_norm(tokens), C, 3 * C)
    qkv = m.node("Transpose", [m.node("Reshape", [qkv, m.dynamic_shape(qkv, [T, 3, HEADS, C // HEADS])])],
                 perm=[2, 0, 3, 1, 4])
    q, k, v = (m.node("Gather", [qkv, m.const(i, np.int64)], axis=0) for i in range(3))
    scores = m.node("Mul", [m.node("MatMul", [q, m.node("Transpose", [k], perm=[0, 1, 3, 2])]),
                            m.const((C // HEADS) ** -0.5)])
    attn = m.node("MatMul", [m.node("Softmax", [scores], axis=-1), v])
    merged = m.node("Reshape", [m.node("Transpose", [attn], perm=[0, 2, 1, 3]), m.dynamic_shape(attn, [T, C])])
    tokens = m.node("Add", [tokens, m.linear(merged, C, C)])
    mlp = m.linear(m.gelu(m.linear(m.layer_norm(tokens), C, 2 * C)), 2 * C, C)
    tokens = m.node("Add", [tokens, mlp])
    fmap = m.node("Reshape", [m.node("Transpose", [tokens], perm=[0, 2, 1]), m.const([0, C, H, W], np.int64)])
    y = m.node("Relu", [m.node("Conv", [fmap, m.weight(C, C, 3, 3), m.weight(C)], pads=[1, 1, 1, 1])])
    axes = {"axes": [1]} if opset < 18 else {}
    ins = [y] if opset < 18 else [y, m.const([1], np.int64)]
    out = m.node("ReduceL2", ins, keepdims=1, **axes)
    return m.model("image", out)


@pytest.fixture(scope="module", params=[17, 13])
def imported(request):
    model = hybrid(request.param)
    return model, import_model(model, None, f"hybrid{request.param}")


def test_imports_into_the_fused_ops(imported):
    _, g = imported
    ops = [layer.op for layer in g.layers]
    assert ops.count("layer_norm") == 2 and ops.count("matmul") == 2 and ops.count("softmax_axis") == 1, ops
    assert ops.count("gather") == 3 and "reduce" in ops, ops
    assert not {"eltwise", "channel_reduce"} & set(ops), ops  # the LayerNorm spelling fused, erf GELU an activation
    assert any(("gelu",) in layer.attrs.get("act", ()) for layer in g.layers)
    # Shape / Gather / Unsqueeze / Concat chains of the reshape targets were folded, not run.
    assert all(not n.startswith("/Shape") for layer in g.layers for n in layer.nodes)
    assert g.shape(g.layers[-1].output) == (1, 1, H, W)


def test_matches_onnxruntime(imported):
    model, g = imported
    x = random_input(g)
    got = run_reference(g, x)[g.outputs[0]]
    want = onnxruntime_outputs(model.SerializeToString(), x)
    want = want[g.outputs[0]] if g.outputs[0] in want else next(iter(want.values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_parts_and_tiling_split_the_convolutions_and_run_the_block_whole(imported):
    _, g = imported
    x = random_input(g)
    want = run_reference(g, x)[g.outputs[0]]
    model = PlannedModel(g, "hybrid")
    reuse = check_plan(plan_reuse(model, "improve"), [g])
    assert reuse.arena_bytes == reuse.lower_bound
    conv_in, conv_out = 0, next(l.id for l in g.layers if l.op == "conv" and l.id > 0)
    whole = [l.id for l in g.layers if l.op in ("matmul", "softmax_axis", "layer_norm", "gather")]
    parts = plan_parts(model, {conv_in: H, conv_out: H})
    tiled = plan_tiling(model, [TileGroup(0, 0, (2, 2)), TileGroup(conv_out, conv_out, (2, 2))])
    for plan in (parts, tiled):
        check_plan(plan, [g])
        outs, _ = execute(plan, [g], [x], fill_nan=True)
        np.testing.assert_allclose(outs[0][g.outputs[0]], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        for s in plan.steps():
            if s.kind == "compute" and s.layer in whole:  # a whole step: every row of every sample
                assert (s.out.region.h, s.out.region.w) == (1, 1) or s.out.region.h == g.shape(s.out.tensor)[2]
    rows = {s.out.region.h for s in parts.steps() if s.kind == "compute" and s.layer == conv_out}
    assert rows == {1}, rows  # the conv after the block still runs by rows


def test_attention_splits_by_bands_of_query_tokens(imported):
    """The row axis of rank-4 attention tensors: the scores (N, heads, T, T) and the weighted
    values (N, heads, T, d) have the query tokens as rows, so q k^T, the softmax over the keys
    and the product with v run by bands of query rows (k and v whole): parts at one row per
    phase computes them in T steps each, holds less than the plan that runs them whole, and
    matches it. Tiling cuts columns, which these ops cannot: no tileable group holds one."""
    from tightfit.analysis.csdf import needs_whole_input
    from tightfit.techniques.parts.planner import phases_for_rows
    from tightfit.techniques.tiling.groups import tileable

    _, g = imported
    banded = [l for l in g.layers if l.op in ("matmul", "softmax_axis")]
    assert banded and all(len(g.shape(l.output)) == 4 and not needs_whole_input(g, l) for l in banded)
    assert not any(tileable(g, l.id) for l in banded)
    model = PlannedModel(g, "hybrid")
    phases, source = phases_for_rows(g, 1)
    split = plan_parts(model, phases, source)
    whole = plan_parts(model, {k: v for k, v in phases.items() if k not in {l.id for l in banded}}, source)
    x = random_input(g)
    want = run_reference(g, x)[g.outputs[0]]
    for plan in (split, whole):
        outs, _ = execute(plan, [g], [x], fill_nan=True)
        np.testing.assert_allclose(outs[0][g.outputs[0]], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    for l in banded:
        steps = [s for s in split.steps() if s.kind == "compute" and s.layer == l.id]
        assert len(steps) == g.shape(l.output)[2] and all(s.out.region.h == 1 and s.out.region.w == g.shape(l.output)[3] for s in steps)
    assert check_plan(split, [g]).arena_bytes < check_plan(whole, [g]).arena_bytes


def test_what_the_whole_steps_cost_a_split_plan(imported):
    """analysis.memory.whole_step_peaks: the steps are told apart by whether a tensor of a whole
    step is live; the busier of the two is the plan's peak of live bytes and scratch, and running
    the attention whole costs the blocks more than running it by bands of query tokens."""
    from tightfit.analysis.csdf import needs_whole_input
    from tightfit.analysis.memory import whole_step_peaks
    from tightfit.plan.lifetimes import lifetimes
    from tightfit.techniques.parts.planner import phases_for_rows

    _, g = imported
    model = PlannedModel(g, "hybrid")
    phases, source = phases_for_rows(g, 1)
    banded = {l.id for l in g.layers if l.op in ("matmul", "softmax_axis")}
    split = plan_parts(model, phases, source)
    whole = plan_parts(model, {k: v for k, v in phases.items() if k not in banded}, source)
    for plan in (split, whole):
        peaks = whole_step_peaks(plan, [g])
        life = lifetimes(plan, [g], conflicts=False)
        assert max(peaks.blocks, peaks.split) == max(n + k for n, k in zip(life.live_bytes(), life.step_scratch))
        assert peaks.whole_steps == sum(s.kind == "compute" and needs_whole_input(g, g.layers[s.layer]) for s in plan.steps())
        assert 0 < peaks.split and 0 < peaks.blocks
    assert whole_step_peaks(split, [g]).blocks < whole_step_peaks(whole, [g]).blocks


def test_a_band_of_rows_of_an_op_that_needs_whole_rows_is_refused(imported):
    """The checker refuses a step of a row-banded op over part of the columns (its kernel works
    along the last axis: a part of it would be normalised or multiplied alone)."""
    from tightfit.techniques.parts.planner import phases_for_rows

    _, g = imported
    plan = plan_parts(PlannedModel(g, "hybrid"), *phases_for_rows(g, 1))
    soft = next(l.id for l in g.layers if l.op == "softmax_axis")
    i, step = next((i, s) for i, s in enumerate(plan.steps()) if s.kind == "compute" and s.layer == soft)
    assert_partial_row_refused(plan, g, i, 0, step.out.region.w - 1)


def test_the_exported_c_program_runs_a_split_plan(imported, tmp_path):
    """The split plan as a C program (the same kernels: matmul, reduce, softmax and norms over
    permuted views, gathers as copies), built and run: its output is the reference's."""
    import shutil

    from tightfit.export import export
    from tightfit.export.build import build, run

    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    _, g = imported
    conv_out = next(l.id for l in g.layers if l.op == "conv" and l.id > 0)
    plan = plan_parts(PlannedModel(g, "hybrid"), {0: H, conv_out: H})
    x = random_input(g)
    want = np.asarray(run_reference(g, x)[g.outputs[0]])
    sources = export(plan, [g], tmp_path / "c")
    built = build(tmp_path / "c", sources.name, cflags=["-std=c99", "-O2"])
    ran = run(built.binary, [np.asarray(x)], [want.size], 1, None)
    np.testing.assert_allclose(ran.outputs[0], want.ravel(), rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_operands_above_rank_4_that_do_not_merge_are_one_clear_error():
    """Rank-5 data runs as 4-dim views of merged dims; operands broadcast in 5 separate dims do
    not fit one and are refused at import, naming the node."""
    from tightfit.errors import TightfitError

    shape, other = [1, 2, 2, 2, 2], [1, 1, 2, 1, 2]
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["x5"]),
             helper.make_node("Add", ["x5", "k"], ["y"], name="/scores/Add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(other, np.float32), "k"),
                               numpy_helper.from_array(np.array(shape, np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(TightfitError) as err:
        import_model(model, None, "bad")
    assert "/scores/Add" in str(err.value) and "more than 4 separate dims" in str(err.value), str(err.value)


@pytest.mark.parametrize("opset", [17, 13, 10])
@pytest.mark.parametrize("place", ["first", "last"])
def test_a_class_token_concatenated_to_the_tokens(opset, place):
    """ViT's class token: a constant (after its Expand over the batch is folded) concatenated
    before (or after) the patch tokens, then the position embedding and the class token's row
    taken out (Gather). Imported as a Pad of the tokens plus the constant: onnxruntime's values."""
    m = _Model(opset, seed=1)
    x = m.node("Relu", [m.node("Conv", ["image", m.weight(C, 3, 1, 1)])])
    tokens = m.node("Transpose", [m.node("Reshape", [x, m.const([0, C, T], np.int64)])], perm=[0, 2, 1])
    cls = m.expand_over_batch(m.weight(1, 1, C), tokens)
    joined = m.node("Concat", [cls, tokens] if place == "first" else [tokens, cls], axis=1)
    y = m.node("Add", [joined, m.weight(1, T + 1, C)])
    out = m.node("Gather", [m.layer_norm(y) if opset >= 17 else y, m.const(0 if place == "first" else T, np.int64)], axis=1)
    model = m.model("image", out)
    g = import_model(model, None, "cls")
    assert "pad" in [layer.op for layer in g.layers]
    folded = ("Shape", "ConstantOfShape", "Equal", "Where", "Expand")  # computed at import from shapes
    assert not [n for layer in g.layers for n in layer.nodes if n.lstrip("/").split("_")[0] in folded]
    x0 = random_input(g)
    got = run_reference(g, x0)[g.outputs[0]]
    want = next(iter(onnxruntime_outputs(model.SerializeToString(), x0).values()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def window_block(opset: int, cosine: bool) -> onnx.ModelProto:
    """A Swin-style block as torchvision writes it: the map channels-last, cut into w x w windows
    that join the batch (Reshape to (-1, w * w, C)), attention per window with a relative position
    bias (and, with `cosine`, q and k normalized as Swin v2 does: ReduceL2, Clip, Expand, Div), the
    windows put back (Reshape to (1, H / w, W / w, w, w, C)), then a conv."""
    m, w, heads = _Model(opset, seed=2), 2, HEADS
    d = C // heads
    x = m.node("Relu", [m.node("Conv", ["image", m.weight(C, 3, 1, 1)])])
    x = m.node("Transpose", [x], perm=[0, 2, 3, 1])
    x = m.node("Reshape", [x, m.const([1, H // w, w, W // w, w, C], np.int64)])
    win = m.node("Reshape", [m.node("Transpose", [x], perm=[0, 1, 3, 2, 4, 5]), m.const([-1, w * w, C], np.int64)])
    qkv = m.linear(m.layer_norm(win), C, 3 * C)
    qkv = m.node("Transpose", [m.node("Reshape", [qkv, m.const([-1, w * w, 3, heads, d], np.int64)])], perm=[2, 0, 3, 1, 4])
    q, k, v = (m.node("Gather", [qkv, m.const(i, np.int64)], axis=0) for i in range(3))
    if cosine:
        def normalize(t: str) -> str:
            norm = m.node("Clip", [m.node("ReduceL2", [t], axes=[-1], keepdims=1), m.const(1e-12)])
            return m.node("Div", [t, m.node("Expand", [norm, m.node("Shape", [t])])])
        q, k = normalize(q), normalize(k)
    scores = m.node("Add", [m.node("MatMul", [q, m.node("Transpose", [k], perm=[0, 1, 3, 2])]), m.weight(heads, w * w, w * w)])
    attn = m.node("MatMul", [m.node("Softmax", [scores], axis=-1), v])
    merged = m.node("Reshape", [m.node("Transpose", [attn], perm=[0, 2, 1, 3]), m.const([-1, w * w, C], np.int64)])
    y = m.node("Add", [win, m.linear(merged, C, C)])
    y = m.node("Reshape", [y, m.const([1, H // w, W // w, w, w, C], np.int64)])
    y = m.node("Reshape", [m.node("Transpose", [y], perm=[0, 1, 3, 2, 4, 5]), m.const([1, H, W, C], np.int64)])
    y = m.node("Transpose", [y], perm=[0, 3, 1, 2])
    out = m.node("Relu", [m.node("Conv", [y, m.weight(C, C, 3, 3), m.weight(C)], pads=[1, 1, 1, 1])])
    return m.model("image", out)


@pytest.mark.parametrize("cosine", [False, True])
def test_windows_joined_to_the_batch_are_held_beside_it(cosine):
    """Swin's window partition folds the windows into the batch; the importer holds them as a dim
    of their own (the batch stays free), and the block matches onnxruntime, whole and by parts."""
    model = window_block(17, cosine)
    g = import_model(model, None, "windows")
    assert any(len(g.shape(t)) == 5 for t in g.tensors), "the windows' qkv held as (N, windows, T, C) ..."
    x = random_input(g)
    want = next(iter(onnxruntime_outputs(model.SerializeToString(), x).values()))
    got = run_reference(g, x)[g.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
    last = len(g.layers) - 1
    plan = plan_parts(PlannedModel(g, "windows"), {0: H, last: H})
    check_plan(plan, [g])
    outs, _ = execute(plan, [g], [x], fill_nan=True)
    np.testing.assert_allclose(outs[0][g.outputs[0]], got, rtol=1e-5, atol=1e-5 * float(np.abs(got).max()))


PIXELS, TOKENS = 4, 32  # MobileViT: 2x2 patch pixels, each attending over its own tokens


def patch_attention(opset: int) -> onnx.ModelProto:
    """MobileViT's attention as cvnets exports it: tokens (N, patch pixels, T, C) -> qkv ->
    (N, P, T, 3, heads, d) -> Transpose (0, 1, 4, 3, 2, 5) -> q, k, v of rank 5 (N, P, heads, T, d),
    q scaled, softmax(q k^T) v of rank 5, back to (N, P, T, C); a 1x1 conv over the patch pixels
    after it (tokens as rows)."""
    m = _Model(opset, seed=3)
    qkv = m.node("MatMul", ["tokens", m.weight(C, 3 * C)])
    qkv = m.node("Transpose", [m.node("Reshape", [qkv, m.const([1, PIXELS, TOKENS, 3, HEADS, C // HEADS], np.int64)])],
                 perm=[0, 1, 4, 3, 2, 5])
    q, k, v = (m.node("Gather", [qkv, m.const(i, np.int64)], axis=3) for i in range(3))
    q = m.node("Mul", [q, m.const((C // HEADS) ** -0.5)])
    attn = m.node("Softmax", [m.node("MatMul", [q, m.node("Transpose", [k], perm=[0, 1, 2, 4, 3])])], axis=-1)
    y = m.node("Reshape", [m.node("Transpose", [m.node("MatMul", [attn, v])], perm=[0, 1, 3, 2, 4]),
                           m.const([1, PIXELS, TOKENS, C], np.int64)])
    out = m.node("Conv", [y, m.weight(PIXELS, PIXELS, 1, 1), m.weight(PIXELS)])
    graph = helper.make_graph(m.nodes, "patches", [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [1, PIXELS, TOKENS, C])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(val, key) for key, val in m.inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [17, 11])
def test_rank5_attention_of_patch_pixels_splits_by_bands_of_query_tokens(opset):
    """MobileViT's scores are rank 5 (N, patch pixels, heads, T, T): the importer runs both
    matmuls and the softmax on rank 4, patch pixels and heads merged (batch dims of both
    matmuls), so they split by bands of query tokens as rank-4 attention does. The import
    matches onnxruntime; parts at one row per phase computes the scores one query row per step
    (every key), holds less than the plan that runs them whole, and matches the reference; the
    checker refuses a step over part of a row of the scores."""
    from tightfit.analysis.csdf import needs_whole_input
    from tightfit.techniques.parts.planner import phases_for_rows

    model = patch_attention(opset)
    g = import_model(model, None, "patches")
    banded = [l for l in g.layers if l.op in ("matmul", "softmax_axis")]
    assert len(banded) == 3
    assert all(g.shape(l.output)[1:3] == (PIXELS * HEADS, TOKENS) and not needs_whole_input(g, l) for l in banded)
    x = random_input(g)
    want = run_reference(g, x)[g.outputs[0]]
    ort = next(iter(onnxruntime_outputs(model.SerializeToString(), x).values()))
    np.testing.assert_allclose(want, ort, rtol=1e-4, atol=1e-5 * float(np.abs(ort).max()))
    phases, source = phases_for_rows(g, 1)
    split = plan_parts(PlannedModel(g, "patches"), phases, source)
    whole = plan_parts(PlannedModel(g, "patches"), {k: v for k, v in phases.items() if k not in {l.id for l in banded}}, source)
    for plan in (split, whole):
        outs, _ = execute(plan, [g], [x], fill_nan=True)
        np.testing.assert_allclose(outs[0][g.outputs[0]], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    scores = banded[0]
    steps = [(i, s) for i, s in enumerate(split.steps()) if s.kind == "compute" and s.layer == scores.id]
    assert len(steps) == TOKENS and all(s.out.region.h == 1 and s.out.region.w == TOKENS for _, s in steps)
    assert check_plan(split, [g]).arena_bytes < check_plan(whole, [g]).arena_bytes
    i, step = steps[1]
    assert_partial_row_refused(split, g, i, 1, step.out.region.w)
