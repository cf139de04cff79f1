"""Overlays (plan/overlay.py): a whole tensor written into the dead rows of one still being read.
The checker's cell simulation is the proof; these tests check that it accepts what the pass
builds, rejects an overlay moved onto live rows, and that overlaid plans compute the reference."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import block_positions
from tightfit.techniques.parts.planner import PartsOptions, plan_parts
from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import PlanError
from tightfit.runtime.executor import ArenaExecutor
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.verify import compare
from onnx_chains import chain_graph


# A VGG stage in miniature: a whole conv, a conv and a pool by parts, a whole conv. The pool's
# output (8 channels, like the first conv's) is written while the first conv's output is still read.
STAGE = (("conv", 8, 3, 1), ("relu",), ("conv", 8, 3, 1), ("relu",), ("maxpool", 2), ("conv", 8, 3, 1))


PHASES = {1: 16, 2: 8}  # the second conv one row at a time, the pool likewise


@pytest.fixture(scope="module")
def stage():
    g = chain_graph(STAGE, (1, 1, 16, 16), "stage")
    return g, PlannedModel(g, "stage")


def _guest(plan) -> schema.Buffer:
    return next(b for b in plan.buffers if b.overlay is not None)


def test_overlay_takes_dead_rows_and_computes_the_reference(stage):
    g, model = stage
    with_overlay, without = plan_parts(model, PHASES), plan_parts(model, PHASES, options=PartsOptions(overlay=False))
    guest = _guest(with_overlay)
    host = with_overlay.buffers[guest.overlay[0]]
    assert guest.shape[1:] == (8, 8, 8) and host.shape[1:] == (8, 16, 16)  # the pool's output in the first conv's
    assert block_positions(with_overlay.buffers)[guest.id] == (host.id, guest.overlay[1])
    assert check_plan(with_overlay, [g]).peak_bytes < check_plan(without, [g]).peak_bytes
    x = random_input(g)
    out = ArenaExecutor(with_overlay, [g], fill_nan=True).run(x)[0][g.outputs[0]]
    assert compare(out, run_reference(g, x)[g.outputs[0]]).ok


def _moved(plan, guest, shift: int):
    host = plan.buffers[guest.overlay[0]]
    moved = replace(guest, overlay=(host.id, shift), offsets=(host.offsets[0] + shift,))
    return replace(plan, buffers=tuple(moved if b.id == guest.id else b for b in plan.buffers))


def test_checker_rejects_an_overlay_on_rows_still_read(stage):
    g, model = stage
    plan = plan_parts(model, PHASES)
    guest = _guest(plan)
    host = plan.buffers[guest.overlay[0]]
    # The pool's output moved to the host's last rows: its first rows land on rows the second
    # conv has not read yet.
    late = _moved(plan, guest, host.nbytes - guest.nbytes)
    with pytest.raises(PlanError, match="do not hold it"):
        check_plan(late, [g])


def test_checker_rejects_an_overlay_that_lies_elsewhere(stage):
    g, model = stage
    plan = plan_parts(model, PHASES)
    guest = _guest(plan)
    stray = replace(plan, buffers=tuple(replace(b, offsets=(b.offsets[0] + 64,)) if b.id == guest.id else b
                                        for b in plan.buffers))
    with pytest.raises(PlanError, match="lies at"):
        check_plan(stray, [g])
    cells = _moved(plan, guest, guest.overlay[1] + 4)  # not a whole cell (8 channels x 4 bytes)
    with pytest.raises(PlanError, match="whole cells"):
        check_plan(cells, [g])


def test_overlay_survives_json(stage):
    g, model = stage
    plan = plan_parts(model, PHASES)
    again = schema.loads(schema.dumps(plan))
    assert again.buffers == plan.buffers
    check_plan(again, [g])


def test_overlays_need_steps_that_run_one_after_another(stage):
    g, model = stage
    plan = plan_parts(model, PHASES)
    steps = plan.partitions[0].steps
    half = len(steps) // 2
    split = replace(plan, partitions=(replace(plan.partitions[0], steps=steps[:half]),
                                      replace(plan.partitions[0], id=1, steps=steps[half:])), concurrent=((0, 1),))
    with pytest.raises(PlanError, match="one after another"):
        check_plan(split, [g])


# VGG's stage boundary in miniature: a pooled 4-channel tensor held whole, then two convs by
# parts doubling the channels and a pool, whose 8-channel output at half the width has the bytes
# per row of the 4-channel tensor (VGG 19: pool2 128 x 56 and pool3 256 x 28).
DOUBLING = (("conv", 4, 3, 1), ("relu",), ("maxpool", 2), ("conv", 8, 3, 1), ("relu",), ("conv", 8, 3, 1), ("relu",),
            ("maxpool", 2), ("conv", 8, 3, 1))


DOUBLING_PHASES, HELD = {0: 32, 1: 16, 2: 16, 3: 16, 4: 8}, (1,)


@pytest.fixture(scope="module")
def doubling():
    g = chain_graph(DOUBLING, (1, 1, 32, 32), "doubling")
    return g, PlannedModel(g, "doubling")


def test_overlay_across_channel_counts_computes_the_reference(doubling):
    g, model = doubling
    plan = plan_parts(model, DOUBLING_PHASES, 32, options=PartsOptions(held=HELD))
    guest = _guest(plan)
    host = plan.buffers[guest.overlay[0]]
    assert (guest.shape[1], host.shape[1]) == (8, 4)  # the second pool's output in the first pool's
    assert check_plan(plan, [g]).peak_bytes < check_plan(plan_parts(model, DOUBLING_PHASES, 32, options=PartsOptions(held=HELD, overlay=False)),
                                                         [g]).peak_bytes
    x = random_input(g)
    out = ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]
    assert compare(out, run_reference(g, x)[g.outputs[0]]).ok


def test_checker_tags_overlays_across_channel_counts_by_their_common_cell(doubling):
    g, model = doubling
    plan = plan_parts(model, DOUBLING_PHASES, 32, options=PartsOptions(held=HELD))
    guest = _guest(plan)
    host = plan.buffers[guest.overlay[0]]
    # Half a guest position (4 channels, the common cell) later than the host's last rows: its
    # last cells land on host rows still to be read.
    late = _moved(plan, guest, host.nbytes - guest.nbytes + 16)
    with pytest.raises(PlanError, match="do not hold it"):
        check_plan(late, [g])
    with pytest.raises(PlanError, match="whole cells"):
        check_plan(_moved(plan, guest, guest.overlay[1] + 4), [g])  # one channel: not a common cell


def test_a_held_tensor_is_whole_and_complete_before_it_is_read(doubling):
    g, model = doubling
    plan = plan_parts(model, DOUBLING_PHASES, 32, options=PartsOptions(held=HELD, overlay=False))
    streamed = plan_parts(model, DOUBLING_PHASES, 32, options=PartsOptions(overlay=False))
    tensor = g.layers[HELD[0]].output
    steps = plan.steps()
    writes = [i for i, s in enumerate(steps) if s.out.tensor == tensor]
    reads = [i for i, s in enumerate(steps) if any(a.tensor == tensor for a in s.inputs)]
    assert len(writes) == DOUBLING_PHASES[HELD[0]] and max(writes) < min(reads)
    assert plan.buffers[steps[writes[0]].out.buffer].kind == "whole"
    assert streamed.buffers[next(s.out.buffer for s in streamed.steps() if s.out.tensor == tensor)].kind == "window"
    assert plan.knobs["held"] == list(HELD)
    check_plan(plan, [g])
    x = random_input(g)
    out = ArenaExecutor(plan, [g], fill_nan=True).run(x)[0][g.outputs[0]]
    assert compare(out, run_reference(g, x)[g.outputs[0]]).ok
