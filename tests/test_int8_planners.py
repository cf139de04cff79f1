"""Every planner on an int8 graph (issue 40 point 2), on the small QDQ CNN of tests/int8_models.py:
`tightfit fit --budget` at half its reuse arena fits and gives the unsplit int8 run's outputs bit for
bit, as the plan file it writes does when run again; variable batch size gives each sample's
unsplit output; reuse sits at its lower bound and parts and tiling equal the unsplit run
(test_int8._split_runs_equal, here on the QOperator form too)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tightfit import api
from tightfit.cli import main
from tightfit.export import linux
from tightfit.files import load_plan
from tightfit.frontend.onnx_import import load_onnx
from tightfit.plan.check import check_plan
from tightfit.runtime.executor import ArenaExecutor
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse

from int8_models import quantize, small_cnn
from test_int8 import _split_runs_equal


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory) -> Path:
    return quantize(small_cnn(), tmp_path_factory.mktemp("int8_planners") / "small_cnn.onnx")


def _x(g, batch: int = 1) -> np.ndarray:
    return np.random.default_rng(5).standard_normal((batch,) + g.shape(g.inputs[0])[1:], dtype=np.float32)


def _reuse(g, path: Path, batch: int = 1):
    return plan_reuse(PlannedModel(g, str(path), batch), "improve")


def test_fit_at_half_the_reuse_arena_is_bit_exact(cnn_path, tmp_path, capsys):
    g = load_onnx(cnn_path)
    arena = check_plan(_reuse(g, cnn_path), [g]).arena_bytes
    budget = arena // 2
    out = tmp_path / "fit"
    assert main(["fit", str(cnn_path), "--budget", f"{budget}B", "--out", str(out), "--json", "--time-limit", "5"]) == 0
    r = json.loads(capsys.readouterr().out)
    chosen = r["chosen"]
    assert r["fits"] and chosen["memory_bytes"] <= budget < r["reuse_only"]["memory_bytes"], (chosen, budget)
    assert chosen["max_rel_diff_vs_reference"] == 0.0
    plan, graphs = load_plan(out / "plan.json")
    assert check_plan(plan, graphs).arena_bytes <= budget
    x = _x(g)
    whole = ArenaExecutor(_reuse(g, cnn_path), [g]).run(x)[0][g.outputs[0]]
    assert np.array_equal(ArenaExecutor(plan, graphs, fill_nan=True).run(x)[0][g.outputs[0]], whole)


def test_variable_batch_size_gives_each_samples_unsplit_output(cnn_path):
    g = load_onnx(cnn_path)
    one, three = (check_plan(_reuse(g, cnn_path, b), [g]).arena_bytes for b in (1, 3))
    budget = (one + three) // 2
    plan, graphs = api.plan(str(cnn_path), method="vbs", batch=3, budget=budget, time_limit=5)
    assert check_plan(plan, graphs).peak_bytes <= budget
    x = _x(g, 3)
    out = ArenaExecutor(plan, graphs, fill_nan=True).run(x)[0][g.outputs[0]]
    single = ArenaExecutor(_reuse(g, cnn_path), [g])
    for n in range(3):
        assert np.array_equal(out[n:n + 1], single.run(x[n:n + 1])[0][g.outputs[0]])


def test_reuse_parts_and_tiling_on_the_qoperator_form(tmp_path):
    _split_runs_equal(quantize(small_cnn(), tmp_path / "qop.onnx", per_channel=True, qoperator=True))


@pytest.mark.slow
@pytest.mark.skipif(linux.toolchain_problem("aarch64-linux") is not None, reason="no aarch64 toolchain or qemu-aarch64")
@pytest.mark.parametrize("cflags", ["-std=c99 -O2 -march=armv8.2-a+dotprod", "-std=c99 -O2 -DTF_SIMD=0"],
                         ids=["sdot", "portable"])
def test_int8_parts_plan_on_aarch64_equals_the_executor(cnn_path, tmp_path, cflags, capsys):
    """The int8 GEMM's NEON sdot path (armv8.2 dot product) and the portable one, under qemu-aarch64:
    the host executor's outputs exactly."""
    plan = tmp_path / "plan.json"
    assert main(["plan", str(cnn_path), "--method", "parts", "--rows", "2", "--out", str(plan)]) == 0
    assert main(["export", str(plan), "--target", "aarch64-linux", "--out", str(tmp_path / "a64"), "--check",
                 "--cflags", cflags]) == 0
    assert "outputs match (max abs diff 0," in capsys.readouterr().out
