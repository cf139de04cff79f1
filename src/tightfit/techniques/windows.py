"""An op's input windows and workspace bytes for a region, memoised per graph.

Both depend only on the layer, the output region and the shapes, and a search asks the same
questions for every plan it builds (the same bands of the same layers in each setting it tries;
the tile a group's receptive-field walk sized is then computed with the same region). Answers are
kept per graph (the graph is held, so its id is not reused) and dropped when there are many.
"""
from __future__ import annotations

from typing import Sequence

from tightfit.graph.ir import Graph, Layer
from tightfit.ops import get_op
from tightfit.ops.registry import step_workspace
from tightfit.ops.base import InputWindow, Region

LIMIT = 1_000_000  # answers kept over all graphs before the memo starts again

_MEMO: dict[int, tuple[Graph, dict]] = {}


def _memo(graph: Graph) -> dict:
    held = _MEMO.get(id(graph))
    if held is None or held[0] is not graph:
        if sum(len(m) for _, m in _MEMO.values()) > LIMIT:
            _MEMO.clear()
        held = _MEMO[id(graph)] = (graph, {})
    return held[1]


def clear() -> None:
    """Forget every answer (a timing that must not profit from an earlier search)."""
    _MEMO.clear()


def input_windows(graph: Graph, layer: Layer, region: Region, in_shapes: Sequence[tuple[int, ...]]) -> tuple[InputWindow, ...]:
    """get_op(layer.op).input_windows(layer, region, in_shapes), memoised."""
    memo = _memo(graph)
    key = (layer.id, region, tuple(in_shapes))
    found = memo.get(key)
    if found is None:
        found = memo[key] = get_op(layer.op).input_windows(layer, region, in_shapes)
    return found


def workspace_bytes(graph: Graph, layer: Layer, region: Region, in_shapes: Sequence[tuple[int, ...]],
                    out_shape: tuple[int, ...], itemsize: int, dense_out: bool, channels_last: bool = False) -> int:
    """get_op(layer.op).workspace_bytes(...) of the torch kernels, memoised."""
    memo = _memo(graph)
    key = ("scratch", layer.id, region, tuple(in_shapes), out_shape, itemsize, dense_out, channels_last)
    found = memo.get(key)
    if found is None:
        found = memo[key] = step_workspace(layer, region, in_shapes, out_shape, itemsize, "none", dense_out, channels_last)
    return found
