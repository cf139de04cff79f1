"""Validation at the door (issue 23): each bad input the issue lists is one line and exit 2, and
names what is wrong; the native kernels refuse views their weights do not fit."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tightfit.cli import main


def _model(nodes, inits, shape=(1, 3, 8, 8), output: str = "y") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _conv(name="conv", x="x", y="y", w="w", **attrs):
    return helper.make_node("Conv", [x, w], [y], name=name, **attrs)


def _refused(capsys, argv) -> str:
    """The one line a refused command prints (exit status 2)."""
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith("tightfit: error: "), (status, err)
    return err[0]


def _run_model(tmp_path: Path, capsys, model: onnx.ModelProto) -> str:
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return _refused(capsys, ["run", str(path), "--verify"])


W = np.ones((4, 3, 3, 3), np.float32)


@pytest.mark.parametrize("model, words", [
    # the weight's input channels (2) do not match the input's (3): the C kernel read past it
    (_model([_conv(kernel_shape=[3, 3])], {"w": np.ones((4, 2, 3, 3), np.float32)}), ("'conv'", "weight", "3 input channels")),
    (_model([_conv(kernel_shape=[3, 3], group=2)], {"w": W}), ("'conv'", "group 2")),
    (_model([_conv(strides=[0, 1])], {"w": W}), ("'conv'", "strides", ">= 1")),
    (_model([_conv(dilations=[1, -1])], {"w": W}), ("'conv'", "dilations")),
    (_model([_conv()], {"w": np.ones((4, 3, 9, 9), np.float32)}), ("'conv'", "kernel", "spans more than")),
    (_model([_conv(kernel_shape=[2, 2])], {"w": W}), ("'conv'", "weight", "expected (4, 3, 2, 2)")),
    (_model([_conv(x="nowhere")], {"w": W}), ("'conv'", "'nowhere'", "defines")),
    (_model([helper.make_node("Add", ["x", "b"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Relu", ["b"], ["y"], name="out")], {}), ("cycle", "'add'", "'relu'")),
    (_model([helper.make_node("Relu", ["x"], ["y"], name="r1"), helper.make_node("Relu", ["x"], ["y"], name="r2")], {}),
     ("produced twice",)),
    (_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")], {"s": np.array([1, 5, 7], np.int64)}),
     ("'reshape'", "target shape (5, 7)", "192 elements")),
    (_model([helper.make_node("MaxPool", ["x"], ["y"], name="pool", kernel_shape=[9, 9])], {}), ("'pool'", "spans more than")),
    (_model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad")], {"p": np.array([0, 0, -5, 0, 0, 0, -5, 0], np.int64)}),
     ("'pad'", "crop away")),
    (_model([helper.make_node("Gemm", ["f", "w"], ["y"], name="fc", transB=1), helper.make_node("Flatten", ["x"], ["f"], name="flat")],
            {"w": np.ones((2, 100), np.float32)}), ("topological order",)),
    # found by the 10,000-case fuzz: a stride beyond torch's int (an overflow traceback), an
    # empty (absent) input name where the op needs a tensor (a KeyError)
    (_model([helper.make_node("AveragePool", ["x"], ["y"], name="avg", kernel_shape=[2, 2], strides=[2**40, 2])], {}),
     ("'avg'", "strides", "below 2^31")),
    (_model([helper.make_node("Concat", ["x", ""], ["y"], name="cat", axis=1)], {}), ("'cat'", "input 2 is empty")),
    # a NaN weight: 0 x NaN at the padded border is NaN in onnxruntime, skipped by our kernel
    (_model([_conv(kernel_shape=[3, 3], pads=[1, 1, 1, 1])], {"w": np.where(np.arange(108).reshape(4, 3, 3, 3) == 5, np.nan, 1).astype(np.float32)}),
     ("'conv'", "NaN")),
])
def test_malformed_models_are_one_line(tmp_path, capsys, model, words):
    line = _run_model(tmp_path, capsys, model)
    for w in words:
        assert w in line, line
    assert "unsupported" not in line  # a malformed graph is not reported as an unsupported op


def test_short_initializer(tmp_path, capsys):
    model = _model([_conv()], {"w": W})
    init = model.graph.initializer[0]
    init.raw_data = init.raw_data[:20]
    assert "initializer 'w'" in _run_model(tmp_path, capsys, model)


def test_absurd_shapes_are_refused_before_anything_is_allocated(tmp_path, capsys):
    model = _model([_conv()], {"w": W}, shape=(1, 3, 2**20, 2**20))
    assert "more than this machine's" in _run_model(tmp_path, capsys, model)
    assert "more than this machine's" in _refused(capsys, ["inspect", "minakova5", "--input-shape", "1x1x100000x100000"])


def test_a_job_larger_than_the_available_memory_is_refused_before_it_runs(capsys, monkeypatch):
    """Each tensor fits the machine, the whole job does not fit what it has free now (a batch of
    2^20 with --verify, 18 GiB, was ended by the OOM killer): one line, before anything runs."""
    from tightfit.runtime import enforce

    monkeypatch.setattr(enforce, "available_bytes", lambda: 64 * 2**10)
    line = _refused(capsys, ["run", "minakova5", "--input-shape", "64x1x32x32", "--verify"])
    assert "needs about" in line and "64.00 KiB available" in line and "onnxruntime" in line, line
    monkeypatch.setattr(enforce, "available_bytes", lambda: 2**40)
    assert main(["run", "minakova5", "--input-shape", "64x1x32x32"]) == 0


@pytest.mark.parametrize("budget", ["9" * 400, "9" * 400 + "MB", "1e400"])
def test_400_digit_budgets(capsys, budget):
    assert "size" in _refused(capsys, ["plan", "minakova5", "--method", "parts", "--budget", budget])


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(["plan", "minakova5", "--method", "parts", "--rows", "4", "--out", str(out)]) == 0
    return out.read_text()


def _tampered(tmp_path: Path, capsys, data: bytes | str) -> str:
    path = tmp_path / "p.json"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return _refused(capsys, ["run", str(path), "--enforce"])


def test_plan_parse_limits(tmp_path, capsys, plan_text):
    assert "UTF-8" in _tampered(tmp_path, capsys, b"\xff\xfe" + plan_text.encode())
    assert "nested deeper" in _tampered(tmp_path, capsys, "[" * 100000 + "]" * 100000)
    assert "nested deeper" in _tampered(tmp_path, capsys, plan_text.replace('"knobs":{', '"knobs":{"x":' + "[" * 40 + "]" * 40 + ",", 1))
    assert "integer" in _tampered(tmp_path, capsys, plan_text.replace('"arena_bytes":', '"arena_bytes":' + "9" * 5000 + ",\"y\":", 1))
    assert "not a JSON number" in _tampered(tmp_path, capsys, plan_text.replace('"arena_bytes":', '"arena_bytes":NaN,"y":', 1))


def _edited(plan_text: str, edit) -> str:
    d = json.loads(plan_text)
    edit(d)
    return json.dumps(d)


def test_tampered_scratch_is_refused(tmp_path, capsys, plan_text):
    """A step's scratch is recomputed from its op: an inflated one (which would raise the limit
    `run --enforce` derives from the analysis, switching it off) or a shrunk one is refused."""
    def steps(d):
        return [s for p in d["partitions"] for s in p["steps"] if s["kind"] == "compute"]

    for value in (10**15, 0 if any(s["scratch"] for s in steps(json.loads(plan_text))) else 1):
        text = _edited(plan_text, lambda d: [s.update(scratch=value) for s in steps(d)[:1]])
        assert "scratch" in _tampered(tmp_path, capsys, text)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(concurrent=[[0, 7]]), ("unknown partition 7",)),
    (lambda d: d.update(concurrent=[[0], [0]]), ("named twice",)),
    (lambda d: d.update(arena_bytes=10**12), ("arena",)),
    (lambda d: d["buffers"][0].update(offsets=[10**12]), ("arena has",)),
    (lambda d: d["partitions"][0].update(id=5), ("partition 0 has id 5",)),
])
def test_plan_numbers_and_ids(tmp_path, capsys, plan_text, edit, words):
    line = _tampered(tmp_path, capsys, _edited(plan_text, edit))
    for w in words:
        assert w in line, line


def _app(tmp_path: Path, text: str) -> str:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return str(path)


def test_application_partitions_out_of_order(tmp_path, capsys):
    app = _app(tmp_path, "cnns: [{name: a, model: minakova5}]\npartitions: [{cnn: a, layers: 1-2}, {cnn: a, layers: 0}]\n")
    assert "out of order" in _refused(capsys, ["plan", app])


def test_application_two_cnns_of_one_name(tmp_path, capsys):
    app = _app(tmp_path, "cnns: [{name: a, model: minakova5}, {name: a, model: minakova5}]\n")
    line = _refused(capsys, ["plan", app])
    assert "same name 'a'" in line and "overlap" not in line


@pytest.mark.parametrize("text, words", [
    ("cnns: [{name: a, model: minakova5}]\npartitions: [{cnn: a, layers: 0-99999999999}]\n", ("does not exist",)),
    ("cnns: [{name: a, model: minakova5}]\npartitions: [{cnn: a, layers: 0-999999999999999999999}]\n", ("cannot read",)),
    ("cnns: [{name: a, model: minakova5}]\npipelines: [[0, 9]]\n", ("pipeline",)),
    ("a: &a [1, 1]\nb: &b [*a, *a]\ncnns: *b\n", ("alias",)),
    ("cnns: " + "[" * 100 + "]" * 100 + "\n", ("nested deeper",)),
    ("cnns: [{name: a, model: minakova5, input_shape: 1x3xax4}]\n", ("input_shape",)),
])
def test_application_files(tmp_path, capsys, text, words):
    line = _refused(capsys, ["plan", _app(tmp_path, text)])
    for w in words:
        assert w in line, line


def test_kernel_calls_refuse_weights_their_views_do_not_fit():
    """A convolution whose weight is not for its input's channels is refused when its step is
    bound (the kernel would read past the weight), naming the layer; the right weight binds."""
    import numpy as np

    from tightfit.errors import KernelError
    from tightfit.graph.ir import Layer
    from tightfit.runtime.reference import run_layer

    attrs = {"kernel": (3, 3), "stride": (1, 1), "dilation": (1, 1), "pads": (0, 0, 0, 0), "groups": 1,
             "out_channels": 4, "act": ()}
    layer = Layer(0, "conv0", "conv", ("x",), "y", attrs, ("w", "b"))
    x, y = np.zeros((1, 8, 6, 6), np.float32), np.zeros((1, 4, 4, 4), np.float32)
    with pytest.raises(KernelError, match="conv0.*do not agree"):  # a weight for 2 input channels
        run_layer(layer, [x], [np.zeros((4, 2, 3, 3), np.float32), np.zeros(4, np.float32)], y)
    run_layer(layer, [x], [np.ones((4, 8, 3, 3), np.float32), np.ones(4, np.float32)], y)
    assert (y == 1.0).all()


def test_squeeze_without_axes_verifies(tmp_path, capsys):
    """ONNX's Squeeze without axes drops the batch dim of a batch-1 output too; tightfit keeps
    it: the same elements in the same order, verified as such against onnxruntime."""
    path = tmp_path / "sq.onnx"
    path.write_bytes(_model([helper.make_node("Squeeze", ["x"], ["y"], name="sq")], {}, shape=(1, 1, 8, 8)).SerializeToString())
    assert main(["run", str(path), "--verify"]) == 0, capsys.readouterr().err
    assert "verify vs onnxruntime: OK" in capsys.readouterr().out
