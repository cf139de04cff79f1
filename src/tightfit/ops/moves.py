"""Strided block moves: the one kernel behind the structural ops that only rearrange elements
(Slice, Split, spatial Concat, DepthToSpace, SpaceToDepth).

A step of such an op is a list of Moves, each copying a strided (C, H, W) block of one input
window into a strided block of the output view (batch whole). The kernel library's moves step
takes them as pairs of tf_views (kernels/step_args.py); `apply_moves` applies them to numpy arrays
where the importer checks what a pattern of nodes moves where (ops/rearrange.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


# (start, count, step) along one axis; a negative step walks backwards from `start`.
Span = tuple[int, int, int]


@dataclass(frozen=True)
class Move:
    """Copy block `x` of input `src` (relative to its window view) to block `y` of the output
    view; spans over (C, H, W), the batch whole."""

    src: int
    x: tuple[Span, Span, Span]
    y: tuple[Span, Span, Span]

    def is_empty(self) -> bool:
        return any(count <= 0 for _, count, _ in self.y)


def take(t: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    """The block of an (N, C, H, W) array the spans name, as a view (a negative step walks back)."""
    index: list[slice] = [slice(None)]
    for start, count, step in spans:
        stop = start + count * step
        index.append(slice(start, stop if stop >= 0 else None, step))
    return t[tuple(index)]


def apply_moves(inputs: Sequence[np.ndarray], out: np.ndarray, moves: Sequence[Move]) -> None:
    for m in moves:
        if not m.is_empty():
            take(out, m.y)[...] = take(inputs[m.src], m.x)


def phase_span(o0: int, o1: int, phase: int, block: int) -> tuple[int, int]:
    """Of outputs [o0, o1), those with o % block == phase: (first one's offset from o0, count)."""
    first = o0 + (phase - o0) % block
    return first - o0, max(0, -(-(o1 - first) // block))
