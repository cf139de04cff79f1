"""Threads in the kernel library (tf_run's `threads`): a convolution's or pooling's output rows are
shared among the threads, every other step runs on the caller's thread. The outputs must be the same bits at any
thread count, in the executor and in the exported program; an input that fails mid-run fails the
run (no thread left waiting); a build without threads (-DTF_THREADS=0, a microcontroller's) runs
the same steps on one thread."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

import tightfit
from tightfit.api import plan_inputs
from tightfit.export import export
from tightfit.export.build import build, run
from tightfit.graph.ir import Graph, Layer, Tensor
from tightfit.graph.ir import Graph, Layer, Tensor
from tightfit.kernels import library
from tightfit.ops import abi, op_names
from tightfit.reference import run_reference
from tightfit.runtime import executor
from tightfit.runtime.executor import ArenaExecutor, RowSource
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.tolerance import compare

from test_export_aarch64 import _draw, _one_input_fits, case_graph

STRESS_RUNS = 60  # the race this catches hung the old code within 300 runs under load
PLANS = [("mobilenet_v1_025", {"method": "reuse"}), ("mobilenet_v1_025", {"method": "parts", "rows": 2}),
         ("mobilenet_v1_025", {"method": "tiling", "tiling": "0-5:3x3:reuse"}), ("minakova5", {"method": "parts", "rows": 1})]


def _outputs(plan, graphs, xs, threads: int) -> list[dict[str, np.ndarray]]:
    ex = ArenaExecutor(plan, graphs, threads=threads, fill_nan=True)
    return [{k: v.copy() for k, v in o.items()} for o in ex.run(xs)]


@pytest.mark.parametrize("model, kw", PLANS, ids=[f"{m}-{kw['method']}" for m, kw in PLANS])
def test_executor_outputs_are_the_same_bits_at_any_thread_count(model, kw):
    plan, graphs = tightfit.api.plan(model, **kw)
    xs = plan_inputs(graphs, plan)
    one = _outputs(plan, graphs, xs, 1)
    for threads in (2, 3, 7):
        for m, outs in enumerate(_outputs(plan, graphs, xs, threads)):
            for k, v in outs.items():
                assert np.array_equal(v, one[m][k]), f"{model} {kw}: {threads} threads changed output {k}"


@pytest.mark.parametrize("op_name", [n for n in op_names() if n in ("conv", "conv_transpose", "maxpool", "avgpool")])
def test_drawn_cases_are_the_same_bits_on_three_threads(op_name):
    """Strides, dilations, groups, pads and regions of every kind the op-case table draws."""
    for i, case in enumerate(_draw(op_name, 30)):
        g, x = case_graph(case, f"{op_name}_{i}")
        one, three = run_reference(g, x)[g.outputs[0]], run_reference(g, x, threads=3)[g.outputs[0]]
        assert np.array_equal(one, three, equal_nan=True), f"{op_name} attrs {dict(case.layer.attrs)} in {case.in_shapes}"


def test_a_failing_input_fails_the_threaded_run():
    """Many times over, at 2 to 4 threads: a thread that saw the failure too early (a status read
    after waking, not at the meeting) left the others waiting forever, now and then."""
    plan, graphs = tightfit.api.plan("mobilenet_v1_025", method="parts", rows=2)
    shape = graphs[0].shape(graphs[0].inputs[0])
    good = RowSource.seeded(shape, 1)

    def band(h0: int, h1: int) -> np.ndarray:
        if h1 > shape[2] // 2:
            raise ValueError("the camera stopped")
        return good.band(h0, h1)

    said: list[str] = []

    def runs() -> None:
        for i in range(STRESS_RUNS):
            try:
                ArenaExecutor(plan, graphs, threads=2 + i % 3).run(RowSource(shape, band))
                said.append("no error")
            except ValueError as e:
                said.append(str(e))

    worker = threading.Thread(target=runs, daemon=True)  # a deadlock fails the test, not the suite
    worker.start()
    worker.join(timeout=300)
    assert not worker.is_alive(), f"a threaded run hung after {len(said)} runs whose input failed"
    assert said == ["the camera stopped"] * STRESS_RUNS
    ArenaExecutor(plan, graphs, threads=2).run(good)  # the library is left usable: the next run completes
    assert library.library().tf_threads() > 1


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_exported_program_threads_and_a_build_without_them(tmp_path):
    plan, graphs = tightfit.api.plan("mobilenet_v1_025", method="tiling", tiling="0-5:3x3:reuse")
    sources = export(plan, graphs, tmp_path / "out", name="m", weights="file")
    xs = plan_inputs(graphs, plan)
    sizes = [int(np.prod(v.shape)) for o in _outputs(plan, graphs, xs, 1) for v in o.values()]
    weights = tmp_path / "out" / "weights.bin"
    built = build(tmp_path / "out", sources.name)
    one = run(built.binary, xs, sizes, weights=weights)
    for threads in (2, 4):
        many = run(built.binary, xs, sizes, weights=weights, threads=threads)
        assert all(np.array_equal(a, b) for a, b in zip(one.outputs, many.outputs)), f"-t {threads} changed the outputs"
    single = build(tmp_path / "out", sources.name, cflags=["-std=c99", "-O2", "-DTF_THREADS=0"])
    alone = run(single.binary, xs, sizes, weights=weights, threads=4)  # asks for 4, runs on one
    assert all(compare(b, a).ok for a, b in zip(one.outputs, alone.outputs))
    symbols = subprocess.run(["nm", str(single.binary)], capture_output=True, text=True).stdout
    assert "tf_run" in symbols and "pthread_create" not in symbols  # no threads linked in


def test_run_plan_threads_on_the_cli(tmp_path, capsys):
    from tightfit.cli import main

    path = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--out", str(path)]) == 0
    assert main(["run", str(path), "--threads", "2", "--verify"]) == 0
    assert main(["run", str(path), "--threads", "0"]) == 2
    assert "--threads" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="no arm-none-eabi-gcc on this machine")
def test_a_microcontroller_build_has_no_threads(tmp_path):
    """arm-none-eabi has no __unix__: the library builds without pthreads, with no flag to pass."""
    from tightfit.kernels.library import SOURCES

    obj = tmp_path / "k.o"
    subprocess.run(["arm-none-eabi-gcc", "-mthumb", "-mcpu=cortex-m7", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-c", str(SOURCES[0]), "-o", str(obj)], check=True, capture_output=True)
    undefined = subprocess.run(["arm-none-eabi-nm", "-u", str(obj)], capture_output=True, text=True, check=True).stdout
    assert "pthread" not in undefined and "memcpy" in undefined  # it calls out, but to no thread function


def test_fit_threads_parses_and_a_fit_on_two_threads_verifies(tmp_path, capsys, monkeypatch):
    """`fit --threads 2`: the option reaches FitOptions, the chosen plan's verify, its timing and its
    measuring process run on two threads, and the report says the count its fps were measured at."""
    from tightfit import cli, stages
    from tightfit.cli import main
    from tightfit.options import FitOptions

    argv = ["fit", "minakova5", "--budget", "5kB", "--threads", "2"]
    assert cli.fit_options(cli.build_parser().parse_args(argv)) == FitOptions("minakova5", 5000, time_limit=60.0, threads=2)
    made = []
    real = stages.ArenaExecutor

    def counted(*args, **kw):
        made.append(kw.get("threads", 1))
        return real(*args, **kw)

    monkeypatch.setattr(stages, "ArenaExecutor", counted)
    out = tmp_path / "out"
    assert main(argv + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    report = (out / "report.json").read_text()
    assert '"threads": 2' in report and "fps (2 threads)" in text
    assert made and set(made) == {2}  # verify, the choice's timings and the fps: every run on two threads
    assert main(["fit", "minakova5", "--budget", "5kB", "--threads", "0"]) == 2


# --- every kind of step that threads share, split finely ----------------------------------------

# op -> the step kind (ops/abi.py's STEP) its kernel runs, for the ops whose steps threads share
SHARED_OPS = {"conv": "conv", "maxpool": "pool", "avgpool": "pool", "add": "eltwise", "mul": "eltwise",
              "eltwise": "eltwise", "batchnorm": "affine", "gemm": "gemm", "transpose": "copy"}


@pytest.fixture(scope="module")
def fine_library(tmp_path_factory):
    """The library built to share every step it can split, however small (-DTF_SHARE_MIN=0: the drawn
    cases are a few hundred multiply-adds), with tf_split_of, which says how a step would be split."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    path = tmp_path_factory.mktemp("fine") / "tf_kernels_fine.so"
    subprocess.run([compiler, *library.FLAGS, "-DTF_SHARE_MIN=0", "-DTF_TEST_HOOKS", "-o", str(path),
                    str(library.SOURCES[0]), "-lm"], check=True, capture_output=True)
    lib = library._declare(ctypes.CDLL(str(path)))
    lib.tf_split_of.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    lib.tf_split_of.restype = ctypes.c_int
    return lib


def _split_kinds(ex: ArenaExecutor, lib, threads: int) -> set[str]:
    """The kinds of the executor's steps (input steps aside: they need their sources) that `threads`
    threads would share."""
    kinds = {v: k for k, v in abi.STEP.items()}
    table = ex.frames[0][0].table
    rows = table.arrays["tf_step"]
    return {kinds[int(rows["kind"][i])] for i in range(table.count)
            if kinds[int(rows["kind"][i])] != "input" and lib.tf_split_of(table.address + i * rows.dtype.itemsize, None, threads)}


def _same_bits_split_finely(g: Graph, x: np.ndarray, lib, kind: str, what: str) -> bool:
    """Whether a `kind` step of g is split; asserts that g gives the same bits on 2, 3 and 5 threads
    as on one."""
    one = run_reference(g, x)[g.outputs[0]]
    for threads in (2, 3, 5):
        many = run_reference(g, x, threads=threads)[g.outputs[0]]
        assert np.array_equal(one, many, equal_nan=True), f"{what} at {threads} threads"
    ex = ArenaExecutor(plan_reuse(PlannedModel(g, g.name, int(x.shape[0])), planner="improve", layout="nhwc"), [g])
    return kind in _split_kinds(ex, lib, 2)


@pytest.fixture
def split_finely(fine_library, monkeypatch):
    """The executor on the fine library (its input steps' tf_tensor_rows too, so that they are shared)."""
    monkeypatch.setattr(executor, "library", lambda: fine_library)
    monkeypatch.setattr(executor, "tensor_input", lambda: ctypes.cast(fine_library.tf_tensor_rows, ctypes.c_void_p).value)
    return fine_library


@pytest.mark.parametrize("op_name", sorted(SHARED_OPS))
def test_every_shared_kind_gives_the_same_bits_split_finely(op_name, split_finely):
    """Drawn cases of each op whose kernel threads share, on 2, 3 and 5 threads with every step shared
    however small (rows, pixels of partial rows, panels, outputs, the input's rows): the same bits as
    one thread; and the drawn cases do split that op's steps."""
    cases = [c for c in _draw(op_name, 100) if _one_input_fits(c)][:40]
    split = 0
    for i, case in enumerate(cases):
        g, x = case_graph(case, f"{op_name}_{i}")
        what = f"{op_name} attrs {dict(case.layer.attrs)} in {case.in_shapes}"
        split += _same_bits_split_finely(g, x, split_finely, SHARED_OPS[op_name], what)
    assert split >= 3, f"only {split} of {len(cases)} drawn {op_name} cases had a step split: the test would not see a bad split"


@pytest.mark.parametrize("shape", [(1, 3, 7, 5), (2, 16, 4, 9), (1, 5, 2, 1)])
def test_a_concatenation_over_channels_gives_the_same_bits_split_finely(shape, split_finely):
    """The drawn concatenations mostly join along H or W (block moves, on one thread): this one along C."""
    layer = Layer(0, "cat", "concat", ("X", "X"), "Y", {"act": (), "axis": 1, "sizes": (shape[1], shape[1])})
    out = (shape[0], 2 * shape[1], *shape[2:])
    g = Graph("cat", (layer,), {"X": Tensor("X", shape), "Y": Tensor("Y", out)}, ("X",), ("Y",), {})
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert _same_bits_split_finely(g, x, split_finely, "concat", f"concat of {shape}")
