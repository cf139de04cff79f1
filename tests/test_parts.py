"""Processing by parts: plans compiled from the CSDF firing order run with outputs equal to the
reference, pass the checker, and hold only the rows still needed."""
from __future__ import annotations

import pytest
import torch

import tightfit
from tightfit.analysis.csdf import max_phases
from tightfit.cli import main
from tightfit.plan.check import check_plan
from tightfit.plan.parts import phases_for_rows, plan_parts
from tightfit.plan.reuse import PlannedModel, plan_reuse
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.reference import run_reference
from tightfit.verify import compare

# Minakova & Stefanov Table II phase settings on the Fig. 1 CNN (layer 0 = n2, layer 1 = n3).
EXAMPLES = {
    "Ex1": ({}, None),
    "Ex2": ({0: 2}, [24, 8]),
    "Ex3": ({0: 16}, 32),
    "Ex4": ({0: 16, 1: 4}, 32),
}


def _run(plan, g, x):
    return ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_minakova_examples_run_by_parts(example):
    g = tightfit.load("minakova5")
    phases, source = EXAMPLES[example]
    p = plan_parts(PlannedModel(g, "minakova5"), phases, source)
    check_plan(p, [g])
    x = torch.randn(1, 1, 32, 32)
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


def test_ex4_buffers_hold_the_papers_windows():
    """Ex4: b12 = 17 rows x 32, b23 = 6 rows x 16 x 4, b34 = 48, b45 = 2: 978 elements in all."""
    g = tightfit.load("minakova5")
    p = plan_parts(PlannedModel(g, "minakova5"), *EXAMPLES["Ex4"])
    assert [b.nbytes // 4 for b in p.buffers] == [544, 384, 48, 2]
    assert sum(b.nbytes // 4 for b in p.buffers) == 978


@pytest.mark.parametrize("name", ["mobilenet_v1_025", "squeezenet1_0", "resnet18"])
def test_max_phases_run_and_shrink_the_arena(name):
    g = tightfit.load(name)
    p = plan_parts(PlannedModel(g, name), max_phases(g), g.shape(g.inputs[0])[2])
    rep = check_plan(p, [g])
    whole = check_plan(plan_reuse(PlannedModel(g, name)), [g])
    assert rep.arena_bytes < whole.arena_bytes
    x = torch.randn(g.shape(g.inputs[0]))
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_rows_per_phase(rows):
    g = tightfit.load("mobilenet_v1_025")
    phases, source = phases_for_rows(g, rows)
    p = plan_parts(PlannedModel(g, "m"), phases, source, slack_rows=rows % 2)
    check_plan(p, [g])
    x = torch.randn(g.shape(g.inputs[0]))
    assert compare(_run(p, g, x), run_reference(g, x)[g.outputs[0]]).ok


def test_cli_parts_and_bad_phases(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "minakova5", "--method", "parts", "--phases", "0=16,1=4", "--out", str(out)]) == 0
    assert main(["run", str(out), "--verify"]) == 0
    assert "OK" in capsys.readouterr().out
    for argv in (["plan", "minakova5", "--method", "parts", "--phases", "2=4"],
                 ["plan", "minakova5", "--method", "parts", "--phases", "nosuch=2"],
                 ["plan", "minakova5", "--rows", "2"],
                 ["csdf", "minakova5", "--phases", "0=99"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tightfit: error:")


def test_row_source_input_and_measured_peak(tmp_path):
    """The input arrives as row bands; the measured run agrees with the analysed arena."""
    from tightfit.plan import schema
    from tightfit.runtime.executor import RowSource
    from tightfit.runtime.measure import measure_subprocess

    g = tightfit.load("squeezenet1_0")
    phases, source = phases_for_rows(g, 4)
    p = plan_parts(PlannedModel(g, "squeezenet1_0"), phases, source)
    rep = check_plan(p, [g])
    src = RowSource.seeded(g.shape(g.inputs[0]), 3)
    out = ArenaExecutor(p, [g], fill_nan=True).run(src)[0][g.outputs[0]]
    assert compare(out, run_reference(g, src.whole())[g.outputs[0]]).ok
    path = tmp_path / "p.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(m.run_bytes - rep.peak_bytes) <= 0.10 * rep.peak_bytes + 2**20, (m.run_bytes, rep.peak_bytes)
