""".tflite import (issue 40): an int8 file made by TensorFlow's converter imports into int8 layers
that requantize as TFLite Micro does, runs bit-exact against TFLite Micro's interpreter (and against
its outputs stored beside the file, so the test compares something where the interpreter is not
installed), plans by parts at half its reuse arena with the same outputs, and exports a C program
that gives them. Bad files are one line and exit 2.

The files in tests/data are remade by bench/tflite_models.py (needs tensorflow; see its docstring)."""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite", reason="the `tflite` flatbuffer schema package is not installed")

from tightfit import api  # noqa: E402
from tightfit.cli import main  # noqa: E402
from tightfit.errors import ModelLoadError  # noqa: E402
from tightfit.frontend.load import load  # noqa: E402
from tightfit.graph.forms import file_output  # noqa: E402
from tightfit.kernels.step_args import quantize_multiplier  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.errors import InputDataError  # noqa: E402
from tightfit.runtime.executor import ArenaExecutor, RowSource  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import tflite_models as tm  # noqa: E402

DATA = Path(__file__).parent / "data"
SMALL = DATA / "small_int8.tflite"


@pytest.fixture(scope="module")
def small():
    return load(str(SMALL))


def _ours(g, x_q: np.ndarray) -> np.ndarray:
    """Our output on the file's int8 input, as the file gives it (NHWC for a map)."""
    return file_output(g, g.outputs[0], tm.as_int8_output(g, run_reference(g, tm.as_graph_input(g, x_q))[g.outputs[0]]))


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Element for element; a map in the same (NHWC) shape, a vector whatever 1s its shape has."""
    return (got.ndim < 4 or got.shape == want.shape) and np.array_equal(got, want.reshape(got.shape))


def test_every_layer_is_int8_with_tflite_rounding(small):
    ops = [l.op for l in small.layers]
    assert "quantize" not in ops and "dequantize" not in ops  # the file's int8 input and output are the graph's
    x, y = small.tensors[small.inputs[0]], small.tensors[small.outputs[0]]
    assert x.dtype == "int8" and x.quant.per_tensor and small.layers[0].inputs == (x.name,)
    assert y.dtype == "int8" and small.layers[-1].output == y.name == "StatefulPartitionedCall_1:0"
    inner = small.layers
    assert all(l.attrs.get("quant") == "int8" and l.attrs.get("rounding") == "tflite" for l in inner)
    assert {"conv", "add", "avgpool", "maxpool", "concat", "global_pool", "gemm", "softmax"} <= {l.op for l in inner}
    assert any(l.attrs["groups"] > 1 for l in inner if l.op == "conv")  # the depthwise convolution
    assert any(l.attrs.get("act") for l in inner if l.op == "add")  # an ADD with a fused RELU, int8 too
    assert small.input_forms[0][1] == "nhwc" and small.input_forms[0][2] == (1, 32, 32, 3)
    assert small.shape(small.inputs[0]) == (1, 3, 32, 32)


# Files with TFLite Micro's outputs stored beside them: softmax_int8, a SOFTMAX of logits spread wide
# (some below its exp's cut-off); map_int8, a 4-D output; broadcast_int8, an ADD of a (1, 1, 1, C)
# map onto an NHWC one and pools with a fused RELU; mul_int8, MUL of two maps and of a (1, 1, 1, C) one.
STORED = ["small_int8", "softmax_int8", "map_int8", "broadcast_int8", "mul_int8"]


@pytest.mark.parametrize("name", STORED)
def test_equals_stored_tflite_micro_outputs(name):
    """Always runs: TFLite Micro's outputs on seeded int8 inputs, stored when the file was made."""
    g = load(str(DATA / f"{name}.tflite"))
    stored = np.load(DATA / f"{name}_tflm.npz")
    assert len(stored["x"]) >= 4 and len(np.unique(stored["y"])) > 8
    for x, y in zip(stored["x"], stored["y"]):
        assert _same(_ours(g, x), y)


@pytest.mark.parametrize("name", STORED)
def test_equals_tflite_micro_bit_for_bit(name):
    pytest.importorskip("tflite_micro", reason="the tflite-micro interpreter is not installed")
    path = DATA / f"{name}.tflite"
    g = load(str(path))
    for seed in range(10, 16):
        x = tm.random_int8(g, seed)
        assert _same(_ours(g, x), tm.tflm_outputs(path.read_bytes(), x)), seed


def test_broadcast_add_mul_and_pools_with_a_relu_are_int8():
    """Every layer int8 (none in fp32 between a dequantize and a quantize): an ADD and a MUL of a
    (1, C, 1, 1) map onto a (1, C, H, W) one, a MUL of two maps, a pool's fused RELU an int8 clamp."""
    b, m = load(str(DATA / "broadcast_int8.tflite")), load(str(DATA / "mul_int8.tflite"))
    for g in (b, m):
        assert all(l.attrs.get("quant") == "int8" and l.attrs.get("rounding") == "tflite" for l in g.layers)
    add = next(l for l in b.layers if l.op == "add")
    assert sorted(b.shape(t) for t in add.inputs) == [(1, 5, 1, 1), (1, 5, 8, 6)]
    assert [l.op for l in b.layers if l.op in ("avgpool", "maxpool", "activation")] == ["avgpool", "activation", "maxpool", "activation"]
    muls = [sorted(m.shape(t) for t in l.inputs) for l in m.layers if l.op == "mul"]
    assert muls == [[(1, 4, 6, 8), (1, 4, 6, 8)], [(1, 4, 1, 1), (1, 4, 6, 8)]]


@pytest.mark.parametrize("name", ["broadcast_int8", "mul_int8"])
def test_broadcast_operands_split_by_parts_and_exported(name, tmp_path):
    """By parts (the broadcast operand read whole by every band) and as a C program: the same integers."""
    path = str(DATA / f"{name}.tflite")
    g = load(path)
    x = tm.as_graph_input(g, tm.random_int8(g, 7))
    whole = run_reference(g, x)[g.outputs[0]]
    plan, gs = api.plan(path, method="parts", rows=1)
    assert np.array_equal(ArenaExecutor(plan, gs, fill_nan=True).run(x)[0][g.outputs[0]], whole)
    if shutil.which("cc") is not None:
        from tightfit.api import check_export
        from tightfit.export import export

        c = check_export(plan, gs, export(plan, gs, tmp_path / "out"), tmp_path / "out", cflags=["-std=c99", "-O2"])
        assert c.ok and c.max_abs_diff == 0.0, c.lines()


def test_onnxruntime_rounding_would_differ(small):
    """The rounding mode is what makes the run exact: the same layers requantized as onnxruntime
    does are off on some outputs (so the comparisons above can fail)."""
    import dataclasses

    plain = dataclasses.replace(small, layers=tuple(
        dataclasses.replace(l, attrs={k: v for k, v in l.attrs.items() if k != "rounding" or l.op == "softmax"})
        for l in small.layers))  # (the int8 softmax is TFLite's alone)
    stored = np.load(DATA / "small_int8_tflm.npz")
    off = sum(int((_ours(plain, x) != y.reshape(1, -1)).sum()) for x, y in zip(stored["x"], stored["y"]))
    assert off > 0


def test_the_file_as_onnx_runs_in_onnxruntime_within_one_lsb(small):
    """tflite_as_onnx: the QDQ model load_tflite imports, for tools that take ONNX; onnxruntime's
    float-input run of it, quantized back, is TFLite Micro's output to 1 LSB (its rounding differs)."""
    import onnxruntime as ort

    from tightfit.frontend.tflite_import import tflite_as_onnx

    session = ort.InferenceSession(tflite_as_onnx(SMALL).SerializeToString())
    assert session.get_inputs()[0].shape == [1, 32, 32, 3]  # the file's NHWC
    (s_in, z_in), (s_out, z_out) = tm.edge_quant(small)
    stored = np.load(DATA / "small_int8_tflm.npz")
    for x, y in zip(stored["x"], stored["y"]):
        real = (x.astype(np.float32) - np.float32(z_in)) * np.float32(s_in)
        got = session.run(None, {session.get_inputs()[0].name: real})[0]
        q = np.clip(np.rint(got / np.float32(s_out)) + z_out, -128, 127).astype(int)
        assert np.abs(q.reshape(-1) - y.reshape(-1).astype(int)).max() <= 1


def test_quantize_multiplier_is_tflites():
    """QuantizeMultiplier's known values: 0.5 -> 2^30 with shift 0; 1 -> 2^30 with shift 1; a
    fraction rounding up to 2^31 moves to the next shift; tiny ones flush to zero."""
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(0.75) == (3 << 29, 0)
    assert quantize_multiplier(1 - 2.0 ** -40) == (1 << 30, 1)
    assert quantize_multiplier(2.0 ** -40) == (0, 0)
    assert quantize_multiplier(0.0) == (0, 0)


def test_parts_at_half_the_reuse_arena_equals_the_unsplit_run(small):
    reuse, gs = api.plan(str(SMALL), method="reuse")
    whole_arena = check_plan(reuse, gs).arena_bytes
    x = tm.as_graph_input(small, tm.random_int8(small, 3))
    whole = ArenaExecutor(reuse, gs, fill_nan=True).run(x)[0][small.outputs[0]].copy()
    parts, gs = api.plan(str(SMALL), method="parts", rows=1)
    assert check_plan(parts, gs).arena_bytes <= whole_arena // 2
    assert np.array_equal(ArenaExecutor(parts, gs, fill_nan=True).run(x)[0][small.outputs[0]], whole)


def test_the_arena_holds_the_int8_input_alone(small):
    """TFLite Micro's arena holds the file's int8 input; so does ours: no float copy, no quantize step."""
    plan, gs = api.plan(str(SMALL), method="reuse")
    step = next(s for s in plan.steps() if s.kind == "input")
    assert plan.buffers[step.out.buffer].itemsize == 1
    assert plan.buffers[step.out.buffer].nbytes == int(np.prod(small.shape(small.inputs[0])))


def test_int8_rows_from_a_source_equal_the_whole_input(small):
    """A parts plan reads the int8 input by row bands (int8 rows into the arena); floats for an
    int8 input are refused, not cast."""
    plan, gs = api.plan(str(SMALL), method="parts", rows=1)
    x = tm.as_graph_input(small, tm.random_int8(small, 5))
    assert x.dtype == np.int8
    ex = ArenaExecutor(plan, gs, fill_nan=True)
    whole = ex.run(x)[0][small.outputs[0]].copy()
    banded = ex.run(RowSource(x.shape, lambda h0, h1: x[:, :, h0:h1]))[0][small.outputs[0]]
    assert np.array_equal(banded, whole)
    assert np.array_equal(whole, run_reference(small, x)[small.outputs[0]])
    with pytest.raises(InputDataError, match="int8"):
        ex.run(x.astype(np.float32) + 0.5)
    with pytest.raises(InputDataError, match="int8"):
        ex.run(RowSource(x.shape, lambda h0, h1: x[:, :, h0:h1].astype(np.float32)))


def test_profiling_binds_an_int8_input_step(small):
    """The profiler times an input step alone on values of the input's type (int8 bytes here)."""
    from tightfit.runtime.cost import _bind_alone

    plan, gs = api.plan(str(SMALL), method="parts", rows=1)
    step = next(s for s in plan.steps() if s.kind == "input")
    alone = _bind_alone(plan, gs, step)
    assert alone.x.dtype == np.int8 and alone.tensor.item == 1
    assert alone.runs(2)() == 0


def test_cli_runs_an_int8_input_file(small, tmp_path, capsys):
    """`run --input`: a .npy of int8 in the file's NHWC layout (or in NCHW), or raw int8 bytes in the
    file's NHWC layout (as the exported program reads them), gives TFLite Micro's stored outputs; a
    float .npy for the int8 input is one line, exit 2."""
    stored = np.load(DATA / "small_int8_tflm.npz")
    x, want = stored["x"][1], stored["y"][1].reshape(-1)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "nchw.npy", np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    for given in ("x.npy", "nchw.npy", "x.bin"):
        out = tmp_path / f"{given}.y.npy"
        assert main(["run", str(SMALL), "--input", str(tmp_path / given), "--output", str(out)]) == 0
        assert np.load(out).dtype == np.int8 and np.array_equal(np.load(out).reshape(-1), want), given
    capsys.readouterr()
    np.save(tmp_path / "f.npy", x.astype(np.float32) / 100)
    assert main(["run", str(SMALL), "--input", str(tmp_path / "f.npy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "int8" in err[0] and "Traceback" not in err[0], err


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_exported_program_equals_the_executor(tmp_path):
    from tightfit.api import check_export
    from tightfit.export import export

    plan, graphs = api.plan(str(SMALL), method="parts", rows=1)
    sources = export(plan, graphs, tmp_path / "out")
    header = next(h for h in (tmp_path / "out").glob("*.h") if h.name != "tf_kernels.h").read_text()
    assert "_INPUT_ITEM 1 " in header  # the program takes the file's int8 input, 1 byte a value
    c = check_export(plan, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"])
    assert c.ok and c.max_abs_diff == 0.0, c.lines()


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("arm-none-eabi-gcc", "qemu-system-arm")),
                    reason="no Cortex-M toolchain or qemu")
def test_runs_on_an_emulated_cortex_m7(tmp_path, capsys):
    """By parts within 256 KiB of RAM, exported for a Cortex-M7 and run under qemu: the executor's
    outputs exactly (so TFLite Micro's)."""
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(SMALL), "--method", "parts", "--rows", "1", "--out", str(plan_file)]) == 0
    assert main(["export", str(plan_file), "--out", str(tmp_path / "m7"), "--target", "cortex-m7", "--ram", "256KiB",
                 "--flash", "1MiB", "--check"]) == 0
    assert "outputs match (max abs diff 0," in capsys.readouterr().out


def test_cli_inspect_plan_and_run(tmp_path, capsys):
    assert main(["inspect", str(SMALL)]) == 0
    said = capsys.readouterr().out
    assert "0 fp32 layers" in said and "is int8 (scale" in said and "NHWC 1x32x32x3" in said
    out = tmp_path / "p.json"
    assert main(["plan", str(SMALL), "--method", "parts", "--rows", "1", "--out", str(out)]) == 0
    assert main(["run", str(out), "--verify"]) == 0
    assert "OK" in capsys.readouterr().out


def test_float_input_and_output_files():
    """A file that takes float32 and quantizes it itself (QUANTIZE ... DEQUANTIZE; dense layers per
    tensor): the same floats out as TFLite Micro's, from the stored outputs (and the live
    interpreter where installed)."""
    path = DATA / "small_float_io.tflite"
    g = load(str(path))
    assert [l.op for l in g.layers][:: len(g.layers) - 1] == ["quantize", "dequantize"]
    assert any(l.op == "gemm" and len(l.attrs["w_scale"]) == 1 for l in g.layers)
    stored = np.load(DATA / "small_float_io_tflm.npz")
    for x, y in zip(stored["x"], stored["y"]):
        ours = run_reference(g, np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[g.outputs[0]]
        assert np.array_equal(ours, y.reshape(ours.shape))
    if importlib.util.find_spec("tflite_micro") is not None:
        x = tm.random_float(g, 9)
        ours = run_reference(g, np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[g.outputs[0]]
        assert np.array_equal(ours, tm.tflm_outputs(path.read_bytes(), x).reshape(ours.shape))


@pytest.mark.parametrize("name", ["small_int8", "softmax_int8"])
def test_cli_run_verify_against_tflite_micro(name, capsys):
    pytest.importorskip("tflite_micro", reason="the tflite-micro interpreter is not installed")
    assert main(["run", str(DATA / f"{name}.tflite"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "TFLite Micro" in out and "OK (max abs diff 0," in out, out


# --- memory counts real bytes ----------------------------------------------------------------------

def test_inspect_counts_the_real_bytes_of_int8_parameters(small, capsys):
    """Run-time parameters: int8 weights 1 B, int32 biases 4 B, and per output channel of a
    convolution or dense layer TFLite's multiplier and shift (two int32); the imported model's: its
    quantized constants as the file stores them (data, and per channel a float32 scale and an int64
    zero point), not 4 B a value."""
    import json

    from tightfit.frontend.tflite_import import read

    want = sum(l.attrs.get("w_scale") is not None and small.shape(l.output)[1] * 8 for l in small.layers)
    want += sum(small.params[p].size * (1 if small.params[p].dtype == np.int8 else 4) for l in small.layers for p in l.params)
    assert all(small.params[p].dtype in (np.int8, np.int32) for l in small.layers for p in l.params)
    tensors = read(SMALL)[0]
    stored = sum(t.data.size * t.data.itemsize + 12 * t.scale.size for t in tensors if t.data is not None and t.scale.size)
    assert main(["inspect", str(SMALL), "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["param_bytes"] == want and totals["original_param_bytes"] == stored
    weights = sum(t.data.size for t in tensors if t.data is not None and t.dtype == "int8")
    assert stored < 2 * weights  # (4 B a value would be over 4 times the int8 weights)


def test_tiling_counts_int8_input_bands_at_1_byte(small):
    """A tile's input step holds a band of the int8 input's rows and its concatenation: its scratch
    is twice the band's bytes at 1 B a value, the band the executor asks a RowSource for."""
    from tightfit.runtime.executor import RowSource

    plan, gs = api.plan(str(SMALL), method="tiling", tiling="0-3:2x2")
    x = tm.as_graph_input(small, tm.random_int8(small, 4))
    bands: list[int] = []

    def rows(h0, h1):
        bands.append(h1 - h0)
        return x[:, :, h0:h1]

    ex = ArenaExecutor(plan, gs, fill_nan=True)
    got = ex.run(RowSource(x.shape, rows))[0][small.outputs[0]].copy()
    assert np.array_equal(got, run_reference(small, x)[small.outputs[0]])
    scratch = [s.scratch for s in plan.steps() if s.kind == "input"]
    _, c, _, w = small.shape(small.inputs[0])
    assert scratch and max(scratch) == 2 * max(bands) * c * w * 1


# --- a 4-D output: the file's NHWC at every boundary ------------------------------------------------
# map_int8.tflite: (1, 6, 10, 3) in, (1, 6, 10, 5) out (H, W and C all different). Inside, the graph is
# NCHW; `run`, `--verify`, the C program and its check take and give the file's NHWC.
MAP = DATA / "map_int8.tflite"


def test_a_4d_output_is_given_nhwc_by_run(tmp_path):
    """`run` on the file and on a plan of it, from a .npy or raw bytes of the NHWC input: TFLite
    Micro's stored NHWC outputs, element for element."""
    g = load(str(MAP))
    assert g.output_forms == ((g.outputs[0], "nhwc", (1, 6, 10, 5)),) and g.shape(g.outputs[0]) == (1, 5, 6, 10)
    plan = tmp_path / "p.json"
    assert main(["plan", str(MAP), "--method", "parts", "--rows", "1", "--out", str(plan)]) == 0
    stored = np.load(DATA / "map_int8_tflm.npz")
    assert stored["y"].shape[1:] == (1, 6, 10, 5)
    for k, (x, y) in enumerate(zip(stored["x"], stored["y"])):
        np.save(tmp_path / "x.npy", x)
        (tmp_path / "x.bin").write_bytes(x.tobytes())
        for model, given in ((MAP, "x.npy"), (MAP, "x.bin"), (plan, "x.bin")):
            out = tmp_path / "y.npy"
            assert main(["run", str(model), "--input", str(tmp_path / given), "--output", str(out)]) == 0
            got = np.load(out)
            assert got.dtype == np.int8 and got.shape == y.shape and np.array_equal(got, y), (k, model, given)


def test_a_4d_output_verifies_against_tflite_micro(capsys):
    pytest.importorskip("tflite_micro", reason="the tflite-micro interpreter is not installed")
    assert main(["run", str(MAP), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "TFLite Micro" in out and "OK (max abs diff 0," in out and "shape 1x6x10x3" in out, out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_exported_program_takes_and_gives_nhwc(tmp_path, capsys):
    """The C program of a parts plan reads the NHWC input by rows and gives the NHWC output: on
    TFLite Micro's stored inputs, its outputs are TFLite Micro's, element for element."""
    from tightfit.api import check_export
    from tightfit.export import export
    from tightfit.export.build import run

    plan, graphs = api.plan(str(MAP), method="parts", rows=1)
    sources = export(plan, graphs, tmp_path / "out")
    header = (tmp_path / "out" / f"{sources.name}.h").read_text()
    assert "_INPUT_NHWC 1 " in header and "1x6x10x5 NHWC" in header
    c = check_export(plan, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"])
    assert c.ok and c.max_abs_diff == 0.0, c.lines()
    stored = np.load(DATA / "map_int8_tflm.npz")
    for k, (x, y) in enumerate(zip(stored["x"], stored["y"])):  # by rows, and whole (-p: tf_tensor_rows)
        got = run(c.built.binary, [x], [y.size], preload=k % 2 == 1).outputs[0]
        assert np.array_equal(got, y.reshape(-1).astype(np.float32)), k


@pytest.mark.skipif(any(shutil.which(t) is None for t in ("arm-none-eabi-gcc", "qemu-system-arm")),
                    reason="no Cortex-M toolchain or qemu")
def test_a_4d_output_on_an_emulated_cortex_m7(tmp_path, capsys):
    """The Cortex-M program reads the NHWC input by rows and gives the NHWC output."""
    plan_file = tmp_path / "plan.json"
    assert main(["plan", str(MAP), "--method", "parts", "--rows", "1", "--out", str(plan_file)]) == 0
    assert main(["export", str(plan_file), "--out", str(tmp_path / "m7"), "--target", "cortex-m7", "--ram", "256KiB",
                 "--flash", "1MiB", "--check"]) == 0
    assert "outputs match (max abs diff 0," in capsys.readouterr().out


# --- bad files: one line, exit 2 ------------------------------------------------------------------

def _one_line(path: Path, words: str, capsys) -> None:
    with pytest.raises(ModelLoadError, match=words):
        load(str(path))
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err


def test_unknown_op_is_one_line(capsys):
    _one_line(DATA / "tanh_int8.tflite", "op TANH is not imported", capsys)


def test_add_of_a_constant_is_one_line(capsys):
    _one_line(DATA / "add_const_int8.tflite", "ADD of a constant operand", capsys)


def test_float16_tensors_are_one_line(capsys):
    _one_line(DATA / "float16.tflite", "float16", capsys)


@pytest.mark.parametrize("cut", [0.5, 0.9, 0.99])
def test_truncated_file_is_one_line(tmp_path, cut, capsys):
    data = SMALL.read_bytes()
    path = tmp_path / "cut.tflite"
    path.write_bytes(data[: int(len(data) * cut)])
    _one_line(path, "truncated|corrupt", capsys)


def test_not_a_flatbuffer_is_one_line(tmp_path, capsys):
    path = tmp_path / "x.tflite"
    path.write_bytes(b"\x00" * 64)
    _one_line(path, "TFL3", capsys)


def test_int4_tensor_is_one_line(tmp_path, capsys):
    """A tensor type patched to INT4 (TensorType 17) in the flatbuffer: refused by name."""
    import tflite

    data = bytearray(SMALL.read_bytes())
    sg = tflite.Model.GetRootAs(data, 0).Subgraphs(0)
    t = next(sg.Tensors(i) for i in range(sg.TensorsLength()) if sg.Tensors(i).Type() == 9)
    pos = t._tab.Offset(6)  # the `type` field's slot (vtable entry 6: shape 4, type 6, buffer 8, ...)
    assert pos and data[t._tab.Pos + pos] == 9  # INT8
    data[t._tab.Pos + pos] = 17
    path = tmp_path / "int4.tflite"
    path.write_bytes(bytes(data))
    _one_line(path, "int4", capsys)


def test_damaged_files_load_or_fail_in_one_line(tmp_path):
    """Cut anywhere, or with bytes overwritten: the file loads (a changed weight) or fails as a
    TightfitError (one line), never with another exception."""
    from tightfit.errors import TightfitError

    data = SMALL.read_bytes()
    rng = np.random.default_rng(0)
    cases = [data[:n] for n in range(8, len(data), len(data) // 25)]
    for _ in range(40):
        b = bytearray(data)
        for i in rng.integers(8, len(b), 3):
            b[i] = int(rng.integers(0, 256))
        cases.append(bytes(b))
    for k, case in enumerate(cases):
        path = tmp_path / f"case{k}.tflite"
        path.write_bytes(case)
        try:
            load(str(path))
        except TightfitError:
            pass


# --- fit --inplace --------------------------------------------------------------------------------

def test_fit_places_candidates_in_place(small):
    """With `inplace`, every candidate of fit's search is placed with outputs over their inputs
    where the kernels allow: never larger, and the layer-by-layer plans (12288 B) come down to
    8448 B, a budget they miss placed plainly."""
    from tightfit.stages import _placed, load_fit_app

    app = load_fit_app(str(SMALL))
    out = api.fit(app, 1, measure=False, timer=lambda plan, graphs: [1000.0] * len(graphs), best_effort=True)
    sizes = [(_placed(out.problem, p)[1].peak_bytes, _placed(out.problem, p, True)) for p in out.problem.points.values()]
    assert all(over[1].peak_bytes <= plain for plain, over in sizes)
    shrunk = [(plain, over) for plain, over in sizes if over[1].peak_bytes < plain]
    assert shrunk and all(over[0].knobs.get("inplace") for _, over in shrunk)
    assert any(over[1].peak_bytes + 1024 < plain for plain, over in shrunk)


def test_cli_fit_inplace_runs_and_verifies(tmp_path, capsys):
    """`fit --inplace` through the CLI: the chosen plan is placed in place (its knobs say so), fits
    the budget, passes the checker and gives the reference executor's outputs exactly."""
    import json

    out = tmp_path / "fit"
    assert main(["fit", str(SMALL), "--budget", "8448B", "--inplace", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["chosen"]["memory_bytes"] <= 8448 and report["chosen"]["max_rel_diff_vs_reference"] == 0.0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["knobs"].get("inplace") is True
    assert main(["run", str(out / "plan.json"), "--verify"]) == 0
    assert "OK" in capsys.readouterr().out
