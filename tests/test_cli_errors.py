"""Bad input gives one clear line on stderr and exit status 2; internal errors never exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tightfit.cli import main


def _conv_model(batch: "int | str" = 1, extra_nodes=(), name="m") -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv0", pads=[1, 1, 1, 1])]
    out = "y"
    for i, op in enumerate(extra_nodes):
        nodes.append(helper.make_node(op, [out], [f"z{i}"], name=f"bad_{op.lower()}"))
        out = f"z{i}"
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _err(argv, capsys) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 2, captured
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("tightfit: error: ")
    assert "Traceback" not in captured.err
    return lines[0]


def test_missing_file(capsys, tmp_path):
    assert "not found" in _err(["inspect", str(tmp_path / "nope.onnx")], capsys)


def test_not_onnx(capsys, tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is not a model\n" * 10)
    assert "not" in _err(["inspect", str(p)], capsys)


def test_truncated_onnx(capsys, tmp_path):
    data = _conv_model().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    assert str(p) in _err(["inspect", str(p)], capsys)


def test_unsupported_ops_all_listed_before_running(capsys, tmp_path):
    p = tmp_path / "odd.onnx"
    onnx.save(_conv_model(extra_nodes=("Sin", "Relu", "Round")), str(p))
    line = _err(["run", str(p)], capsys)
    assert "Sin (node 'bad_sin')" in line and "Round (node 'bad_round')" in line
    assert "Relu" not in line.split("supported:")[0]


def test_dynamic_input_needs_input_shape(capsys, tmp_path):
    """A dynamic batch alone defaults to 1 (one line on stderr, issue 22); a dynamic image size
    needs --input-shape."""
    p = tmp_path / "dyn.onnx"
    onnx.save(_conv_model(batch="N"), str(p))
    assert main(["inspect", str(p), "--input-shape", "2x3x8x8"]) == 0
    assert main(["inspect", str(p)]) == 0
    assert "dynamic batch" in capsys.readouterr().err
    model = _conv_model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    onnx.save(model, str(p))
    assert "--input-shape" in _err(["inspect", str(p)], capsys)


@pytest.mark.parametrize("shape", ["1x3x8", "1x4x8x8", "1xthreex8x8", "0x3x8x8"])
def test_wrong_input_shape(capsys, tmp_path, shape):
    p = tmp_path / "dyn.onnx"
    onnx.save(_conv_model(batch="N"), str(p))
    assert "input-shape" in _err(["inspect", str(p), "--input-shape", shape], capsys)


def test_external_data_outside_model_folder(capsys, tmp_path):
    model = _conv_model()
    inside = tmp_path / "model"
    inside.mkdir()
    onnx.save(model, str(inside / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.bin", size_threshold=0)
    assert main(["inspect", str(inside / "m.onnx")]) == 0  # beside the model: fine
    capsys.readouterr()
    (tmp_path / "w.bin").write_bytes((inside / "w.bin").read_bytes())
    m = onnx.load(str(inside / "m.onnx"), load_external_data=False)
    for entry in m.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../w.bin"
    onnx.save(m, str(inside / "escape.onnx"))
    assert "outside" in _err(["inspect", str(inside / "escape.onnx")], capsys)


def test_unknown_model_name(capsys):
    assert "zoo" in _err(["inspect", "resnet19"], capsys)


def test_bad_dtype_and_workspace(capsys):
    assert "dtype" in _err(["inspect", "minakova5", "--dtype", "fp64"], capsys)
    assert "workspace" in _err(["inspect", "minakova5", "--workspace", "magic"], capsys)


def test_internal_error_is_not_exit_2(tmp_path):
    """An internal bug keeps its traceback and exits 1, never the user-error status."""
    code = (
        "import sys, tightfit.pipeline as pipeline\n"
        "def boom(*a, **k): raise RuntimeError('internal')\n"
        "pipeline.account = boom\n"
        "import tightfit.cli as cli\n"
        "sys.exit(cli.main(['inspect', 'minakova5']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr


def test_cli_subprocess_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tightfit.cli", "inspect", str(tmp_path / "x.onnx")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tightfit: error:")
