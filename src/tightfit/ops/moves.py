"""Strided block moves: the one kernel behind the structural ops that only rearrange elements
(Slice, Split, spatial Concat, DepthToSpace, SpaceToDepth).

A step of such an op is a list of Moves, each copying a strided (C, H, W) block of one input
window into a strided block of the output view (batch whole). The Python executor applies them
with torch views; the C export turns the same moves into pairs of tf_views (export/codegen.py),
so both back ends run one description of the op.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

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


def take(t: torch.Tensor, spans: Sequence[Span]) -> torch.Tensor:
    """The block of an (N, C, H, W) tensor the spans name: a view, except that a negative step
    flips (a copy: torch views have no negative strides)."""
    index: list[slice] = [slice(None)]
    flip: list[int] = []
    for dim, (start, count, step) in enumerate(spans, start=1):
        last = start + (count - 1) * step
        if step > 0:
            index.append(slice(start, last + 1, step))
        else:
            index.append(slice(last, start + 1, -step))
            flip.append(dim)
    block = t[tuple(index)]
    return block.flip(flip) if flip else block


def apply_moves(inputs: Sequence[torch.Tensor], out: torch.Tensor, moves: Sequence[Move]) -> None:
    for m in moves:
        if not m.is_empty():
            take(out, m.y).copy_(take(inputs[m.src], m.x))


def flipped_bytes(moves: Sequence[Move], batch: int, itemsize: int) -> int:
    """The largest temporary `apply_moves` makes: a block read with a negative step."""
    return max((batch * m.y[0][1] * m.y[1][1] * m.y[2][1] * itemsize
                for m in moves if any(step < 0 for _, _, step in m.x)), default=0)


def phase_span(o0: int, o1: int, phase: int, block: int) -> tuple[int, int]:
    """Of outputs [o0, o1), those with o % block == phase: (first one's offset from o0, count)."""
    first = o0 + (phase - o0) % block
    return first - o0, max(0, -(-(o1 - first) // block))
