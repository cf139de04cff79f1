"""Fused tiling: every zoo model with tiled groups (coarse with reused overlap, and the finest grid
of the search space) computes the reference outputs and passes the checker; 1x1 groups are the
layer-by-layer plan; reused overlap executes fewer MACs; the predictor's figures equal the
plan's and the measured peak; bad tilings and budgets are one clear error."""
from __future__ import annotations

import pytest

import tightfit
from tightfit.cli import main
from tightfit.errors import BudgetError
from tightfit.frontend import zoo
from tightfit.graph.ir import spatial
from tightfit.plan import schema
from tightfit.plan.check import check_plan
from tightfit.plan.lifetimes import lifetimes
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.reuse.planner import plan_reuse
from tightfit.techniques.tiling import (GRID_LIMIT, TileGroup, TilingError, TilingOptions, candidate_cuts, cut_points, default_grids, executed_macs,
                                  groupable_runs, parse_tiling, plan_point, plan_tiling, search_tiling)
from tightfit.runtime.executor import ArenaExecutor
from tightfit.runtime.measure import measure_subprocess
from tightfit.reference import run_reference
from tightfit.runtime.reference import random_input
from tightfit.verify import compare
from tightfit.techniques.interface import run_memory
from tightfit.units import human

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _out_hw(g, lid: int) -> tuple[int, int]:
    return spatial(g.shape(g.layers[lid].output))


def long_group(g) -> tuple[int, int]:
    """The longest run of tileable layers, ended at the last cut whose tensor is >= 4x4 (so
    tiles overlap)."""
    a, b = max(groupable_runs(g), key=lambda r: r[1] - r[0])
    ends = [p - 1 for p in cut_points(g) if a < p <= b + 1 and min(_out_hw(g, p - 1)) >= 4]
    return a, (ends[-1] if ends else b)


def short_group(g) -> tuple[int, int]:
    """The first group between candidate cuts of the search (a few layers at full resolution)."""
    a, b = long_group(g)
    inner = [p for p in candidate_cuts(g) if a < p <= b + 1 and p in cut_points(g)]
    return a, (inner[0] - 1 if inner else b)


def finest(g, last: int) -> tuple[int, int]:
    h, w = _out_hw(g, last)
    return min(GRID_LIMIT, h), min(GRID_LIMIT, w)


def _run_equal(g, p, x, ref) -> None:
    check_plan(p, [g])
    outs = ArenaExecutor(p, [g], fill_nan=True).run(x)[0]
    for t in g.outputs:
        result = compare(outs[t], ref[t])
        assert result.ok, f"{p.knobs.get('tiling', p.knobs['method'])} output {t}: {result}"


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_tiled(name):
    g = tightfit.load(name)
    model = PlannedModel(g, name)
    a, b = long_group(g)
    s0, s1 = short_group(g)
    # 1x1 groups run layer by layer: the very plan plan_reuse makes.
    one = plan_tiling(model, [TileGroup(a, b, (1, 1))])
    lbl = plan_reuse(model)
    assert one.steps() == lbl.steps() and one.buffers == lbl.buffers and one.arena_bytes == lbl.arena_bytes
    x = random_input(g)
    ref = run_reference(g, x)
    coarse = TileGroup(a, b, (min(2, _out_hw(g, b)[0]), min(3, _out_hw(g, b)[1])), "reuse")
    fine = TileGroup(s0, s1, finest(g, s1), "recompute")
    for p in (plan_tiling(model, [coarse]), plan_tiling(model, [fine])):
        _run_equal(g, p, x, ref)
    # Reused overlap: the rows a tile shares with the tile above are not computed twice.
    recompute = executed_macs(plan_tiling(model, [TileGroup(a, b, coarse.grid)]), [g])
    assert executed_macs(plan_tiling(model, [coarse]), [g]) < recompute


def test_two_groups_with_reuse_and_branches():
    """resnet18: groups over residual blocks (adds read two branches of one tile), one of them
    reusing overlap, another fine; outputs equal the reference."""
    g = tightfit.load("resnet18")
    cuts = [p for p in cut_points(g) if 0 < p < len(g.layers)]
    groups = [TileGroup(0, cuts[2] - 1, (3, 4), "reuse"), TileGroup(cuts[2], cuts[5] - 1, (4, 4))]
    p = plan_tiling(PlannedModel(g, "resnet18"), groups)
    x = random_input(g)
    _run_equal(g, p, x, run_reference(g, x))


def _fake_seconds(plan, steps) -> float:
    """Deterministic stand-in for the cost model: MACs plus a per-step overhead."""
    from tightfit.ops import get_op

    g = GRAPHS[plan.models[0].spec]
    total = 0.0
    for s in steps:
        total += 1e-6
        if s.kind == "compute":
            layer = g.layers[s.layer]
            total += get_op(layer.op).macs(layer, s.out.region, [g.shape(t) for t in layer.inputs],
                                           g.shape(layer.output)) * 1e-10
    return total


GRAPHS: dict = {}


@pytest.mark.parametrize("name", ["tiny-yolov2", "mobilenet_v2"])
def test_search_prediction_equals_plan(name):
    """The search's assembled prediction (per-group memory and time, max and sum over segments)
    equals the analysed figures of the chosen configuration's own plan, which fits the budget."""
    g = GRAPHS.setdefault(name, tightfit.load(name))
    model = PlannedModel(g, name)
    budget = plan_reuse(model).arena_bytes // 4
    found = search_tiling(model, _fake_seconds, budget, options=TilingOptions(max_groups=2, grids=default_grids(4), front_points=3))
    assert found.fits and found.chosen.memory_bytes <= budget and found.chosen.config.groups
    assert [p.memory_bytes for p in found.front] == sorted(p.memory_bytes for p in found.front)
    p = plan_tiling(model, found.chosen.config.groups)
    rep = check_plan(p, [g])
    assert found.chosen.memory_bytes == rep.lower_bound + rep.scratch_peak
    assert found.chosen.seconds[0] == pytest.approx(_fake_seconds(p, p.steps()))


@pytest.mark.parametrize("name, tiling", [("yolov2-16", "0-7:4x4:reuse,8-15:2x2"), ("mobilenet_v2", "0-11:4x4,12-22:2x2:reuse")])
def test_measured_peak_agrees(name, tiling, tmp_path):
    """Predicted (analysed) run memory of a tiled plan vs a measured run in a fresh process:
    within 5%, at most 1 MiB unexplained."""
    g = tightfit.load(name)
    p = plan_tiling(PlannedModel(g, name), parse_tiling(tiling, g))
    rep = check_plan(p, [g])
    path = tmp_path / "plan.json"
    path.write_text(schema.dumps(p))
    m = measure_subprocess({"kind": "plan", "plan": str(path)})
    assert abs(m.run_bytes - rep.peak_bytes) <= max(0.05 * rep.peak_bytes, 2**20), (m.run_bytes, rep.peak_bytes)


def test_search_below_every_configuration():
    g = GRAPHS.setdefault("mobilenet_v1_025", tightfit.load("mobilenet_v1_025"))
    found = search_tiling(PlannedModel(g, "mobilenet_v1_025"), _fake_seconds, 1000, options=TilingOptions(max_groups=2, grids=default_grids(3), front_points=0))
    assert not found.fits and found.chosen.memory_bytes == found.smallest_bytes > 1000


@pytest.mark.parametrize("text, message", [
    ("0-99:2x2", "not layer ids"),
    ("0-3:0x2", "grid 0x2"),
    ("0-3:2x2:sometimes", "overlap 'sometimes'"),
    ("0-4:2x2,2-4:2x2", "overlap"),
    ("0-3", "cannot read tiling group"),
    ("0-29:1x1", "needs whole samples"),  # the global pooling
    ("3-5:2x2", "read 2 tensors"),  # starts inside a residual block
    ("0-3:2x2", "used after layer 3"),  # ends inside one
])
def test_bad_tilings(text, message):
    g = tightfit.load("resnet18")
    with pytest.raises(TilingError, match=message):
        parse_tiling(text, g)


def test_cli_tiling_and_errors(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "minakova5", "--method", "tiling", "--tiling", "0-1:2x2:reuse", "--out", str(out)]) == 0
    p = schema.loads(out.read_text())
    assert p.knobs["tiling"] == "0-1:2x2:reuse" and p.knobs["method"] == "tiling"
    assert main(["plan", "minakova5", "--method", "tiling", "--tiling", "0-9:2x2"]) == 2
    assert main(["plan", "minakova5", "--method", "tiling"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tightfit: error: ") for line in err)


def test_budget_below_every_configuration_is_one_line_carrying_the_smallest():
    with pytest.raises(BudgetError, match="smallest reachable needs") as caught:
        tightfit.api.plan("minakova5", "tiling", budget=100)
    smallest = caught.value.smallest
    assert smallest.knobs["method"] == "tiling" and run_memory(smallest) > 100
    assert human(run_memory(smallest)) in str(caught.value)


@pytest.mark.parametrize("name", ["tiny-yolov2", "resnet18"])
def test_reuse_computes_every_row_once(name):
    """Tiles one row band high with reused overlap (each tile computes only the rows below
    those computed above, and needs its inputs only for them): no row of any tensor is computed
    twice, so the executed MACs equal the layer-by-layer plan's; outputs equal the reference."""
    g = tightfit.load(name)
    model = PlannedModel(g, name)
    a, b = long_group(g)
    group = TileGroup(a, b, (_out_hw(g, b)[0], 1), "reuse")
    p = plan_tiling(model, [group])
    assert executed_macs(p, [g]) == executed_macs(plan_reuse(model), [g])
    x = random_input(g)
    _run_equal(g, p, x, run_reference(g, x))


def test_narrow_border_columns_and_streamed_bands():
    """Border columns `clear_edge` wide: the other columns' tiles never reach the left or right
    border (so they pad no side); a tile loads its input in one step, asking a row-band source
    for bands no larger than half the tile buffer they fill (or one row); outputs equal the
    reference, from a whole input and from a row-band source."""
    from tightfit.techniques.tiling import clear_edge, tile_regions
    from tightfit.ops.base import Region
    from tightfit.runtime.executor import RowSource

    g = tightfit.load("tiny-yolov2")
    h, w = _out_hw(g, 9)
    edge = clear_edge(g, TileGroup(0, 9, (h, 5), "reuse"))
    assert edge > 0
    group = parse_tiling(f"0-9:{h}x5:reuse:edge{edge}", g)[0]
    assert group.edge == edge and group.spec() == f"0-9:{h}x5:reuse:edge{edge}"
    for c0 in range(edge, w - edge):  # every column of the inner grid columns
        need = tile_regions(g, group, Region(0, 1, 0, 1, c0, c0 + 1), 1)
        assert all(r.w0 > 0 and r.w1 < spatial(g.shape(t))[1] for t, r in need.items())
    p = plan_tiling(PlannedModel(g, "tiny-yolov2"), [group])
    inputs = [s for s in p.steps() if s.kind == "input"]
    row_band = 2 * 3 * spatial(g.shape(g.inputs[0]))[1] * 4
    assert len(inputs) == len({s.out.region for s in inputs})  # one input step per tile
    assert all(s.scratch % row_band == 0 and (2 * s.scratch <= p.buffers[s.out.buffer].nbytes or s.scratch == row_band)
               for s in inputs)
    assert any(s.out.region.h > s.scratch // row_band for s in inputs)  # some tiles take several bands
    x = random_input(g)
    _run_equal(g, p, x, run_reference(g, x))
    source = RowSource.seeded(g.shape(g.inputs[0]))
    outs = ArenaExecutor(p, [g], fill_nan=True).run(source)[0]
    ref = run_reference(g, source.whole())
    assert all(compare(outs[t], ref[t]).ok for t in g.outputs)


def test_bad_border_columns():
    g = tightfit.load("tiny-yolov2")
    with pytest.raises(TilingError, match="border columns"):
        parse_tiling("0-9:4x2:edge2", g)


def test_fine_space_below_the_coarse_space():
    """A budget below every configuration of the coarse space (cuts after downsampling, grids up
    to 3x3) opens the fine space (every cut point, one- or two-row tiles with reuse, narrow border
    columns), which fits it; the prediction equals the chosen plan's analysed figures."""
    name = "minakova5"
    g = GRAPHS.setdefault(name, tightfit.load(name))
    model = PlannedModel(g, name)
    coarse = search_tiling(model, _fake_seconds, None, options=TilingOptions(max_groups=2, grids=default_grids(3), overlaps=("reuse",), front_points=0))
    budget = coarse.smallest_bytes - 1
    found = search_tiling(model, _fake_seconds, budget, options=TilingOptions(max_groups=2, grids=default_grids(3), overlaps=("reuse",), front_points=0, parts=False))
    assert found.fits and found.chosen.memory_bytes <= budget
    p = plan_tiling(model, found.chosen.config.groups)
    rep = check_plan(p, [g])
    assert found.chosen.memory_bytes == rep.lower_bound + rep.scratch_peak
    x = random_input(g)
    _run_equal(g, p, x, run_reference(g, x))


def test_parts_configuration_beside_the_tile_space():
    """The search's parts configuration (the whole network by parts, from the parts search) is a
    candidate beside the tile configurations: at its memory it is chosen (faster than the fine
    tiles that also fit there), its plan is the one predicted, checks, and computes the reference
    outputs. Without `parts` the search still fits that budget on fine tiles: our kernels need no
    scratch, so minakova5's one-row tiles with reuse reach below its parts."""
    name = "minakova5"
    g = GRAPHS.setdefault(name, tightfit.load(name))
    model = PlannedModel(g, name)
    options = dict(max_groups=2, grids=default_grids(3), front_points=0)
    budget = search_tiling(model, _fake_seconds, 1, options=TilingOptions(**options)).smallest_bytes
    found = search_tiling(model, _fake_seconds, budget, options=TilingOptions(**options))
    assert found.fits and found.chosen.config.parts is not None and not found.chosen.config.groups
    assert found.chosen.memory_bytes <= budget and found.chosen.config.spec.startswith("parts ")
    tiles = search_tiling(model, _fake_seconds, budget, options=TilingOptions(parts=False, **options))
    assert tiles.fits and tiles.chosen.config.parts is None and tiles.chosen.memory_bytes <= budget
    p = plan_point(model, found.chosen)
    rep = check_plan(p, [g])
    assert found.chosen.memory_bytes == rep.lower_bound + rep.scratch_peak
    x = random_input(g)
    _run_equal(g, p, x, run_reference(g, x))


def test_overlay_group_shares_its_input_rows():
    """yolov2-16's last four layers read a 38x38x256 tensor and write one: overlaid, the group's
    output lies at most a few rows below its input, on the rows the tiles are done with (with
    reused overlap, the rows a tile needs again are in strips: no lag at all)."""
    g = tightfit.load("yolov2-16")
    model = PlannedModel(g, "yolov2-16")
    plain = plan_tiling(model, parse_tiling("12-15:19x1:reuse", g))
    over = plan_tiling(model, parse_tiling("12-15:19x1:reuse:overlay", g))
    guest = next(b for b in over.buffers if b.overlay is not None)
    host = over.buffers[guest.overlay[0]]
    assert guest.shape == host.shape == (1, 256, 38, 38) and -guest.nbytes // 8 < guest.overlay[1] <= 0

    def group_peak(plan) -> int:
        live = lifetimes(plan, [g]).live_bytes()
        return max(v for s, v in zip(plan.steps(), live) if s.layer >= 12)

    assert check_plan(over, [g]) and group_peak(over) < group_peak(plain) - host.nbytes * 3 // 4
    x = random_input(g)
    _run_equal(g, over, x, run_reference(g, x))


def test_overlay_group_across_channel_counts():
    """Layers 8-11 read 128 channels and write 256: the output still goes over the input's dead
    rows (the checker tags cells of the common 128 channels)."""
    g = tightfit.load("yolov2-16")
    over = plan_tiling(PlannedModel(g, "yolov2-16"), parse_tiling("8-11:19x1:reuse:overlay", g))
    guest = next(b for b in over.buffers if b.overlay is not None)
    assert (guest.shape[1], over.buffers[guest.overlay[0]].shape[1]) == (256, 128)
    check_plan(over, [g])
    x = random_input(g)
    _run_equal(g, over, x, run_reference(g, x))


@pytest.mark.parametrize("text,message", [
    ("0-11:19x2:reuse:overlay", "input and output whole"),  # the model input arrives by tiles
    ("12-13:19x1:reuse:overlay,14-15:19x1:reuse:overlay", "group before it not overlaid"),
])
def test_bad_overlays(text, message):
    g = tightfit.load("yolov2-16")
    with pytest.raises(TilingError, match=message):
        plan_tiling(PlannedModel(g, "yolov2-16"), parse_tiling(text, g))
