"""The whole bench set of bench/int8.py through the whole path (issue 40, acceptance: "Slow tests:
the whole bench set"): every model imports, runs bit-exact against its file's runtime (TFLite
Micro's interpreter for the .tflite files, onnxruntime for the QDQ file), plans by parts at half
its reuse peak or less with the reuse plan's outputs (the bench's own rows: bench/inplace.py's
`int8_rows`, in-place ones included), and its parts plan exports with --check on the host; the
Cortex-M7 models (bench/mcu.py's) link for 256 KiB of RAM and run under qemu with the executor's
outputs.

The .tflite files are made once by tensorflow (tensorflow-cpu, the bench extra) and cached
(bench/tflite_models.py); without tensorflow a model whose file is not cached is skipped, saying so.
Slow: about eight minutes on two shared cores; run it alone (`pytest -m slow tests/test_int8_bench.py`)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tflite", reason="the `tflite` flatbuffer schema package is not installed")

from tightfit.cli import main  # noqa: E402
from tightfit.files import write_plan  # noqa: E402
from tightfit.frontend.load import load  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.runtime.executor import ArenaExecutor  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import int8 as bench_int8  # noqa: E402
import mcu as bench_mcu  # noqa: E402
import tflite_models as tm  # noqa: E402
from inplace import int8_rows, quantized_mbv2  # noqa: E402

from int8_models import ort_run  # noqa: E402

MCU = set(bench_mcu.MODELS)
NO_MCU_TOOLS = any(shutil.which(t) is None for t in ("arm-none-eabi-gcc", "qemu-system-arm"))
QDQ = "mbv2-0.35-144"  # bench/mcu.py's QDQ file (torchvision's, quantized by onnxruntime)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("int8bench")


def _tflite(name: str) -> Path:
    try:
        return tm.cached(name)
    except ImportError:
        pytest.skip(f"{name}: tensorflow (tensorflow-cpu, the bench extra) is not installed and "
                    f"{tm.cache_dir() / (name + '.tflite')} is not cached")


def _exact(path: Path, g) -> None:
    """Our int8 run equals the file's own runtime on a seeded input."""
    if path.suffix == ".tflite":
        pytest.importorskip("tflite_micro", reason="the tflite-micro interpreter is not installed")
        x = tm.random_int8(g, 0)
        ours = tm.as_int8_output(g, run_reference(g, tm.as_graph_input(g, x))[g.outputs[0]])
        assert np.array_equal(ours.reshape(-1), tm.tflm_outputs(path.read_bytes(), x).reshape(-1))
    else:
        x = np.random.default_rng(7).standard_normal(g.shape(g.inputs[0]), dtype=np.float32)
        assert np.array_equal(run_reference(g, x)[g.outputs[0]], ort_run(path, x)[0])


def _x(g) -> np.ndarray:
    if g.tensors[g.inputs[0]].dtype == "int8":
        return tm.as_graph_input(g, tm.random_int8(g, 3))
    return np.random.default_rng(3).standard_normal(g.shape(g.inputs[0]), dtype=np.float32)


def _whole_path(path: Path, model: str, tmp_path: Path, capsys) -> None:
    g = load(str(path))
    _exact(path, g)
    rows = int8_rows(path, tiling=False)  # reuse, reuse in-place, parts, parts in-place
    reuse, parts = rows[0], rows[2]
    assert parts.with_input <= reuse.with_input // 2, (model, parts.with_input, reuse.with_input)
    x = _x(g)
    whole = ArenaExecutor(reuse.plan, [g], fill_nan=True).run(x)[0][g.outputs[0]].copy()
    for r in rows[1:]:
        assert np.array_equal(ArenaExecutor(r.plan, [g], fill_nan=True).run(x)[0][g.outputs[0]], whole), r.name
    plan_file = tmp_path / "parts.plan.json"
    write_plan(parts.plan, str(plan_file))
    capsys.readouterr()
    assert main(["export", str(plan_file), "--out", str(tmp_path / "host"), "--check"]) == 0
    assert "outputs: match (max abs diff 0," in capsys.readouterr().out
    if model in MCU and NO_MCU_TOOLS:
        pytest.skip(f"{model}: the host path passed; no Cortex-M toolchain or qemu for its Cortex-M7 run")
    if model in MCU:
        assert main(["export", str(plan_file), "--out", str(tmp_path / "m7"), "--target", "cortex-m7",
                     "--ram", "256KiB", "--flash", "2MiB", "--check"]) == 0
        assert "outputs match (max abs diff 0," in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
@pytest.mark.parametrize("model", bench_int8.MODELS)
def test_tflite_bench_model_end_to_end(model, tmp_path, capsys):
    _whole_path(_tflite(model), model, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.requires_torch
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on this machine")
def test_qdq_bench_model_end_to_end(folder, tmp_path, capsys):
    _whole_path(quantized_mbv2(0.35, 144, folder), QDQ, tmp_path, capsys)
