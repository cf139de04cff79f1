"""Coarse tiling spaces cut around layers that cannot be tiled: a model whose first layer is a
layout transpose has no coarse group unless a cut follows the transpose, and every budget below
layer by layer then went to the fine space (issue 20). (A leading transpose from NHWC is now
absorbed at import, so the transpose here swaps H and W.)"""
from __future__ import annotations

from onnx_chains import chain_graph
from tightfit.techniques.interface import PlannedModel
from tightfit.techniques.tiling import TilingOptions, candidate_cuts, search_tiling, tileable


# a transpose of H and W, then a VGG-like chain
BODY = (("conv", 16, 3, 1), ("relu",), ("conv", 16, 3, 1), ("relu",), ("maxpool", 2), ("conv", 32, 3, 1), ("relu",),
        ("maxpool", 2), ("conv", 32, 3, 1))


def test_a_cut_follows_a_layer_that_cannot_be_tiled_and_the_coarse_space_fits():
    g = chain_graph(BODY, (1, 3, 64, 64), "nhwc", swap_hw=True)
    assert not tileable(g, 0) and all(tileable(g, l.id) for l in g.layers[1:])
    assert 1 in candidate_cuts(g)
    model = PlannedModel(g, "nhwc")
    seconds = lambda plan, steps: 1e-4 * len(steps)  # noqa: E731
    whole = search_tiling(model, seconds, None, options=TilingOptions(overlaps=("recompute",), front_points=0, parts=False)).chosen
    # Recomputed overlap only, no parts: the fine space (reused overlap) cannot answer, the coarse must.
    found = search_tiling(model, seconds, whole.memory_bytes // 2, options=TilingOptions(overlaps=("recompute",), front_points=0, parts=False))
    assert found.fits and found.chosen.config.groups and found.chosen.config.groups[0].first == 1
