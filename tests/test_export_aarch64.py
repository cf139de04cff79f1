"""The aarch64-linux target of the C export (export/linux.py): the host program cross-compiled with
aarch64-linux-gnu-gcc, run under qemu-aarch64, its outputs equal to the Python executor's.

Every registered op runs, drawn from the op-case table (tests/test_ops.py's CASES): each drawn case
becomes a one-CNN graph (an op reading several inputs reads slices of one input, as the exported
program takes one input per CNN), and all of them one application plan, exported once and built
twice: with the NEON kernels (aarch64's default flags) and with the portable ones (-DTF_SIMD=0), each
run on one thread and on three (the same bits). The program says which path it ran (tf_simd), so a
build that silently fell back to the portable path fails. A zoo model's parts plan runs end to end
through `tightfit export --check` (slow: mobilenet_v1_025's reuse and tiled plans, both paths,
through api.check_export_linux)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tightfit.cli import main
from tightfit.export import generate, linux
from tightfit.export.build import run
from tightfit.graph.ir import Graph, Layer, Tensor
from tightfit.plan.check import check_plan
from tightfit.reference import run_reference
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.tolerance import compare

from test_ops import CASES, FLOAT_OPS, Case

TARGET = "aarch64-linux"
PROBLEM = linux.toolchain_problem(TARGET)
needs_toolchain = pytest.mark.skipif(PROBLEM is not None, reason=f"{TARGET}: {PROBLEM}")
QUICK_EXAMPLES = 8     # cases drawn per op in the default run
LONG_EXAMPLES = 100    # in the slow run


def _draw(op_name: str, count: int) -> list[Case]:
    """The first `count` cases hypothesis draws for the op (derandomized: the same every run)."""
    drawn: list[Case] = []

    @settings(max_examples=count, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(CASES[op_name])
    def collect(case):
        drawn.append(case)

    collect()
    return drawn[:count]


def _slices(case: Case) -> tuple[np.ndarray, list[Layer], dict[str, Tensor]]:
    """One input holding every distinct operand of the case side by side over channels, and the
    layers that take each operand back out of it (slice, then flatten for a rank-2 operand)."""
    names = list(dict.fromkeys(case.layer.inputs))
    arrays = {n: case.inputs[case.layer.inputs.index(n)] for n in names}
    as4 = {n: a.reshape(a.shape + (1,) * (4 - a.ndim)) for n, a in arrays.items()}
    assert len({a.shape[0] for a in as4.values()}) == 1, "operands of different batch sizes"
    x = np.zeros((case.inputs[0].shape[0], sum(a.shape[1] for a in as4.values()), max(a.shape[2] for a in as4.values()),
                  max(a.shape[3] for a in as4.values())), np.float32)
    layers, tensors, at = [], {"X": Tensor("X", x.shape)}, 0
    for name, a in as4.items():
        x[:, at : at + a.shape[1], : a.shape[2], : a.shape[3]] = a
        out = f"{name}_4d" if arrays[name].ndim == 2 else name
        layers.append(Layer(len(layers), f"take_{name}", "slice", ("X",), out,
                            {"begin": (at, 0, 0), "step": (1, 1, 1), "size": a.shape[1:]}))
        tensors[out] = Tensor(out, a.shape)
        if arrays[name].ndim == 2:
            layers.append(Layer(len(layers), f"flat_{name}", "flatten", (out,), name, {"axis": 1}))
            tensors[name] = Tensor(name, arrays[name].shape)
        at += a.shape[1]
    return x, layers, tensors


def case_graph(case: Case, label: str) -> tuple[Graph, np.ndarray]:
    """The case as a one-input graph and the input to run it on (the case's own, in its domain)."""
    layer, out_shape = case.layer, case.out_shape()
    if len(set(layer.inputs)) == 1:
        x, before, tensors = case.inputs[0], [], {layer.inputs[0]: Tensor(layer.inputs[0], case.in_shapes[0])}
        inputs = (layer.inputs[0],)
    else:
        x, before, tensors = _slices(case)
        inputs = ("X",)
    main_layer = Layer(len(before), layer.name, layer.op, layer.inputs, layer.output, layer.attrs, layer.params)
    tensors = tensors | {layer.output: Tensor(layer.output, out_shape)}
    graph = Graph(label, (*before, main_layer), tensors, inputs, (layer.output,), dict(zip(layer.params, case.params)))
    return graph, np.ascontiguousarray(x, np.float32)


def _one_input_fits(case: Case) -> bool:
    """Whether the case's operands fit one NCHW input side by side (a case of one operand always
    does; several must be of rank 4 or less: the rank 5-6 ones run in tests/test_ops.py)."""
    return len(set(case.layer.inputs)) == 1 or all(a.ndim <= 4 for a in case.inputs)


def op_application(count: int) -> tuple[list[Graph], list[np.ndarray], list[str]]:
    graphs, inputs, what = [], [], []
    for op_name in FLOAT_OPS:
        for i, case in enumerate([c for c in _draw(op_name, 4 * count) if _one_input_fits(c)][:count]):
            g, x = case_graph(case, f"{op_name}_{i}")
            graphs.append(g)
            inputs.append(x)
            what.append(f"{op_name} case {i}: attrs {dict(case.layer.attrs)} inputs {case.in_shapes}")
    return graphs, inputs, what


def check_ops_on_aarch64(tmp_path: Path, count: int) -> None:
    graphs, inputs, what = op_application(count)
    assert {g.name.rsplit("_", 1)[0] for g in graphs} == set(FLOAT_OPS)  # int8 ops: tests/test_int8.py
    plan = plan_reuse([PlannedModel(g, g.name, int(x.shape[0])) for g, x in zip(graphs, inputs)], layout="nhwc")
    check_plan(plan, graphs)
    refs = [run_reference(g, x)[g.outputs[0]] for g, x in zip(graphs, inputs)]
    sources = generate(plan, graphs, "ops")
    target = linux.linux_target(TARGET)
    for simd, width in ((True, target.simd_width), (False, 0)):
        folder = tmp_path / ("neon" if simd else "portable")
        folder.mkdir()
        linux.write_files(sources, folder, TARGET)
        built = linux.build_for(TARGET, folder, sources.name, linux.cflags(target, simd))
        ran = run(built.binary, inputs, [r.size for r in refs], launcher=linux.launcher(TARGET))
        assert ran.simd == width, f"the {'NEON' if simd else 'portable'} build ran kernels of vector width {ran.simd}"
        bad = [f"{w}: max abs diff {c.max_abs_diff:.3g} > {c.tolerance:.3g}"
               for w, got, ref in zip(what, ran.outputs, refs) if not (c := compare(got.reshape(ref.shape), ref)).ok]
        assert not bad, f"{folder.name} kernels under qemu-aarch64 differ from the executor's:\n" + "\n".join(bad)
        threaded = run(built.binary, inputs, [r.size for r in refs], launcher=linux.launcher(TARGET), threads=3)
        moved = [w for w, a, b in zip(what, ran.outputs, threaded.outputs) if not np.array_equal(a, b, equal_nan=True)]
        assert not moved, f"{folder.name} kernels on 3 threads under qemu-aarch64 changed:\n" + "\n".join(moved)


@needs_toolchain
def test_every_op_on_aarch64_neon_and_portable(tmp_path):
    check_ops_on_aarch64(tmp_path, QUICK_EXAMPLES)


@needs_toolchain
@pytest.mark.slow
def test_every_op_on_aarch64_at_length(tmp_path):
    check_ops_on_aarch64(tmp_path, LONG_EXAMPLES)


@needs_toolchain
def test_zoo_parts_plan_exported_for_aarch64_and_checked(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--method", "parts", "--rows", "1", "--out", str(plan)]) == 0
    capsys.readouterr()
    out = tmp_path / "fw"
    assert main(["export", str(plan), "--target", TARGET, "--out", str(out), "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and report["check"]["simd"] == 4, report["check"]
    assert report["target"] == TARGET
    makefile = (out / "Makefile").read_text()
    assert "aarch64-linux-gnu-gcc" in makefile and "-march=native" not in makefile
    assert (out / "main.c").read_text().count("tf_simd()") == 1  # the host program as it is


@needs_toolchain
@pytest.mark.slow
@pytest.mark.parametrize("kw", [{"method": "reuse"}, {"method": "tiling", "tiling": "0-5:3x3:reuse"}], ids=["reuse", "tiling"])
def test_mobilenet_v1_025_on_aarch64_neon_and_portable(tmp_path, kw):
    import tightfit

    plan, graphs = tightfit.api.plan("mobilenet_v1_025", **kw)
    target = linux.linux_target(TARGET)
    for simd in (True, False):
        folder = tmp_path / str(simd)
        sources = generate(plan, graphs, "m", weights="file")
        folder.mkdir()
        linux.write_files(sources, folder, TARGET)
        got = tightfit.api.check_export_linux(plan, graphs, sources, folder, TARGET, linux.cflags(target, simd))
        assert got.ok and got.simd == (target.simd_width if simd else 0), got.lines()


@needs_toolchain
def test_portable_flags_through_the_cli_and_the_folders_makefile(tmp_path, capsys):
    plan, out = tmp_path / "plan.json", tmp_path / "fw"
    assert main(["plan", "minakova5", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "--target", TARGET, "--out", str(out), "--check", "--json", "--keep-io",
                 "--cflags", "-std=c99 -O2 -DTF_SIMD=0"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["ok"] and report["check"]["simd"] == 0, report["check"]
    if shutil.which("make") is None:
        pytest.skip("no make: the folder's Makefile is not run")
    # The folder's own build: `make portable`, run under qemu on the kept input.
    done = subprocess.run(["make", "-C", str(out), "portable"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    program = out / f"{report['name']}-portable"
    ran = subprocess.run([*linux.launcher(TARGET), str(program), str(out / "input.bin"), str(tmp_path / "o.bin")],
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and ran.stdout.rstrip().endswith("simd 0"), ran.stdout + ran.stderr
    got, ref = np.fromfile(tmp_path / "o.bin", "<f4"), np.fromfile(out / "reference.bin", "<f4")
    assert compare(got, ref).ok


def test_fit_exports_for_aarch64(tmp_path, capsys):
    # a budget reuse meets: the case is the export target, not the search (a 5 s search at 5 kB misses under load)
    out = tmp_path / "fw"
    assert main(["fit", "minakova5", "--budget", "8KiB", "--target", TARGET, "--export", str(out), "--time-limit", "5"]) == 0
    assert f"for {TARGET}" in capsys.readouterr().out
    assert "aarch64-linux-gnu-gcc" in (out / "Makefile").read_text()
    assert main(["fit", "minakova5", "--budget", "5kB", "--target", TARGET]) == 2
    assert "goes with --export" in capsys.readouterr().err


def test_missing_toolchain_is_one_line(tmp_path, capsys, monkeypatch):
    plan = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--out", str(plan)]) == 0
    capsys.readouterr()
    absent = linux.LinuxTarget(TARGET, "no-such-aarch64-gcc", "no-such-qemu", "/nonexistent", ("-O2",), 4, "gcc-x qemu-x")
    monkeypatch.setitem(linux.TARGETS, TARGET, absent)
    linux.toolchain_problem.cache_clear()
    try:
        code = main(["export", str(plan), "--target", TARGET, "--out", str(tmp_path / "fw"), "--check"])
    finally:
        linux.toolchain_problem.cache_clear()
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "no-such-aarch64-gcc" in err, err
    assert not (tmp_path / "fw").exists()  # whole or nothing


@pytest.mark.parametrize("extra, says", [(["--ram", "512KiB"], "--ram and --flash go with a cortex-m target"),
                                         (["--check", "--sanitize"], "--sanitize goes with the host target")])
def test_aarch64_option_errors(tmp_path, capsys, extra, says):
    plan = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "--target", TARGET, "--out", str(tmp_path / "fw"), *extra]) == 2
    assert says in capsys.readouterr().err
