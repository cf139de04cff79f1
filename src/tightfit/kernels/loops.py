"""Repeated steps as loops: the one place that turns a partition's steps into the rows of its step
table (tf_step), for the executor and the exported program alike.

A parts or tiled plan runs the same layers over successive row bands or tiles: the same run of steps
again and again, its views' offsets, rows and paddings moving by the same amounts each time. Such a
run becomes one REPEAT row (tf_repeat_args: the `body` rows after it run `count` times) followed by
the body's first iteration; the later iterations are that iteration's arguments plus r times a
per-field step (tf_delta), which tf_run adds to a copy of the arguments as it walks the table. So a
program's tables grow with the layers and the period of the plan, not with the bands or tiles.

Only integer fields move (offsets, sizes, strides, paddings, row numbers); every other field (codes,
floats, activation chains, arrays of operands) must be equal over the run, and the steps must be of
the same layers in the same order."""
from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from tightfit.kernels.library import STRUCTS
from tightfit.kernels.step_args import Args, Array, Struct, View
from tightfit.ops import abi

VIEW_FIELDS = ("off", "n", "c", "h", "w", "sn", "sc", "sh", "sw")
INT_TYPES = (abi.I, abi.N)
# The candidate periods tried at each place: the next occurrences of its first step's layer. A band
# of a parts plan that also steps a downsampled layer has a period of several bands.
TRIES = 64
MIN_COUNT = 2  # iterations that make a loop worth its REPEAT row
# A run repeated this often at the shortest period is taken at once (a tile row's interior tiles),
# rather than a longer period that covers more (whole tile rows): the longer one is then found
# around it, as a loop of loops. Below it, the period covering the most steps is taken.
INNER_COUNT = 3


class CValue(int):
    """An integer whose C text is an expression (sizeof, offsetof): the executor uses the host's
    value, the exported program lets its compiler compute the target's."""

    c: str

    def __new__(cls, value: int, c: str) -> "CValue":
        out = super().__new__(cls, value)
        out.c = c
        return out


@dataclass(frozen=True)
class Flat:
    """A step's arguments split into what may move in a loop (integer fields: their paths and
    values) and what must stay (its layer, kind, struct and every other field)."""

    key: tuple
    paths: tuple[tuple[str, ...], ...]
    ints: tuple[int, ...]


def _walk(ctype: str, values: Sequence, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], object, bool]]:
    """(path, value, movable) for every scalar field of a struct value, nested structs inline."""
    for (name, t), v in zip(abi.STRUCTS[ctype][0], values):
        here = path + (name,)
        if t == abi.VIEW and isinstance(v, View):
            yield from ((here + (f,), x, True) for f, x in zip(VIEW_FIELDS, v.values()))
        elif isinstance(t, str) and t in abi.STRUCTS and not t.endswith("*"):
            yield from _walk(t, v.fields if isinstance(v, Struct) else v, here)
        else:
            yield here, v, t in INT_TYPES and type(v) in (int, np.int32, np.int64)


def flatten(layer: int, a: Args) -> Flat:
    paths, ints, fixed = [], [], []
    for path, v, movable in _walk(a.ctype, a.fields, ()):
        if movable:
            paths.append(path)
            ints.append(int(v))  # type: ignore[call-overload]
        else:
            fixed.append((path, v))
    return Flat((layer, a.kind, a.ctype, tuple(paths), tuple(fixed)), tuple(paths), tuple(ints))


@dataclass(frozen=True)
class Loop:
    """Steps [first, first + body * count): the body's rows `count` times; on iteration r, body row
    j's integer field k is its first iteration's plus r * step[j][k]."""

    first: int
    body: int
    count: int
    steps: tuple[tuple[int, ...], ...]


def find_loops(flats: Sequence[Flat]) -> list[Loop]:
    """The loops of a partition, found greedily from its start: at each step, the period (one of the
    next occurrences of its layer) whose loop covers the most steps."""
    n = len(flats)
    ids: dict[tuple, int] = {}
    sig = np.array([ids.setdefault(f.key, len(ids)) for f in flats], np.int64)
    width = max((len(f.ints) for f in flats), default=0)
    vals = np.zeros((n, max(width, 1)), np.int64)
    for i, f in enumerate(flats):
        vals[i, : len(f.ints)] = f.ints
    where: dict[int, list[int]] = {}
    for i, s in enumerate(sig.tolist()):
        where.setdefault(s, []).append(i)
    loops, i = [], 0
    seq = sig.tolist()
    while i < n:
        best = None
        places = where[seq[i]]
        at = bisect.bisect_right(places, i)
        for k in places[at : at + TRIES]:
            period = k - i
            if i + 2 * period > n:
                break
            if seq[k - 1] != seq[k + period - 1] or seq[i + period // 2] != seq[k + period // 2]:
                continue  # the two blocks differ at their ends or middles: no need to compare them whole
            count = _repeats(sig, vals, i, period)
            if count >= INNER_COUNT:  # the innermost loop first: the ones around it are found over the loops
                best = (count, period)
                break
            if count >= MIN_COUNT and (best is None or count * period > best[0] * best[1]):
                best = (count, period)
        if best is None:
            i += 1
            continue
        count, period = best
        step = vals[i + period : i + 2 * period] - vals[i : i + period]
        loops.append(Loop(i, period, count, tuple(tuple(int(x) for x in row[: len(flats[i + j].ints)])
                                                  for j, row in enumerate(step))))
        i += count * period
    return loops


def _repeats(sig: np.ndarray, vals: np.ndarray, i: int, period: int) -> int:
    """How many times steps [i, i + period) repeat from i, each time the same layers and kinds, each
    integer field moved by the same step."""
    n = len(sig)
    body = sig[i : i + period]
    if not np.array_equal(sig[i + period : i + 2 * period], body):
        return 1
    step = vals[i + period : i + 2 * period] - vals[i : i + period]
    count = 2
    while i + (count + 1) * period <= n:
        a, b = i + count * period, i + (count + 1) * period
        if not (np.array_equal(sig[a:b], body) and np.array_equal(vals[a:b] - vals[a - period : b - period], step)):
            break
        count += 1
    return count


def _offset(ctype: str, path: tuple[str, ...]) -> int:
    """The host's byte offset of a (nested) field."""
    cls, at = STRUCTS[ctype], 0
    for name in path:
        desc = getattr(cls, name)
        at += desc.offset
        cls = dict(cls._fields_)[name]
    return at


MAX_DEPTH = 4  # loops within loops (tf_kernels.c's TF_MAX_LOOPS): a tiled plan's columns within its rows


@dataclass(frozen=True)
class Item:
    """A step, or a loop with its body, as rows of the table; what a loop around it compares."""

    rows: tuple[Args, ...]
    flats: tuple[Flat, ...]  # one per row (a REPEAT row's: all its fields fixed)

    def flat(self) -> Flat:
        return Flat(tuple(f.key for f in self.flats), (), tuple(x for f in self.flats for x in f.ints))


def repeat_args(loop: Loop, body: Sequence[Item]) -> Args:
    """The REPEAT row's arguments: the body's rows and count, and each moving field's step (its
    row within the body, in row order)."""
    deltas, j = [], 0
    for item, steps in zip(body, loop.steps):
        at = 0
        for a, f in zip(item.rows, item.flats):
            size = CValue(ctypes.sizeof(STRUCTS[a.ctype]), f"sizeof({a.ctype})")
            for path, d in zip(f.paths, steps[at : at + len(f.ints)]):
                if d:
                    where = CValue(_offset(a.ctype, path), f"offsetof({a.ctype}, {'.'.join(path)})")
                    deltas.append(Struct("tf_delta", (j, size, where, d)))
            at += len(f.ints)
            j += 1
    return Args("repeat", "tf_repeat_args", (j, loop.count, len(deltas), Array("tf_delta", tuple(deltas))),
                f"the next {j} rows {loop.count} times ({len(deltas)} moving fields)")


def _grouped(items: list[Item], found: list[Loop]) -> list[Item]:
    """`items` with each loop's items replaced by one: its REPEAT row and the body's rows."""
    out: list[Item] = []
    at = 0
    for loop in found:
        out += items[at : loop.first]
        body = items[loop.first : loop.first + loop.body]
        rep = repeat_args(loop, body)
        out.append(Item((rep,) + tuple(a for it in body for a in it.rows),
                        (Flat(("repeat", rep.fields), (), ()),) + tuple(f for it in body for f in it.flats)))
        at = loop.first + loop.body * loop.count
    return out + items[at:]


def table_rows(layers: Sequence[int], args: Sequence[Args]) -> list[Args]:
    """A partition's steps (their layers and kernel arguments) as its table's rows: repeated runs as
    a REPEAT row and their first iteration, runs of those repeated again as loops around them
    (MAX_DEPTH deep), every other step as itself."""
    items = [Item((a,), (flatten(layer, a),)) for layer, a in zip(layers, args)]
    for _ in range(MAX_DEPTH):
        found = find_loops([it.flat() for it in items])
        if not found:
            break
        items = _grouped(items, found)
    return [a for it in items for a in it.rows]


def expand(rows: Sequence[Args]) -> int:
    """The number of steps a table's rows stand for (as tf_run walks them)."""
    return _steps(rows, 0, len(rows))


def _steps(rows: Sequence[Args], i: int, end: int) -> int:
    total = 0
    while i < end:
        a = rows[i]
        if a.kind == "repeat":
            total += a.fields[1] * _steps(rows, i + 1, i + 1 + a.fields[0])
            i += 1 + a.fields[0]
        else:
            total += 1
            i += 1
    return total
