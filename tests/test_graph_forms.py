"""Graph and file forms of real ONNX files (issue 22): outputs behind Identity nodes keep the
model's names; weights in Constant nodes count as parameters; a dynamic batch alone defaults to
1; a leading Transpose from NHWC (shape hints in NHWC); several outputs; external data;
old opsets. Each is checked through the CLI and against onnxruntime. (Several outputs, old and
new opsets and a rank-5 head, as torch exports them: test_graph_forms_torch.py.)"""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tightfit.cli import main
from tightfit.frontend.onnx_import import load_onnx

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RNG = np.random.default_rng(7)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype(np.float32)


def _model(nodes, inits, x_dims, outputs, opset: int = 17, const_nodes=()) -> onnx.ModelProto:
    g = helper.make_graph(list(const_nodes) + nodes, "forms",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_dims)],
                          [helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _two_convs(x: str = "x", out: str = "y") -> list[onnx.NodeProto]:
    return [helper.make_node("Conv", [x, "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
            helper.make_node("Relu", ["c1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2"], [out], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2")]


def _inits() -> dict[str, np.ndarray]:
    return {"w1": _w(8, 3, 3, 3), "b1": _w(8) * 0.1, "w2": _w(6, 8, 3, 3)}


def _save(tmp_path, m: onnx.ModelProto, name: str = "m.onnx") -> str:
    path = tmp_path / name
    onnx.save(m, str(path))
    return str(path)


def _run_json(argv, capsys) -> dict:
    code = main([str(a) for a in argv] + ["--json"])
    out = capsys.readouterr()
    assert code == 0, (argv, out.out, out.err)
    return json.loads(out.out)


def _plan_and_verify(path: str, tmp_path, capsys, extra=()) -> None:
    """Reuse, parts and tiling plans of the model, run and compared with the reference executor."""
    for i, method in enumerate((["--method", "reuse"], ["--method", "parts", "--rows", "2"], ["--method", "tiling", "--tiling", "0-1:2x2"])):
        plan = tmp_path / f"plan{i}.json"
        assert main(["plan", path, *method, *extra, "--out", str(plan)]) == 0, capsys.readouterr()
        capsys.readouterr()
        report = _run_json(["run", plan, "--verify"], capsys)
        assert report["verify"]["ok"], report


def test_trailing_identity_keeps_the_output_name(tmp_path, capsys):
    nodes = _two_convs(out="y") + [helper.make_node("Identity", ["y"], ["y1"]), helper.make_node("Identity", ["y1"], ["logits"])]
    path = _save(tmp_path, _model(nodes, _inits(), [1, 3, 16, 16], ["logits"]))
    g = load_onnx(path)
    assert g.outputs == ("logits",) and g.layers[-1].output == "logits"
    report = _run_json(["run", path, "--verify"], capsys)
    assert report["verify"]["ok"] and list(report["outputs"]) == ["logits"], report
    _plan_and_verify(path, tmp_path, capsys)


def test_identity_of_another_output_stays_a_second_output(tmp_path, capsys):
    nodes = _two_convs(out="y") + [helper.make_node("Identity", ["y"], ["y_copy"])]
    path = _save(tmp_path, _model(nodes, _inits(), [1, 3, 16, 16], ["y", "y_copy"]))
    g = load_onnx(path)
    assert g.outputs == ("y", "y")  # one tensor, listed for both outputs
    assert _run_json(["run", path, "--verify"], capsys)["verify"]["ok"]


def test_weights_in_constant_nodes_are_parameters(tmp_path, capsys):
    inits = _inits()
    consts = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(v, k)) for k, v in inits.items()]
    path = _save(tmp_path, _model(_two_convs(), {}, [1, 3, 16, 16], ["y"], const_nodes=consts))
    g = load_onnx(path)
    assert g.original_param_count == sum(v.size for v in inits.values()) == g.param_count
    report = _run_json(["inspect", path], capsys)
    assert report["totals"]["original_param_bytes"] == 4 * g.original_param_count, report
    assert _run_json(["run", path, "--verify"], capsys)["verify"]["ok"]


def test_a_dynamic_batch_alone_defaults_to_one(tmp_path, capsys):
    path = _save(tmp_path, _model(_two_convs(), _inits(), ["batch", 3, 16, 16], ["y"]))
    assert main(["run", path, "--verify"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dynamic batch" in err[0] and "batch 1" in err[0], err
    assert load_onnx(path).shape("x") == (1, 3, 16, 16)
    assert load_onnx(path, (2, 3, 16, 16)).shape("x") == (2, 3, 16, 16)
    # Other dynamic dimensions still need a shape, suggested in the input's own layout.
    path = _save(tmp_path, _model(_two_convs(), _inits(), ["batch", 3, "h", "w"], ["y"]), "hw.onnx")
    assert main(["inspect", path]) == 2
    assert "1x3x224x224" in capsys.readouterr().err


def _nhwc_model(dims) -> onnx.ModelProto:
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=[0, 3, 1, 2])] + _two_convs(x="x_nchw")
    return _model(nodes, _inits(), dims, ["y"])


def test_a_leading_transpose_from_nhwc(tmp_path, capsys):
    """The graph's input is the NCHW tensor (so the first conv splits by rows); the file's own
    NHWC input is what onnxruntime gets, and shape hints are NHWC."""
    path = _save(tmp_path, _nhwc_model([1, 16, 16, 3]))
    g = load_onnx(path)
    assert g.inputs == ("x",) and g.shape("x") == (1, 3, 16, 16) and g.layers[0].op == "conv"
    assert g.input_forms == (("x", "nhwc", (1, 16, 16, 3)),)
    assert _run_json(["run", path, "--verify"], capsys)["verify"]["ok"]
    _plan_and_verify(path, tmp_path, capsys)
    dyn = _save(tmp_path, _nhwc_model(["n", "h", "w", 3]), "dyn.onnx")
    assert main(["inspect", dyn]) == 2
    assert "1x224x224x3" in capsys.readouterr().err
    assert load_onnx(dyn, (1, 20, 24, 3)).shape("x") == (1, 3, 20, 24)
    report = _run_json(["run", dyn, "--input-shape", "1x20x24x3", "--verify"], capsys)
    assert report["verify"]["ok"], report


def _three_heads() -> onnx.ModelProto:
    """A detector's shape: a trunk of three stride-2 convs, an upsampled branch concatenated to
    the first, and a 1x1 head at each of three scales (outputs p3, p4, p5)."""
    nodes, inits, x, c = [], {}, "x", 3
    for i in (1, 2, 3):
        inits.update({f"w{i}": _w(8, c, 3, 3), f"b{i}": _w(8) * 0.1})
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4, strides=[2, 2]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        x, c = f"r{i}", 8
    inits["scales"] = np.array([1, 1, 2, 2], np.float32)
    nodes += [helper.make_node("Resize", ["r2", "", "scales"], ["up2"], mode="nearest"),
              helper.make_node("Concat", ["r1", "up2"], ["up"], axis=1)]
    for name, src, cin in (("p3", "up", 16), ("p4", "r2", 8), ("p5", "r3", 8)):
        inits[f"h{name}"] = _w(7, cin, 1, 1)
        nodes.append(helper.make_node("Conv", [src, f"h{name}"], [name]))
    return _model(nodes, inits, [1, 3, 32, 32], ["p3", "p4", "p5"])


def test_several_outputs_as_onnx(tmp_path, capsys):
    """Three outputs keep their names and order through import, run, every technique's plan
    and (where a C compiler is installed) the C export."""
    path = _save(tmp_path, _three_heads(), "heads.onnx")
    assert load_onnx(path).outputs == ("p3", "p4", "p5")
    report = _run_json(["run", path, "--verify"], capsys)
    assert report["verify"]["ok"] and list(report["outputs"]) == ["p3", "p4", "p5"], report
    for i, method in enumerate((["--method", "reuse"], ["--method", "parts", "--rows", "1"],
                                ["--method", "tiling", "--tiling", "0-0:2x2"])):
        plan = tmp_path / f"plan{i}.json"
        assert main(["plan", path, *method, "--out", str(plan)]) == 0, capsys.readouterr()
        capsys.readouterr()
        report = _run_json(["run", plan, "--verify"], capsys)  # a plan's outputs: model:name
        assert report["verify"]["ok"] and list(report["outputs"]) == ["0:p3", "0:p4", "0:p5"], report
    if shutil.which("cc") is not None:  # the C export writes every head, in the model's order
        from tightfit import api
        from tightfit.export import export

        plan_, graphs = api.load_plan(tmp_path / "plan2.json")
        sources = export(plan_, graphs, tmp_path / "c", weights="c")
        assert api.check_export(plan_, graphs, sources, tmp_path / "c", cflags=["-std=c99", "-O2"]).ok


def test_external_data_runs_and_verifies(tmp_path, capsys):
    folder = tmp_path / "ext"
    folder.mkdir()
    onnx.save(_model(_two_convs(), _inits(), [1, 3, 16, 16], ["y"]), str(folder / "m.onnx"),
              save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert (folder / "weights.bin").stat().st_size > 0
    assert _run_json(["run", folder / "m.onnx", "--verify"], capsys)["verify"]["ok"]


@pytest.mark.parametrize("form", ["identity", "chw", "flat"])
def test_reshapes_and_identity_at_the_input(form, tmp_path, capsys):
    """An Identity, an Unsqueeze of a CHW image or a Reshape of a flat one: the graph's input is
    the NCHW tensor they make, under the model's input name; onnxruntime gets the file's form."""
    if form == "identity":
        dims, head = [1, 3, 16, 16], [helper.make_node("Identity", ["x"], ["x4"])]
        inits = {}
    elif form == "chw":
        dims, head = [3, 16, 16], [helper.make_node("Unsqueeze", ["x", "axes"], ["x4"])]
        inits = {"axes": np.asarray([0], np.int64)}
    else:
        dims = [1, 3 * 16 * 16]
        head = [helper.make_node("Reshape", ["x", "s"], ["x3"]), helper.make_node("Reshape", ["x3", "s4"], ["x4"])]
        inits = {"s": np.asarray([3, 16, 16], np.int64), "s4": np.asarray([1, 3, 16, 16], np.int64)}
    path = _save(tmp_path, _model(head + _two_convs(x="x4"), {**_inits(), **inits}, dims, ["y"]))
    g = load_onnx(path)
    assert g.inputs == ("x",) and g.shape("x") == (1, 3, 16, 16) and g.layers[0].op == "conv"
    assert _run_json(["run", path, "--verify"], capsys)["verify"]["ok"]
    _plan_and_verify(path, tmp_path, capsys)
