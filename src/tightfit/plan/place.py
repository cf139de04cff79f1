"""Placing a draft plan's buffers in the arena with an offset planner (by name)."""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from tightfit.errors import OptionError
from tightfit.graph.ir import Graph
from tightfit.plan.lifetimes import block_positions, lifetimes
from tightfit.plan.offsets import PLANNERS, arena_bytes
from tightfit.plan.schema import Plan


def planner_names() -> list[str]:
    return sorted(PLANNERS) + ["naive"]


def _naive(reqs, extra=()) -> tuple[int, ...]:
    """Every buffer after the previous one: no reuse (the DL-framework baseline)."""
    out, top = [], 0
    for r in reqs:
        out.append(top)
        top += -(-r.size // 64) * 64
    return tuple(out)


def place(draft: Plan, graphs: Sequence[Graph], planner: str = "improve") -> Plan:
    """The draft's buffers get offsets from `planner`; lifetimes and conflicts come from the steps."""
    if planner not in planner_names():
        raise OptionError(f"unknown planner {planner!r}; choose from {', '.join(planner_names())}")
    life = lifetimes(draft, graphs)
    offsets = (_naive if planner == "naive" else PLANNERS[planner])(life.reqs, life.extra)
    per_buffer: dict[int, list[int]] = {}
    for (b, _), off, start in zip(life.keys, offsets, life.starts):
        per_buffer.setdefault(b, []).append(off - start)
    for b, (root, pos) in block_positions(draft.buffers).items():  # an overlay lies where its block says
        per_buffer[b] = [per_buffer.get(root, [0])[0] + pos]
    buffers = tuple(replace(b, offsets=tuple(per_buffer.get(b.id, [0] * b.copies))) for b in draft.buffers)
    return replace(draft, buffers=buffers, arena_bytes=arena_bytes(life.reqs, offsets))
