"""Models of several inputs and several outputs (issue 38 point 3), on a two-input CNN written as
ONNX here (no PyTorch): a shared-weight tower per view, their difference and concatenation, a
conv decoder and two heads. Each input is placed where the plan puts it, just before its first
reader; every output is read and checked against onnxruntime; reuse, parts and tiling plans,
row sources, plan files, `--input-shape NAME=SHAPE,...` and the C export take every input.
(The corpus's stereo model goes through the same stages in tests/test_corpus.py.)"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tightfit.cli import main
from tightfit.frontend.onnx_import import import_model
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import lifetimes
from tightfit.plan.schema import dumps, plan_from_json
from tightfit.reference import run_reference
from tightfit.runtime.executor import ArenaExecutor, RowSource
from tightfit.runtime.reference import random_input
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.parts.planner import phases_for_rows, plan_parts
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.techniques.tiling import TileGroup, cut_points, plan_tiling
from tightfit.verify import onnxruntime_outputs, verify_with_onnxruntime

H, W = 16, 20


def two_input_model(dynamic_right: bool = False) -> onnx.ModelProto:
    """left, right (1x3xHxW) -> one conv tower with shared weights per view -> [fl, fr, fl - fr]
    -> 3x3 conv -> two heads (1x1 conv; sigmoid of a 3x3 conv)."""
    rng = np.random.default_rng(3)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        return numpy_helper.from_array((rng.standard_normal(shape) * (2.0 / fan_in) ** 0.5).astype(np.float32), name)

    inits = [weight("w0", 8, 3, 3, 3), weight("w1", 8, 8, 3, 3), weight("w2", 8, 24, 3, 3),
             weight("wd", 1, 8, 1, 1), weight("wc", 1, 8, 3, 3)]
    nodes = []
    for view in ("left", "right"):  # the same weights for both views
        nodes += [helper.make_node("Conv", [view, "w0"], [f"{view}0"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
                  helper.make_node("Relu", [f"{view}0"], [f"{view}1"]),
                  helper.make_node("Conv", [f"{view}1", "w1"], [f"{view}2"], kernel_shape=[3, 3], pads=[1] * 4),
                  helper.make_node("Relu", [f"{view}2"], [f"f{view}"])]
    nodes += [helper.make_node("Sub", ["fleft", "fright"], ["diff"]),
              helper.make_node("Concat", ["fleft", "fright", "diff"], ["cost"], axis=1),
              helper.make_node("Conv", ["cost", "w2"], ["dec0"], kernel_shape=[3, 3], pads=[1] * 4),
              helper.make_node("Relu", ["dec0"], ["dec"]),
              helper.make_node("Conv", ["dec", "wd"], ["disparity"], kernel_shape=[1, 1]),
              helper.make_node("Conv", ["dec", "wc"], ["conf0"], kernel_shape=[3, 3], pads=[1] * 4),
              helper.make_node("Sigmoid", ["conf0"], ["confidence"])]
    right = [1, 3, "h", "w"] if dynamic_right else [1, 3, H, W]
    inputs = [helper.make_tensor_value_info("left", TensorProto.FLOAT, [1, 3, H, W]),
              helper.make_tensor_value_info("right", TensorProto.FLOAT, right)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, H // 2, W // 2]) for n in ("disparity", "confidence")]
    model = helper.make_model(helper.make_graph(nodes, "pair", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=not dynamic_right)
    return model


@pytest.fixture(scope="module")
def pair():
    g = import_model(two_input_model(), None, "pair")
    x = random_input(g)
    return g, x, run_reference(g, x)


@pytest.fixture
def pair_file(tmp_path):
    path = tmp_path / "pair.onnx"
    onnx.save(two_input_model(), str(path))
    return path


def test_every_input_and_output_is_imported_and_matches_onnxruntime(pair):
    g, x, want = pair
    assert g.inputs == ("left", "right") and g.outputs == ("disparity", "confidence")
    assert set(x) == {"left", "right"} and not np.array_equal(x["left"], x["right"])  # two draws
    ref = onnxruntime_outputs(two_input_model().SerializeToString(), x)
    for name in g.outputs:
        np.testing.assert_allclose(want[name], ref[name], rtol=0, atol=1e-4 * np.abs(ref[name]).max())


def _input_steps(plan):
    return {s.out.tensor: i for i, s in enumerate(plan.steps()) if s.kind == "input"}


def test_reuse_plan_loads_each_input_before_its_first_reader_and_no_live_buffers_overlap(pair):
    g, x, want = pair
    plan = plan_reuse(PlannedModel(g, "pair"), "improve")
    report = check_plan(plan, [g])
    assert report.arena_bytes == report.lower_bound
    steps = plan.steps()
    where = _input_steps(plan)
    first_reader = {t: min(i for i, s in enumerate(steps) if s.kind == "compute" and t in g.layers[s.layer].inputs)
                    for t in g.inputs}
    assert set(where) == set(g.inputs)
    for t in g.inputs:  # each input arrives just before its first reader, the right view after the left tower
        assert where[t] == first_reader[t] - 1
    assert where["right"] > first_reader["left"]
    # Each input's buffer lives from its input step to its last reader, and no two buffers live at
    # one step share bytes (the checker's rule, stated here for the inputs' lifetimes).
    life = lifetimes(plan, [g])
    offsets = life.arena_offsets(plan)
    by_buffer = {b: r for (b, _), r in zip(life.keys, life.reqs)}
    buffer_of = {s.out.tensor: s.out.buffer for s in steps if s.kind == "input"}
    for t in g.inputs:
        req = by_buffer[buffer_of[t]]
        last = max(i for i, s in enumerate(steps) if any(a.tensor == t for a in s.inputs))
        assert (req.first_use, req.last_use) == (where[t], last)
    for i, (a, ra) in enumerate(zip(offsets, life.reqs)):
        for b, rb in zip(offsets[i + 1:], life.reqs[i + 1:]):
            if ra.first_use <= rb.last_use and rb.first_use <= ra.last_use:
                assert a + ra.size <= b or b + rb.size <= a
    outs = ArenaExecutor(plan, [g], fill_nan=True).run(x)[0]
    for name in g.outputs:
        np.testing.assert_array_equal(outs[name], want[name])


def test_parts_and_tiling_plans_read_both_inputs_rows(pair):
    g, x, want = pair
    model = PlannedModel(g, "pair")
    phases, source = phases_for_rows(g, 2)
    parts = plan_parts(model, phases, source)
    assert sum(1 for s in parts.steps() if s.kind == "input" and s.out.tensor == "right") == source
    assert check_plan(parts, [g]).peak_bytes < check_plan(plan_reuse(model), [g]).peak_bytes
    # The left tower's first two layers may be one group: the right view is not live before its reader.
    assert 0 in cut_points(g) and 1 in cut_points(g)
    tiled = plan_tiling(model, [TileGroup(0, 1, (2, 2))])
    check_plan(tiled, [g])
    for plan in (parts, tiled):
        ex = ArenaExecutor(plan, [g], fill_nan=True)
        for given in (x, {t: RowSource.of(v) for t, v in x.items()},  # whole arrays, and rows delivered by parts
                      {"left": x["left"], "right": RowSource.of(x["right"])}):
            outs = ex.run(given)[0]
            for name in g.outputs:
                np.testing.assert_allclose(outs[name], want[name], rtol=0, atol=1e-5)


def test_the_executor_says_which_input_is_missing(pair):
    g, x, _ = pair
    ex = ArenaExecutor(plan_reuse(PlannedModel(g, "pair")), [g])
    with pytest.raises(ValueError, match="no array for input 'right'"):
        ex.run({"left": x["left"]})
    with pytest.raises(ValueError, match="2 inputs"):
        ex.run([x["left"]])


def test_a_plan_file_names_every_input(pair):
    g, _, _ = pair
    plan = plan_reuse(PlannedModel(g, "pair"))
    assert plan.models[0].inputs == (("left", (1, 3, H, W)), ("right", (1, 3, H, W)))
    again = plan_from_json(json.loads(dumps(plan)))
    assert again == plan and again.models[0].shapes() == {"left": (1, 3, H, W), "right": (1, 3, H, W)}


def test_verify_compares_every_output(pair, pair_file):
    g, x, want = pair
    assert verify_with_onnxruntime(str(pair_file), None, g, x, want).ok
    wrong = dict(want, confidence=want["confidence"] + 0.01)  # the second output off: said
    assert not verify_with_onnxruntime(str(pair_file), None, g, x, wrong).ok


def test_input_shape_by_name_on_the_command_line(pair_file, tmp_path, capsys):
    m = str(pair_file)
    assert main(["run", m, "--verify", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["verify"]["ok"] and list(ran["outputs"]) == ["disparity", "confidence"]
    assert ran["inputs"] == {"left": [1, 3, H, W], "right": [1, 3, H, W]}
    assert main(["run", m, "--input-shape", f"left=2x3x{H}x{W},right=2x3x{H}x{W}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"] == {"left": [2, 3, H, W], "right": [2, 3, H, W]}
    for shape, said in [(f"lft=1x3x{H}x{W}", "'lft', which is not an input of the model (its inputs: left, right)"),
                        (f"1x3x{H}x{W}", "the model has 2 inputs (left, right); give each input's shape by name"),
                        (f"left=1x3x{H}x{W},left=1x3x{H}x{W}", "names input 'left' twice"),
                        ("left=", "write NAME=SHAPE,NAME=SHAPE"),
                        (f"left=1x3x{H}x{W},right=1x3x{H}x9", "conflicts with input 'right' dim 3")]:
        assert main(["inspect", m, "--input-shape", shape]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err


def test_an_input_of_dynamic_shape_left_out_is_said_by_name(tmp_path, capsys):
    path = tmp_path / "dynamic.onnx"
    onnx.save(two_input_model(dynamic_right=True), str(path))
    assert main(["inspect", str(path), "--input-shape", f"left=1x3x{H}x{W}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "input 'right' has a dynamic shape" in err and "right=1x3x" in err and len(err.splitlines()) == 1, err
    assert main(["inspect", str(path), "--input-shape", f"left=1x3x{H}x{W},right=1x3x{H}x{W}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs"]["right"] == [1, 3, H, W]


def test_variable_batch_refuses_several_inputs_in_one_line(pair_file, capsys):
    assert main(["plan", str(pair_file), "--method", "vbs", "--batch", "2", "--budget", "1MB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "take a model of one input; this one has 2 (left, right)" in err and len(err.splitlines()) == 1


def test_c_export_fills_each_input_and_writes_every_output(pair_file, tmp_path, capsys):
    plan_path, out = tmp_path / "parts.json", tmp_path / "c"
    assert main(["plan", str(pair_file), "--method", "parts", "--rows", "2", "--out", str(plan_path)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan_path), "--out", str(out), "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"], report["check"]
    header = (out / "pair.h").read_text()
    assert "#define PAIR_CNN0_INPUTS 2" in header and "#define PAIR_CNN0_OUTPUTS 2" in header
    assert "pair_run_rows" not in header  # one callback streams one input: several take run_cnn's sources


@pytest.mark.parametrize("model, right, wrong", [
    ("minakova5", "input=1x1x32x32", "foo=1x1x32x32"),
    (str(Path(__file__).parent / "data" / "small_int8.tflite"), "serving_default_keras_tensor:0=1x32x32x3",
     "bar=1x32x32x3")])
def test_a_one_input_model_checks_the_name_a_shape_is_given_by(model, right, wrong, capsys):
    assert main(["inspect", model, "--input-shape", right]) == 0
    capsys.readouterr()
    assert main(["inspect", model, "--input-shape", wrong]) == 2
    err = capsys.readouterr().err.strip()
    assert f"names '{wrong.split('=')[0]}', which is not an input of" in err and len(err.splitlines()) == 1, err
