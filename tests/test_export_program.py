"""The exported test program (c/main.c) under the sanitizers, with its weights read from a file
and its input read whole (-p): the buffers it allocates for them are freed (LeakSanitizer)."""
from __future__ import annotations

import numpy as np

import tightfit
from tightfit.export import export
from tightfit.export.build import build, run
from tightfit.reference import run_reference


def test_weights_file_program_is_clean_under_the_sanitizers(tmp_path):
    plan, graphs = tightfit.api.plan("minakova5")
    sources = export(plan, graphs, tmp_path / "c", weights="file")
    assert sources.weights_in_file
    built = build(tmp_path / "c", sources.name, cflags=["-std=c99", "-O2"], sanitize=True)
    x = tightfit.api.plan_inputs(graphs, plan)[0]
    ref = np.asarray(run_reference(graphs[0], x)[graphs[0].outputs[0]])
    for preload in (False, True):
        ran = run(built.binary, [np.asarray(x)], [ref.size], 2, tmp_path / "c" / "weights.bin", preload=preload)
        assert abs(ran.outputs[0] - ref.ravel()).max() < 1e-4
        # its runs' own time (the second run's: the shorter of wall and CPU time) is said and read
        assert np.isfinite(ran.cpu_seconds) and ran.cpu_seconds >= 0.0


# --- issue 37, point 2: every input error named, non-zero, no leak; `make` is the fast build --------

import os  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tightfit.cli import main  # noqa: E402
from tightfit.export.build import DEFAULT_CFLAGS  # noqa: E402

needs_make = pytest.mark.skipif(shutil.which("make") is None or shutil.which("cc") is None, reason="no make or cc")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """minakova5 exported with its weights in a file, checked (input.bin and reference.bin kept),
    then built by its own Makefile: `make` and `make debug` (the sanitizers)."""
    base = tmp_path_factory.mktemp("main")
    assert main(["plan", "minakova5", "--out", str(base / "p.json")]) == 0
    out = base / "c"
    assert main(["export", str(base / "p.json"), "--out", str(out), "--weights", "file", "--check", "--keep-io", "--runs", "1"]) == 0
    (out / "minakova5").unlink()  # the check's build: `make` builds its own
    subprocess.run(["make", "-s"], cwd=out, check=True, capture_output=True)
    subprocess.run(["make", "-s", "debug"], cwd=out, check=True, capture_output=True)
    return out


def _run(binary: Path, *args: str, cwd: Path, limit=None) -> subprocess.CompletedProcess:
    pre = None
    if limit is not None:
        def pre():
            resource.setrlimit(limit[0], (limit[1], limit[1]))
    return subprocess.run([str(binary), *args], cwd=cwd, capture_output=True, text=True, timeout=60, preexec_fn=pre)


BAD = [
    (["short.bin", "o.bin"], r"input short\.bin: expected 4096 bytes \(float32\), got 100"),
    (["long.bin", "o.bin"], r"input long\.bin: expected 4096 bytes \(float32\), got 8192"),
    (["empty.bin", "o.bin"], r"input empty\.bin: expected 4096 bytes \(float32\), got 0"),
    (["folder", "o.bin"], r"input folder is not a file \(a folder\)"),
    (["missing.bin", "o.bin"], r"cannot read input missing\.bin: No such file or directory"),
    (["input.bin", "o.bin", "two"], r"bad run count 'two': give a whole number from 1 to 1000000"),
    (["input.bin", "o.bin", "0"], r"bad run count '0'"),
    (["input.bin", "o.bin", "99999999999999999999"], r"bad run count '99999999999999999999'"),
    (["input.bin", "o.bin", "1", "short.bin"], r"weights short\.bin: expected \d+ bytes \(float32\), got 100"),
    (["input.bin", "no/such/folder/o.bin"], r"cannot write no/such/folder/o\.bin: No such file or directory"),
    (["input.bin"], r"usage: .* \[-p\] \[-t THREADS\] INPUT\.bin OUTPUT\.bin \[RUNS \[WEIGHTS\.bin\]\]"),
    (["-t", "0", "input.bin", "o.bin"], r"bad thread count '0': give a whole number from 1 to 64"),
    (["-t", "x", "input.bin", "o.bin"], r"bad thread count 'x'"),
]


@needs_make
@pytest.mark.parametrize("program", ["minakova5", "minakova5-debug"])
def test_every_input_error_is_named_and_leaks_nothing(project, program):
    data = (project / "input.bin").read_bytes()
    (project / "short.bin").write_bytes(data[:100])
    (project / "long.bin").write_bytes(data * 2)
    (project / "empty.bin").write_bytes(b"")
    (project / "folder").mkdir(exist_ok=True)
    for args, said in BAD:
        got = _run(project / program, *args, cwd=project)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 2 and len(lines) == 1 and re.match(said, lines[0]), (args, got.returncode, got.stderr)
    ok = _run(project / program, "input.bin", "o.bin", "2", cwd=project)  # weights.bin found beside the program
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr
    import numpy as np

    got, ref = np.fromfile(project / "o.bin", "<f4"), np.fromfile(project / "reference.bin", "<f4")
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


@needs_make
def test_make_is_the_fast_static_build_check_uses(project):
    makefile = (project / "Makefile").read_text()
    assert re.search(r"^CFLAGS \?= (.*)$", makefile, re.M).group(1) == " ".join(DEFAULT_CFLAGS)
    dry = subprocess.run(["make", "-n", "-B", "minakova5"], cwd=project, capture_output=True, text=True, check=True).stdout
    assert " ".join(DEFAULT_CFLAGS) in dry
    static = subprocess.run(["cc", "-static", "-x", "c", "-o", os.devnull, "-"], input="int main(void){return 0;}\n",
                            capture_output=True, text=True).returncode == 0
    assert ("-static" in dry) == static
    file_says = subprocess.run(["file", str(project / "minakova5")], capture_output=True, text=True).stdout if shutil.which("file") else ""
    assert not static or not file_says or "statically linked" in file_says


def _big_arena_model(path: Path) -> Path:
    """One convolution on a 3x256x256 input into 16 channels: a 5 MB arena, few weights."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 3, 3, 3)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 256, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 256, 256])
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "big", [x], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@needs_make
def test_a_memory_limit_below_the_need_is_said_with_the_need(tmp_path):
    model = _big_arena_model(tmp_path / "big.onnx")
    assert main(["plan", str(model), "--out", str(tmp_path / "p.json")]) == 0
    assert main(["export", str(tmp_path / "p.json"), "--out", str(tmp_path / "c"), "--check", "--keep-io", "--runs", "1"]) == 0
    arena = int(re.search(r"#define BIG_ARENA_BYTES (\d+)u", (tmp_path / "c" / "big.h").read_text()).group(1))
    assert arena > 4 * 2**20
    for limit, name in ((resource.RLIMIT_DATA, "RLIMIT_DATA"), (resource.RLIMIT_AS, "RLIMIT_AS")):
        got = _run(tmp_path / "c" / "big", "input.bin", "o.bin", cwd=tmp_path / "c", limit=(limit, 3 * 2**20))
        lines = got.stderr.strip().splitlines()
        assert got.returncode == 4 and len(lines) == 1, got.stderr
        # the rest: two timings of the one run (its wall time and its own time), 8 bytes each
        assert f"this program needs {arena + 16} bytes of data (arena {arena} + the rest)" in lines[0]
        assert f"{name} (ulimit -{'d' if name == 'RLIMIT_DATA' else 'v'}) is {3 * 2**20} bytes" in lines[0]
