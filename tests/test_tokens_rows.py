"""Rank-3 tokens split by rows (issue 38, point 1): tokens (N, T, C) of an H x W map run
h * W + w, so a band of image rows is a band of tokens. The importer holds the tokenwise layers
(LayerNorm, Linear over tokens, GELU, Add) as (N, 1, T, C), rank 4 with the tokens as rows, and
the map's flatten / transpose to tokens and back take that form: the token layers split by bands
of tokens between convolutions that split by image rows, with the values of onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tightfit.analysis.csdf import needs_whole_input
from tightfit.api import execute
from tightfit.frontend.onnx_import import import_model
from tightfit.plan.check import check_plan
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.parts.planner import phases_for_rows, plan_parts
from tightfit.verify import onnxruntime_outputs

from test_attention import C, H, W, T, _Model, assert_partial_row_refused

TOKENWISE = ("layer_norm", "gemm", "add", "activation")


def token_chain(opset: int) -> onnx.ModelProto:
    """conv -> flatten(2).transpose(1, 2) -> LayerNorm -> Linear -> GELU -> Linear -> + tokens ->
    transpose / reshape back to (N, C, H, W) -> conv."""
    m = _Model(opset, seed=3)
    x = m.node("Relu", [m.node("Conv", ["image", m.weight(C, 3, 3, 3), m.weight(C)], pads=[1, 1, 1, 1])])
    tokens = m.node("Transpose", [m.node("Reshape", [x, m.const([1, C, T], np.int64)])], perm=[0, 2, 1])
    mlp = m.linear(m.gelu(m.linear(m.layer_norm(tokens), C, 2 * C)), 2 * C, C)
    tokens = m.node("Add", [tokens, mlp])
    fmap = m.node("Reshape", [m.node("Transpose", [tokens], perm=[0, 2, 1]), m.const([0, C, H, W], np.int64)])
    out = m.node("Conv", [fmap, m.weight(4, C, 3, 3), m.weight(4)], pads=[1, 1, 1, 1])
    return m.model("image", out)


@pytest.fixture(scope="module", params=[17, 11])
def chain(request):
    model = token_chain(request.param)
    return model, import_model(model, None, f"tokens{request.param}")


def _token_layers(g):
    return [l for l in g.layers if l.op in TOKENWISE]


def test_token_layers_are_rank4_with_the_tokens_as_rows(chain):
    model, g = chain
    layers = _token_layers(g)
    assert [l.op for l in layers] == ["layer_norm", "gemm", "gemm", "add"], [l.op for l in g.layers]
    assert ("gelu",) in layers[1].attrs["act"]  # the GELU fused into the Linear before it
    for l in layers:
        assert g.shape(l.output)[1:3] == (1, T) and not needs_whole_input(g, l), (l.name, g.shape(l.output))
    # the map's flatten and transpose took the rank-4 form: no reshape added between layers
    assert sum(l.op == "reshape" for l in g.layers) == 2, [l.op for l in g.layers]
    x = random_input(g)
    got = run_reference(g, x)[g.outputs[0]]
    want = next(iter(onnxruntime_outputs(model.SerializeToString(), x).values()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_parts_split_the_token_layers_by_rows(chain):
    """Parts at one row per phase computes every token layer in T steps of one token each,
    matches the reference, and holds less than the plan that runs them whole; the checker
    refuses a step over part of a token's channels of the layer norm."""
    _, g = chain
    model = PlannedModel(g, "tokens")
    phases, source = phases_for_rows(g, 1)
    token_ids = {l.id for l in _token_layers(g)}
    assert token_ids <= set(phases), (token_ids, phases)
    split = plan_parts(model, phases, source)
    whole = plan_parts(model, {k: v for k, v in phases.items() if k not in token_ids}, source)
    x = random_input(g)
    want = run_reference(g, x)[g.outputs[0]]
    for plan in (split, whole):
        outs, _ = execute(plan, [g], [x], fill_nan=True)
        np.testing.assert_allclose(outs[0][g.outputs[0]], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
    for lid in token_ids:
        steps = [s for s in split.steps() if s.kind == "compute" and s.layer == lid]
        assert len(steps) == T and all(s.out.region.h == 1 for s in steps), (lid, [s.out.region for s in steps])
    assert check_plan(split, [g]).arena_bytes < check_plan(whole, [g]).arena_bytes
    norm = next(l.id for l in g.layers if l.op == "layer_norm")
    i, step = next((i, s) for i, s in enumerate(split.steps()) if s.kind == "compute" and s.layer == norm)
    assert_partial_row_refused(split, g, i, 0, step.out.region.w - 1)


def tokens_out(opset: int) -> onnx.ModelProto:
    """conv -> tokens -> LayerNorm -> Linear, the tokens (N, T, C) the model's output: the last
    Linear's rank-4 tokens go back to rank 3 through an added Reshape."""
    m = _Model(opset, seed=5)
    x = m.node("Conv", ["image", m.weight(C, 3, 3, 3), m.weight(C)], pads=[1, 1, 1, 1])
    tokens = m.node("Transpose", [m.node("Reshape", [x, m.const([1, C, T], np.int64)])], perm=[0, 2, 1])
    return m.model("image", m.linear(m.layer_norm(tokens), C, C))


@pytest.mark.parametrize("opset", [17, 11])
def test_tokens_as_the_output_and_the_c_program(opset, tmp_path):
    """Tokens that are the model's output keep their rank-3 shape (a Reshape added after the
    rank-4 Linear); the split plan matches onnxruntime, in the executor and as a C program."""
    import shutil

    from tightfit.export import export
    from tightfit.export.build import build, run

    model = tokens_out(opset)
    g = import_model(model, None, "tokens_out")
    assert g.shape(g.outputs[0]) == (1, T, C) and g.layers[-1].op == "reshape"
    assert all(g.shape(l.output)[1:3] == (1, T) for l in g.layers if l.op in ("layer_norm", "gemm"))
    x = random_input(g)
    want = next(iter(onnxruntime_outputs(model.SerializeToString(), x).values()))
    plan = plan_parts(PlannedModel(g, "tokens_out"), *phases_for_rows(g, 1))
    check_plan(plan, [g])
    outs, _ = execute(plan, [g], [x], fill_nan=True)
    np.testing.assert_allclose(outs[0][g.outputs[0]], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    sources = export(plan, [g], tmp_path / "c")
    built = build(tmp_path / "c", sources.name, cflags=["-std=c99", "-O2"])
    ran = run(built.binary, [np.asarray(x)], [want.size], 1, None)
    np.testing.assert_allclose(ran.outputs[0], want.ravel(), rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
