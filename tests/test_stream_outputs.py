"""Streamed outputs (issue 39 point 8): a plan by parts may hand a model output over by rows as
they are computed ('output' steps), so that the arena holds a window of it instead of the whole
tensor. The plan passes the checker only when every element leaves exactly once; the executor
and the exported program give the same outputs as the plan that keeps them whole."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

import tightfit
from tightfit.api import check_export
from tightfit.export import export, generate
from tightfit.export.build import run
from tightfit.export.errors import ExportError
from tightfit.plan.check import check_plan
from tightfit.cli import main
from tightfit.plan.schema import PlanError, read_plan
from tightfit.reference import run_reference
from tightfit.runtime.executor import ArenaExecutor, RowSource
from tightfit.runtime.reference import random_input

from onnx_chains import chain_model

# A tall output (8 x 16 x 16): by parts it is computed a row at a time.
LAYERS = [("conv", 4, 3, 1), ("relu",), ("maxpool", 2), ("conv", 8, 3, 1)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("stream") / "chain.onnx"
    onnx.save(chain_model(LAYERS, [1, 3, 32, 32], seed=3), str(path))
    return str(path)


def _plans(model_file: str):
    kept, graphs = tightfit.api.plan(model_file, method="parts", rows=1)
    streamed, _ = tightfit.api.plan(model_file, method="parts", rows=1, stream_outputs=True)
    return kept, streamed, graphs


def _output_steps(plan):
    return [s for s in plan.steps() if s.kind == "output"]


def test_streamed_plan_holds_a_window_and_runs_the_same(model_file):
    kept, streamed, graphs = _plans(model_file)
    g = graphs[0]
    out = g.outputs[0]
    assert not _output_steps(kept)
    rows = [s.out.region.h for s in _output_steps(streamed)]
    assert sum(rows) == g.shape(out)[2] and max(rows) == 1  # each row handed over once, as computed
    assert streamed.knobs["stream_outputs"] is True
    whole_output = 4 * int(np.prod(g.shape(out)))
    assert streamed.arena_bytes < kept.arena_bytes
    assert streamed.arena_bytes < whole_output  # the arena could not hold the output whole
    x = random_input(g, 1, 7)
    ref = np.asarray(run_reference(g, x)[out])
    y_kept = np.array(ArenaExecutor(kept, graphs, fill_nan=True).run(x)[0][out])
    ex = ArenaExecutor(streamed, graphs, fill_nan=True)
    y = np.array(ex.run(x)[0][out])
    assert np.array_equal(y, y_kept)  # the same kernels on the same rows: the same bits
    assert np.allclose(y, ref, atol=1e-4 * np.abs(ref).max())
    # input by rows, a second run into the same output array
    y2 = np.array(ex.run(RowSource.of(np.asarray(random_input(g, 1, 8))))[0][out])
    assert np.allclose(y2, np.asarray(run_reference(g, random_input(g, 1, 8))[out]), atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("mutation", ["drop", "twice"])
def test_checker_refuses_an_output_not_handed_over_exactly_once(model_file, mutation):
    _, streamed, graphs = _plans(model_file)
    steps = list(streamed.partitions[0].steps)
    last = max(i for i, s in enumerate(steps) if s.kind == "output")
    steps = steps[:last] + steps[last + 1:] if mutation == "drop" else steps[: last + 1] + [steps[last]] + steps[last + 1:]
    bad = replace(streamed, partitions=(replace(streamed.partitions[0], steps=tuple(steps)),))
    with pytest.raises(PlanError, match="exactly once"):
        check_plan(bad, graphs)


def test_checker_refuses_an_output_step_of_another_tensor(model_file):
    _, streamed, graphs = _plans(model_file)
    steps = list(streamed.partitions[0].steps)
    i = next(i for i, s in enumerate(steps) if s.kind == "compute" and s.out.tensor not in graphs[0].outputs)
    steps.insert(i + 1, replace(steps[i], kind="output", layer=-1, inputs=(steps[i].out,), scratch=0))
    bad = replace(streamed, partitions=(replace(streamed.partitions[0], steps=tuple(steps)),))
    with pytest.raises(PlanError, match="output step"):
        check_plan(bad, graphs)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_exported_program_writes_streamed_outputs_as_they_come(model_file, tmp_path):
    """The program writes a streamed output into OUTPUT.bin by rows (its input read by rows, and
    read whole first with -p), equal to the reference; the library's header says which outputs
    stream; a microcontroller project, which reads outputs from the arena, refuses the plan."""
    _, streamed, graphs = _plans(model_file)
    sources = export(streamed, graphs, tmp_path / "out")
    assert sources.streams_outputs
    header = (tmp_path / "out" / f"{sources.name}.h").read_text()
    assert f"{sources.name}_run_cnn_io" in header and f"{sources.name}_output_streamed" in header
    c = check_export(streamed, graphs, sources, tmp_path / "out", cflags=["-std=c99", "-O2"], runs=2)
    assert c.ok, c.max_abs_diff
    g = graphs[0]
    x = random_input(g, 1, 5)
    ref = np.asarray(run_reference(g, x)[g.outputs[0]]).reshape(-1)
    whole = run(c.built.binary, [np.asarray(x)], [ref.size], 3, preload=True)
    assert np.allclose(whole.outputs[0], ref, atol=1e-4 * np.abs(ref).max())
    from tightfit.export.mcu import write_project

    with pytest.raises(ExportError, match="streams its outputs"):
        write_project(tmp_path / "mcu", generate(streamed, graphs, sources.name), "cortex-m7", 512 * 1024, 2 * 1024 * 1024)


@pytest.mark.skipif(shutil.which("musl-gcc") is None, reason="no musl-gcc (Debian's musl-tools) on this machine")
def test_exported_program_built_with_musl(model_file, tmp_path):
    """The program links statically against musl (`--cc musl-gcc`: bench/export.py's MAFAT part)
    and gives the same outputs, its code smaller than glibc's static one."""
    _, streamed, graphs = _plans(model_file)
    sources = export(streamed, graphs, tmp_path / "out")
    c = check_export(streamed, graphs, sources, tmp_path / "out", cc="musl-gcc", cflags=["-std=c99", "-O2"])
    assert c.ok, c.max_abs_diff
    assert c.code_bytes < 512 * 1024  # the kernel library and musl's few pages (glibc's static code alone is ~650 KB)


def test_plan_command_streams_outputs(model_file, tmp_path, capsys):
    from tightfit.cli import main

    path = tmp_path / "plan.json"
    assert main(["plan", model_file, "--method", "parts", "--rows", "2", "--stream-outputs", "--out", str(path)]) == 0
    plan, graphs = tightfit.api.load_plan(Path(path))
    assert _output_steps(plan) and check_plan(plan, graphs).arena_bytes == plan.arena_bytes
    capsys.readouterr()
    assert main(["plan", model_file, "--method", "reuse", "--stream-outputs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stream-outputs goes with --method parts" in err[0]
    assert main(["fit", model_file, "--target", "cortex-m7", "--ram", "256KiB", "--flash", "1MiB", "--export",
                 str(tmp_path / "fw"), "--stream-outputs"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stream-outputs does not go with --target cortex-m7" in err[0]


def test_an_output_the_file_gives_channels_last_is_not_streamed(tmp_path):
    """A .tflite's NHWC map output stays whole under --stream-outputs (its sinks take NCHW rows);
    the plan still runs to TFLite Micro's outputs through the C program."""
    path = Path(__file__).parent / "data" / "map_int8.tflite"
    plan = tmp_path / "plan.json"
    assert main(["plan", str(path), "--method", "parts", "--stream-outputs", "--out", str(plan)]) == 0
    assert not [s for s in read_plan(plan).steps() if s.kind == "output"]
    assert main(["export", str(plan), "--out", str(tmp_path / "c"), "--check"]) == 0
