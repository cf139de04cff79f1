"""Issue 23, point 7: a plan's measured run memory stays within its analysed memory + 64 KiB (the
page granularity of what it touches and the interpreter's own objects) + the uncertainty of the
kernel's per-CPU page counts that VmHWM reads, and --enforce holds the run, and only the run, to
its limit."""
from __future__ import annotations

import numpy as np

from pathlib import Path

import pytest

import tightfit
from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.runtime.executor import RowSource
from tightfit.runtime.measure import measure_subprocess

SLACK = 64 * 1024

PLANS = {
    "minakova5 reuse": dict(model="minakova5"),
    "minakova5 parts": dict(model="minakova5", method="parts"),
    "mobilenet_v1_025 parts rows 2": dict(model="mobilenet_v1_025", method="parts", rows=2, input_shape=(1, 3, 64, 64)),
}
SLOW_PLANS = {
    "mobilenet_v1_025 reuse": dict(model="mobilenet_v1_025", input_shape=(1, 3, 96, 96)),
    "mobilenet_v1_025 tiling": dict(model="mobilenet_v1_025", method="tiling", tiling="0-8:3x3", input_shape=(1, 3, 96, 96)),
    "squeezenet1_0 parts rows 4": dict(model="squeezenet1_0", method="parts", rows=4),
    "mobilenet_v2 parts max": dict(model="mobilenet_v2", method="parts", input_shape=(1, 3, 64, 64)),
}


def _measured_vs_analysed(tmp_path: Path, spec: dict) -> tuple[int, int]:
    """The smallest run memory the measurement allows, and the analysed memory."""
    p, graphs = tightfit.api.plan(**spec)
    path = tmp_path / "plan.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    return m.run_bytes - m.uncertainty_bytes, check_plan(p, graphs).peak_bytes


@pytest.mark.parametrize("name", sorted(PLANS))
def test_measured_within_analysed(name, tmp_path):
    measured, analysed = _measured_vs_analysed(tmp_path, PLANS[name])
    assert measured <= analysed + SLACK, (name, measured, analysed)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW_PLANS))
def test_measured_within_analysed_larger(name, tmp_path):
    for _ in range(3):  # where a run's pages land varies from process to process
        measured, analysed = _measured_vs_analysed(tmp_path, SLOW_PLANS[name])
        assert measured <= analysed + SLACK, (name, measured, analysed)


def test_seeded_rows_written_in_place_are_the_bands():
    """A seeded source writes a region's rows into the buffer through its one line buffer: the
    same values as the bands it delivers, for any region."""
    from tightfit.ops.base import Region

    src = RowSource.seeded((2, 3, 9, 7), seed=5)
    whole = src.whole()
    assert np.array_equal(whole[:, :, 2:6], src.band(2, 6))
    out = np.full((1, 3, 4, 3), np.nan, np.float32)
    region = Region(1, 2, 3, 7, 2, 5)
    src.rows_into(out, region)
    assert np.array_equal(out, region.slice(whole))


def test_enforce_holds_the_run_at_exactly_its_arena(tmp_path, capsys):
    """--enforce with the limit at the plan's analysed memory: the measuring code allocates
    nothing under it, so the run completes; one page less and it is out of memory (one line)."""
    from tightfit.cli import main

    p, graphs = tightfit.api.plan("minakova5")
    analysed = check_plan(p, graphs).peak_bytes
    path = tmp_path / "plan.json"
    path.write_text(schema.dumps(p))
    assert main(["run", str(path), "--enforce", "--limit", str(analysed)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["run", str(path), "--enforce", "--limit", str(analysed - 4096)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "out of memory" in err[0]
