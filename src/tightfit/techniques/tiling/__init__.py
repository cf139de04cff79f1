"""Fused tiling (Farley & Gerstlauer's MAFAT, DeepThings' fused tile partitioning, generalised):
a group of consecutive layers runs tile by tile over an N x M grid of its output, so the
group's intermediates hold one tile instead of the whole tensor. groups.py: where groups may go
and how they are written; planner.py: the planner (pure: graph and groups in, Plan out);
config_search.py: the configuration search.

A group is a run of layers [first, last] with one input tensor and one output tensor (branches
inside, residual adds and concats, are allowed). For each output tile the receptive fields are
walked backwards through the group with each op's `input_windows`: every intermediate tensor's
region is the bounding box of what its consumers in the group read. Because an op's input rows
depend only on its output rows and its input columns only on its output columns, that region's
rows depend only on the tile's grid row and its columns only on the grid column.

Buffers: the group's input and output tensors are whole (as layer by layer); every intermediate
region of a tile has its own dense "tile" buffer of exactly its shape, live only within the tile,
so the offset planner reuses the same bytes from tile to tile. Dense buffers matter: oneDNN
convolves straight into a dense channels-last view and allocates nothing, while a window of a
whole-width buffer is strided and falls back to a result temporary and a weight reorder. So a
tile narrower than the tensor copies its window of the group input into a tile buffer first
(as DeepThings does) and computes its output tile into a tile buffer that a copy step then
writes into the whole output (a model output is written in place: the caller reads it whole
from one buffer, so its steps pay the strided kernel's temporaries, counted as scratch).

Overlap: with "recompute" every tile computes its whole regions (MAFAT). With "reuse" tiles run
column by column (top to bottom), and every layer computes only the rows below those the tiles
above computed, so each row is computed once per column and a layer needs its input only for
its new rows plus their halo (a tile of a deep group then holds a band, not the whole cone of
its receptive field). The rows a tile below needs again are copied into a small strip buffer;
that tile copies them back into the top of its own tile buffer. The computed rows are a
full-width band of the tile buffer, so kernels still write dense views. Column overlap is
recomputed (a reused column strip would make the computed part a strided view).

Below its space of tilings (a budget no coarse grid fits), the search also considers the whole
network by parts (techniques/parts/planner.py, found by the parts search): the limit the fine tilings approach,
row bands of the full width, but each layer with its own band height and a stream cut where a
tensor is held whole, which tiles of one grid per group cannot express. Such a configuration
has no groups; its `parts` says how it runs.
"""
from __future__ import annotations

from dataclasses import replace

from tightfit.techniques.interface import PlannedModel
from tightfit.plan.schema import Plan
from tightfit.techniques.interface import Config, Front, Point, Problem, Technique, _distinct, technique
from tightfit.techniques.tiling.planner import clear_edge, draft_tiling, executed_macs, plan_tiling, tile_regions
from tightfit.techniques.tiling.groups import (OVERLAPS, TileGroup, TilingError, check_groups, cut_points, downsampling_cuts,
                                               format_tiling, group_problem, groupable_runs, parse_tiling, tileable)
from tightfit.techniques.tiling.config_search import (GRID_LIMIT, TilingOptions, TilingSearch, TilingSetting, candidate_cuts,
                                                      cost_seconds,
                                                      default_grids, fine_groups, plan_point, search_tiling, smallest_key,
                                                      step_memory, tiling_point)

__all__ = ["GRID_LIMIT", "OVERLAPS", "TileGroup", "TilingError", "TilingOptions", "TilingSearch", "TilingSetting", "candidate_cuts",
           "check_groups", "clear_edge", "cost_seconds", "cut_points", "default_grids", "downsampling_cuts", "draft",
           "draft_tiling", "executed_macs", "fine_groups", "format_tiling", "group_problem", "groupable_runs",
           "parse_tiling", "plan_point", "plan_tiling", "search", "search_tiling", "smallest_key", "step_memory",
           "tile_regions", "tileable", "tiling_point"]


def draft(model: PlannedModel, config: Config) -> Plan:
    """The plan of `config.settings` "groups" (TileGroups) or "tiling" (the CLI's spec, e.g.
    "0-7:5x5,8-15:2x2:reuse"), placed by `config.planner` (None: unplaced)."""
    if config.get("by_parts"):  # a configuration of the search below its tilings: the network by parts
        return technique("parts").draft(model, config)
    groups = config.get("groups")
    if groups is None:
        groups = parse_tiling(config.get("tiling"), model.graph)
    if config.planner is None:
        return draft_tiling(model, groups, config.layout, config.dtype)
    return plan_tiling(model, groups, config.planner, config.layout, config.dtype)


def config_of(setting: TilingSetting, layout: str = "nhwc", dtype: str = "fp32", planner: str | None = None) -> Config:
    """The Config that drafts a tiling search's configuration (tiled groups, or parts)."""
    if setting.parts is not None:
        return Config(layout, dtype, planner, settings=dict(setting.parts.settings, by_parts=True))
    return Config(layout, dtype, planner, settings=dict(groups=tuple(setting.groups)))


def search(problem: Problem) -> Front | None:
    """The tiling search (config_search.search_tiling) for the budget. As one of fit's sources (`brief`):
    two groups at most and a short front, so that it costs about what the parts search does, the
    small grids and few cuts on a CNN searched quickly; it offers its pick and the smallest
    configuration reached, if tiled. It times segments of plans, so it needs a prediction of steps
    (`steps_seconds`); without one, or without a budget in `brief`, it offers nothing."""
    from tightfit.techniques.tiling import config_search

    if problem.budget_bytes is None and problem.brief or not hasattr(problem.predict, "steps_seconds"):
        return None
    g, c = problem.model.graph, problem.config
    options = dict(problem.settings)
    if problem.brief:
        options.update(max_groups=2, timed_per_segment=1, front_points=0, parts=False)
        if problem.quick:
            options.update(grids=default_grids(QUICK_GRID_LIMIT), cuts=candidate_cuts(g, QUICK_CUTS))
    found = config_search.search_tiling(problem.model, cost_seconds(problem.predict, g), problem.budget_bytes,
                                        options=TilingOptions(**options), layout=c.layout, dtype=c.dtype,
                                        deadline=problem.deadline, progress=problem.progress)
    smallest = min(found.points or (found.chosen,), key=smallest_key)

    def point(p: Point, exact: bool = False) -> Point:
        return replace(p, config=config_of(p.config, c.layout, c.dtype), exact=exact)

    first = point(smallest, not found.timed_out)
    return Front(tuple(point(p) for p in found.front), first if found.chosen == smallest else point(found.chosen),
                 first, found.fits, found.evaluated, found.timed_out, found)


def offered(front: Front) -> list[Point]:
    """What fit takes from a brief search: the smallest and the pick, if they tile groups."""
    return [p for p in _distinct(front.smallest, front.chosen) if p.config.get("groups")]


# fit's quick search of a large CNN: grids up to this and this many cuts
QUICK_GRID_LIMIT = 4
QUICK_CUTS = 4

TECHNIQUE = Technique("tiling", "groups of layers tile by tile (fused tiling: MAFAT, DeepThings)", draft, search,
                      fit_source=True, offered=offered)
