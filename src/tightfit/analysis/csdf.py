"""CNN-to-CSDF conversion (Minakova & Stefanov, Algorithm 1), buffer sizes, SDF3 and DOT export.

A layer with P phases computes its H output rows in P parts (a row band per phase). The model:

- **Actors**: one per layer (`L<id>`), one source per graph input (`in`; the paper's n1, which
  may deliver its rows by parts) and one sink per graph output (`out`; the paper's n5). Several
  inputs or outputs are numbered (`in0`, `in1`, ...).
- **Channels**: one per (producer, consumer) pair, the paper's per-edge model: a tensor read by
  three layers is three channels; a layer reading one tensor in two operand slots has one
  channel. Multi-input layers (add, concat, mul) have one input channel per input tensor.
  Tokens are elements x itemsize (bytes; at itemsize 1 they are elements, as in Table II).
- **Production** of a layer at phase p: its output rows of that phase x W x C (Alg. 1 l. 30-31).
- **Consumption** at phase p: the NEW input rows of the phase's input window (the op registry's
  `input_windows`, so stride, padding, dilation and crop are exact) not consumed by an earlier
  phase, counted from the end of what was consumed before. Rows a phase needs that an earlier
  phase consumed are held in the self-loop channel c_jj (Alg. 1 l. 16-18, 24-27): the actor
  produces them into c_jj at the end of phase p and consumes them again at phase p+1.
- **Crop** (negative padding) is consumed and discarded by the phase that reaches it, exactly as
  the paper's v23(1) = (5 - (-1)) * 16 * 4 = 384 and v23(4) = (3 - (-1)) * 16 * 4 = 256 (Alg. 1
  l. 33 and 38/42): the first phase consumes every row from row 0 to its window's end (so the
  cropped top rows, and rows a stride skips, are consumed with it), and the last phase consumes
  every remaining row to the bottom of the tensor (the cropped bottom rows, trailing rows no
  window reads), which empties the FIFO and keeps the model consistent. Zero padding at the
  true border is not data and is never consumed (the paper's "part of X_jp not provided by
  padding").

So over one iteration (every actor runs its phase sequence once: repetition vector all ones)
each edge channel carries exactly its tensor: sum(U) = sum(V) = N x C x H x W x itemsize, and
each self-loop carries back what it took: U_jj(p) = V_jj(p + 1), U_jj(P) = V_jj(1) = 0.

Layers that need their whole input (op not splittable: dense, global pooling, softmax, flatten,
...; and the squeeze-excitation product, an elementwise layer with an operand broadcast over the
rows) have one phase.
"""
from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field
from fractions import Fraction
from math import gcd, prod
from typing import Callable, Collection, Iterable, Mapping, Sequence
from xml.sax.saxutils import quoteattr

from tightfit.errors import OptionError
from tightfit.graph.ir import Graph, Layer, spatial
from tightfit.ops import get_op
from tightfit.ops.base import Region


class CSDFError(ValueError):
    """A CSDF graph that is inconsistent (unbalanced rates, malformed sequences): a bug in the
    conversion, never a user error."""


@dataclass(frozen=True)
class Actor:
    """One CSDF actor. `rows_per_phase[p]` output rows (source: delivered rows) at phase p+1."""

    name: str
    layer_id: int | None
    phases: int
    rows_per_phase: tuple[int, ...]
    kind: str = "layer"  # "source", "layer" or "sink"
    label: str = ""      # layer name, or the graph input/output tensor name
    op: str = ""
    macs: tuple[int, ...] = ()  # per phase; the default execution times of the SDF3 export


@dataclass(frozen=True)
class Channel:
    """A FIFO channel. `production[p]` tokens written by `src` at its phase p+1, `consumption[p]`
    read by `dst` at its phase p+1. An edge channel carries `tensor`; a self-loop (src == dst)
    holds the overlapping rows of the edge channel named by `carries` between phases."""

    name: str
    src: str
    dst: str
    production: tuple[int, ...]
    consumption: tuple[int, ...]
    initial_tokens: int = 0
    tensor: str | None = None
    carries: str | None = None

    @property
    def is_self_loop(self) -> bool:
        return self.src == self.dst


@dataclass(frozen=True, eq=False)
class CSDFGraph:
    name: str
    actors: tuple[Actor, ...]
    channels: tuple[Channel, ...]
    # tokens of each edge channel's tensor (one inference): what the balance check expects
    tensor_tokens: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_actors", {a.name: a for a in self.actors})
        object.__setattr__(self, "_channels", {c.name: c for c in self.channels})

    def actor(self, name: str) -> Actor:
        return self._actors[name]  # type: ignore[attr-defined]

    def channel(self, name: str) -> Channel:
        return self._channels[name]  # type: ignore[attr-defined]

    def layer_actor(self, layer_id: int) -> Actor:
        return next(a for a in self.actors if a.layer_id == layer_id)

    @property
    def edges(self) -> tuple[Channel, ...]:
        return tuple(c for c in self.channels if not c.is_self_loop)

    @property
    def self_loops(self) -> tuple[Channel, ...]:
        return tuple(c for c in self.channels if c.is_self_loop)

    def edge(self, src: str, dst: str) -> Channel:
        """The edge channel from actor `src` to actor `dst` (the paper's c_ij)."""
        for c in self.channels:
            if c.src == src and c.dst == dst and not c.is_self_loop:
                return c
        raise KeyError(f"no channel {src} -> {dst}")

    def self_loop(self, actor: str) -> Channel | None:
        """The self-loop of a single-input actor (the paper's c_jj), or None."""
        loops = [c for c in self.channels if c.is_self_loop and c.src == actor]
        if len(loops) > 1:
            raise KeyError(f"actor {actor} has {len(loops)} self-loops; pick by name")
        return loops[0] if loops else None


# --- phases -----------------------------------------------------------------------------------

def _rows(shape: Sequence[int]) -> int:
    return spatial(tuple(shape))[0]


def _row_tokens(shape: Sequence[int], itemsize: int, batch: int | None) -> int:
    """Tokens in one row (all samples, W and C) of a tensor; tensors without H are one row."""
    n = shape[0] if batch is None else batch
    if len(shape) == 4:
        return n * shape[1] * shape[3] * itemsize
    return n * prod(shape[1:]) * itemsize


def _describe(layer: Layer) -> str:
    return f"layer {layer.id} ({layer.name}, {layer.op})"


def needs_whole_input(graph: Graph, layer: Layer) -> bool:
    """True for layers that must see their whole input at once and so have one phase: ops that
    are not splittable (dense, global pooling, softmax, flatten, ...) and the squeeze-excitation
    product (an elementwise layer with a second, data-dependent operand broadcast over the rows)."""
    if not get_op(layer.op).splits_rows(layer, [graph.shape(t) for t in layer.inputs], graph.shape(layer.output)):
        return True
    out_h = _rows(graph.shape(layer.output))
    return len(layer.inputs) > 1 and out_h > 1 and any(_rows(graph.shape(t)) == 1 for t in layer.inputs)


def split_rows(h: int, phases: int) -> tuple[int, ...]:
    """H rows in P parts: k = ceil(H / P) rows per phase, the last part shorter; where that does
    not give P non-empty parts (H = 10, P = 6), the parts are balanced (2, 2, 2, 2, 1, 1)."""
    k = -(-h // phases)
    last = h - k * (phases - 1)
    if last >= 1:
        return (k,) * (phases - 1) + (last,)
    q, r = divmod(h, phases)
    return (q + 1,) * r + (q,) * (phases - r)


def _resolve_rows(value: int | Sequence[int], h: int, what: str, whole: bool) -> tuple[int, ...]:
    """Rows per phase from a phase count or an explicit list; OptionError naming `what`."""
    if isinstance(value, (str, bytes, bool)):
        raise OptionError(f"{what}: phases must be a count or a list of rows per phase, not {value!r}")
    try:
        p = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        p = None
    if p is not None:
        if p < 1:
            raise OptionError(f"{what}: needs at least 1 phase, not {p}")
        if whole and p > 1:
            raise OptionError(f"{what} needs its whole input; it has one phase, not {p}")
        if p > h:
            raise OptionError(f"{what} has {h} output row{'s' if h != 1 else ''}; cannot run it in {p} phases")
        rows = split_rows(h, p)
    else:
        try:
            rows = tuple(operator.index(r) for r in value)  # type: ignore[union-attr]
        except TypeError:
            raise OptionError(f"{what}: phases must be a count or a list of rows per phase, not {value!r}") from None
        if not rows or any(r < 1 for r in rows) or sum(rows) != h:
            raise OptionError(f"{what}: rows per phase {list(rows)} must be positive and sum to its {h} rows")
    if whole and len(rows) > 1:
        raise OptionError(f"{what} needs its whole input; it has one phase, not {len(rows)}")
    return rows


def max_phases(graph: Graph) -> dict[int, int]:
    """One output row per phase for every layer that may have phases (H > 1, not whole-input)."""
    out = {}
    for layer in graph.layers:
        h = _rows(graph.shape(layer.output))
        if h > 1 and not needs_whole_input(graph, layer):
            out[layer.id] = h
    return out


def algorithm1_phases(graph: Graph) -> dict[int, int]:
    """The paper's default phase counts (Alg. 1 lines 8-12): one phase if the window does not
    overlap and there is no padding (s >= H_theta and hpad = 0), or the window covers the whole
    input (H_theta = H_X); otherwise one output row per phase,
    P = (H_X + hpad - max(H_theta, s)) / s + 1 (= the output rows). Layers without a sliding
    window (elementwise, concat) and whole-input layers get 1."""
    out = {}
    for layer in graph.layers:
        a = layer.attrs
        if "kernel" not in a or "stride" not in a or needs_whole_input(graph, layer):
            out[layer.id] = 1
            continue
        h_x = _rows(graph.shape(layer.inputs[0]))
        k = (a["kernel"][0] - 1) * a.get("dilation", (1, 1))[0] + 1
        s = a["stride"][0]
        pads = a.get("pads", (0, 0, 0, 0))
        hpad = pads[0] + pads[2]
        if (s >= k and hpad == 0) or k == h_x:
            out[layer.id] = 1
        else:
            out[layer.id] = _rows(graph.shape(layer.output))
    return out


# --- conversion -------------------------------------------------------------------------------

def _names(prefix: str, tensors: Sequence[str]) -> dict[str, str]:
    if len(tensors) == 1:
        return {tensors[0]: prefix}
    return {t: f"{prefix}{i}" for i, t in enumerate(tensors)}


def _consumption(windows: Sequence[tuple[int, int]], h: int) -> tuple[list[int], list[int]]:
    """Rows consumed from the channel at each phase, and rows carried in the self-loop from each
    phase to the next, for a consumer whose phase p reads input rows windows[p] = [h0, h1).

    Phase p consumes the rows from the end of what was consumed so far to the end of its window
    (the first phase from row 0, so cropped top rows and rows skipped by a stride are consumed
    and discarded with it); the last phase consumes all remaining rows to `h` (the cropped
    bottom rows). After phase p the actor keeps the consumed rows that a later phase still
    reads: [min over q > p of h0_q, consumed_p)."""
    consumed, carry, c = [], [], 0
    n = len(windows)
    lows = [0] * n
    low = h
    for p in range(n - 1, -1, -1):  # lows[p] = min over q > p of h0_q
        lows[p] = low
        low = min(low, windows[p][0])
    for p, (_, h1) in enumerate(windows):
        end = h if p == n - 1 else max(c, min(h1, h))
        consumed.append(end - c)
        c = end
        carry.append(max(0, c - lows[p]) if p < n - 1 else 0)
    return consumed, carry


def to_csdf(
    graph: Graph,
    phases: Mapping[int | str, int | Sequence[int]] | None = None,
    source_rows: int | Sequence[int] | None = None,
    itemsize: int = 1,
    batch: int | None = None,
) -> CSDFGraph:
    """Convert `graph` into a CSDF graph (Alg. 1) with the given phases per layer.

    `phases` maps a layer id or name to a phase count (k = ceil(H / P) output rows per phase, the
    last part shorter) or an explicit list of output rows per phase; layers not named have one
    phase. `source_rows` is how every graph input is delivered: a phase count or a list of rows
    per phase (Ex2: [24, 8]); default one phase, the whole input. Tokens are elements x
    `itemsize`, for `batch` samples (default: the graph's own batch)."""
    rows_of = _layer_rows(graph, phases)
    sink_names = _names("out", graph.outputs)
    actors, producer, out_rows, layer_regions = _actors(graph, rows_of, source_rows, batch, sink_names)
    tensor_tokens: dict[str, int] = {}

    def edge(t: str, dst: str, consumption: Sequence[int]) -> Channel:
        shape = graph.shape(t)
        row = _row_tokens(shape, itemsize, batch)
        tensor_tokens[t] = row * _rows(shape)
        src = producer[t]
        return Channel(f"c_{src}_{dst}", src, dst, tuple(r * row for r in out_rows[src]),
                       tuple(r * row for r in consumption), 0, t)

    channels: list[Channel] = []
    for layer in graph.layers:
        channels.extend(_layer_channels(graph, layer, layer_regions[layer.id], itemsize, batch, edge, channels))
    for t in graph.outputs:
        channels.append(edge(t, sink_names[t], (_rows(graph.shape(t)),)))
    return CSDFGraph(graph.name, tuple(actors), tuple(channels), tensor_tokens)


def _layer_rows(graph: Graph, phases: Mapping[int | str, int | Sequence[int]] | None) -> dict[int, tuple[int, ...]]:
    """Output rows per phase of each layer `phases` names (by id or name), checked."""
    rows_of: dict[int, tuple[int, ...]] = {}
    for key, value in dict(phases or {}).items():
        if not isinstance(key, str):
            try:
                key = operator.index(key)  # numpy integers too
            except TypeError:
                raise OptionError(f"a layer is named by its id or name, not {key!r}") from None
        layer = graph.layer(key)
        what = _describe(layer)
        if layer.id in rows_of:
            raise OptionError(f"{what} is given phases twice (by id and by name)")
        h = _rows(graph.shape(layer.output))
        rows_of[layer.id] = _resolve_rows(value, h, what, needs_whole_input(graph, layer))
    return rows_of


def _actors(graph: Graph, rows_of: Mapping[int, tuple[int, ...]], source_rows: int | Sequence[int] | None,
            batch: int | None, sink_names: Mapping[str, str]):
    """The sources, one actor per layer and the sinks; which actor produces each tensor, each
    actor's rows per phase, and each layer's output region per phase."""
    src_names = _names("in", graph.inputs)
    actors: list[Actor] = []
    producer: dict[str, str] = {}  # tensor -> producing actor
    out_rows: dict[str, tuple[int, ...]] = {}  # actor -> rows per phase
    for t in graph.inputs:
        h = _rows(graph.shape(t))
        rows = _resolve_rows(source_rows if source_rows is not None else 1, h, f"input {t!r}", False)
        name = src_names[t]
        actors.append(Actor(name, None, len(rows), rows, "source", t, "input", (1,) * len(rows)))
        producer[t], out_rows[name] = name, rows
    layer_regions: dict[int, list[Region]] = {}
    for layer in graph.layers:
        shape = graph.shape(layer.output)
        rows = rows_of.get(layer.id, (_rows(shape),))
        n = shape[0] if batch is None else batch
        w = spatial(shape)[1]
        regions, r0 = [], 0
        for r in rows:
            regions.append(Region(0, n, r0, r0 + r, 0, w))
            r0 += r
        layer_regions[layer.id] = regions
        op = get_op(layer.op)
        in_shapes = [_batched(graph.shape(t), batch) for t in layer.inputs]
        out_shape = _batched(shape, batch)
        macs = tuple(op.macs(layer, reg, in_shapes, out_shape) for reg in regions)
        name = f"L{layer.id}"
        actors.append(Actor(name, layer.id, len(rows), rows, "layer", layer.name, layer.op, macs))
        producer[layer.output], out_rows[name] = name, rows
    for t in graph.outputs:
        actors.append(Actor(sink_names[t], None, 1, (_rows(graph.shape(t)),), "sink", t, "output", (1,)))
    return actors, producer, out_rows, layer_regions


def _layer_channels(graph: Graph, layer: Layer, regions: Sequence[Region], itemsize: int, batch: int | None,
                    edge: Callable[[str, str, Sequence[int]], Channel], channels: Sequence[Channel]) -> list[Channel]:
    """The channels into one layer's actor: one per distinct input tensor (what each phase
    consumes), then a self-loop per input whose rows are carried from phase to phase."""
    dst = f"L{layer.id}"
    op = get_op(layer.op)
    in_shapes = [_batched(graph.shape(t), batch) for t in layer.inputs]
    wins = [op.input_windows(layer, reg, in_shapes) for reg in regions]
    inputs: list[Channel] = []
    loops: list[Channel] = []
    for t in dict.fromkeys(layer.inputs):
        slots = [i for i, name in enumerate(layer.inputs) if name == t]
        spans = [(min(ws[i].region.h0 for i in slots), max(ws[i].region.h1 for i in slots)) for ws in wins]
        consumed, carry = _consumption(spans, _rows(graph.shape(t)))
        ch = edge(t, dst, consumed)
        inputs.append(ch)
        if any(carry):
            row = _row_tokens(graph.shape(t), itemsize, batch)
            u = tuple(k * row for k in carry)
            v = (0,) + u[:-1]
            loops.append(Channel(f"c_{dst}_{dst}", dst, dst, u, v, 0, None, ch.name))
    if len(loops) > 1:  # one self-loop per carried input: name them by their source actor
        known = [*channels, *inputs]
        loops = [Channel(f"c_{dst}_{dst}_{_channel_by(known, c.carries).src}", c.src, c.dst,
                         c.production, c.consumption, 0, None, c.carries) for c in loops]
    return inputs + loops


def _channel_by(channels: Iterable[Channel], name: str | None) -> Channel:
    return next(c for c in channels if c.name == name)


def _batched(shape: tuple[int, ...], batch: int | None) -> tuple[int, ...]:
    return shape if batch is None else (batch,) + tuple(shape[1:])


# --- consistency --------------------------------------------------------------------------------

def repetition_vector(csdf: CSDFGraph) -> dict[str, int]:
    """The smallest positive integer q (in iterations of each actor's phase sequence; firings are
    q x P) with q_src x sum(U) = q_dst x sum(V) on every channel. CSDFError if none exists."""
    q: dict[str, Fraction] = {}
    adj: dict[str, list[tuple[str, Fraction]]] = {a.name: [] for a in csdf.actors}
    for c in csdf.channels:
        u, v = sum(c.production), sum(c.consumption)
        if c.is_self_loop:
            if u != v:
                raise CSDFError(f"self-loop {c.name} produces {u} but consumes {v} tokens per iteration")
            continue
        if u == 0 and v == 0:
            continue
        if u == 0 or v == 0:
            raise CSDFError(f"channel {c.name} produces {u} but consumes {v} tokens per iteration")
        adj[c.src].append((c.dst, Fraction(u, v)))  # q_dst = q_src * u / v
        adj[c.dst].append((c.src, Fraction(v, u)))
    for a in csdf.actors:
        if a.name in q:
            continue
        q[a.name] = Fraction(1)
        component, stack = [a.name], [a.name]
        while stack:
            x = stack.pop()
            for y, ratio in adj[x]:
                want = q[x] * ratio
                if y not in q:
                    q[y] = want
                    component.append(y)
                    stack.append(y)
                elif q[y] != want:
                    raise CSDFError(f"inconsistent rates between {x} and {y}: no repetition vector")
        den = 1
        for x in component:
            den = den * q[x].denominator // gcd(den, q[x].denominator)
        ints = [int(q[x] * den) for x in component]
        g = 0
        for i in ints:
            g = gcd(g, i)
        for x, i in zip(component, ints):
            q[x] = Fraction(i // g)
    return {a.name: int(q[a.name]) for a in csdf.actors}


def check_balance(csdf: CSDFGraph) -> dict[str, int]:
    """Check the balance equations and return the repetition vector (all ones).

    For every channel: sequence lengths equal the producer's and consumer's phases, rates are
    non-negative, q_src x sum(U) = q_dst x sum(V) with q all ones (one inference = one iteration
    of every actor), and exactly: an edge carries its whole tensor, sum(U) = sum(V) = tensor
    tokens (the cropped rows included: produced by the producer, consumed and discarded by the
    consumer); a self-loop gives back what it took, U(p) = V(p + 1), U(P) = V(1) = 0."""
    for c in csdf.channels:
        src, dst = csdf.actor(c.src), csdf.actor(c.dst)
        if len(c.production) != src.phases or len(c.consumption) != dst.phases:
            raise CSDFError(f"channel {c.name}: {len(c.production)} production / {len(c.consumption)} "
                            f"consumption rates for {src.phases} / {dst.phases} phases")
        if min(c.production + c.consumption) < 0:
            raise CSDFError(f"channel {c.name} has a negative rate")
        if c.is_self_loop:
            u, v = c.production, c.consumption
            if u[-1] != 0 or v[0] != 0 or any(u[p] != v[p + 1] for p in range(len(u) - 1)):
                raise CSDFError(f"self-loop {c.name}: U = {list(u)} is not V = {list(v)} shifted by one phase")
        elif c.tensor is not None and c.tensor in csdf.tensor_tokens:
            want = csdf.tensor_tokens[c.tensor]
            if sum(c.production) != want or sum(c.consumption) != want:
                raise CSDFError(f"channel {c.name}: produces {sum(c.production)}, consumes "
                                f"{sum(c.consumption)} tokens; its tensor {c.tensor!r} has {want}")
    q = repetition_vector(csdf)
    if any(v != 1 for v in q.values()):
        raise CSDFError(f"repetition vector {q} is not all ones: an iteration is not one inference")
    return q


# --- firing order and buffer sizes ------------------------------------------------------------

def firing_order(csdf: CSDFGraph, held: Collection[int] = ()) -> list[tuple[str, int]]:
    """A data-driven schedule of one iteration, as (actor, phase) with phases from 1.

    At every step it fires the most downstream actor (the last in actor order: sinks, then
    layers by decreasing id, then sources) whose next phase has all its input tokens; so an
    actor runs as soon as its input window is complete and the producers upstream run only as
    much as needed, keeping each buffer at its window. On Fig. 1 this gives Table II, Column 7.

    The outputs of the layers in `held` are held whole: their readers wait until every phase
    of the layer has fired. A held tensor cuts the stream in two, so the windows upstream of it
    are dead before those downstream are allocated (a stream through a whole network keeps
    every window live from the first row to the last)."""
    q = check_balance(csdf)
    index = {a.name: i for i, a in enumerate(csdf.actors)}
    total = {a.name: q[a.name] * a.phases for a in csdf.actors}
    inputs: dict[str, list[Channel]] = {a.name: [] for a in csdf.actors}
    readers: dict[str, set[str]] = {a.name: set() for a in csdf.actors}
    for c in csdf.channels:
        inputs[c.dst].append(c)
        readers[c.src].add(c.dst)
    tokens = {c.name: c.initial_tokens for c in csdf.channels}
    fired = {a.name: 0 for a in csdf.actors}

    def enabled(a: str) -> bool:
        if fired[a] >= total[a]:
            return False
        p = fired[a] % csdf.actor(a).phases
        return all(tokens[c.name] >= c.consumption[p] for c in inputs[a]) and all(fired[b] >= total[b] for b in waits[a])

    held_actors = {a.name for a in csdf.actors if a.kind == "layer" and a.layer_id in held}
    waits = {a: [c.src for c in inputs[a] if c.src in held_actors and c.src != a] for a in inputs}
    heap = [(-index[a], a) for a in index if enabled(a)]
    heapq.heapify(heap)
    queued = {a for _, a in heap}
    order: list[tuple[str, int]] = []
    outputs = {a.name: [c for c in csdf.channels if c.src == a.name] for a in csdf.actors}
    while heap:
        _, a = heapq.heappop(heap)
        queued.discard(a)
        if not enabled(a):  # cannot happen (only a's own inputs shrink), but stay safe
            continue
        p = fired[a] % csdf.actor(a).phases
        for c in inputs[a]:
            tokens[c.name] -= c.consumption[p]
        for c in outputs[a]:
            tokens[c.name] += c.production[p]
        fired[a] += 1
        order.append((a, p + 1))
        for b in {a} | readers[a]:
            if b not in queued and enabled(b):
                heapq.heappush(heap, (-index[b], b))
                queued.add(b)
    missing = [a for a in fired if fired[a] < total[a]]
    if missing:
        raise CSDFError(f"deadlock: {', '.join(missing)} cannot complete their phases")
    return order


def buffer_sizes(csdf: CSDFGraph, order: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Buffer size of every edge channel for a firing order: the most tokens it holds between
    firings, counting with it the tokens of the self-loop that carries its overlapping rows (the
    paper counts the overlap inside the consumer's window buffer: b23 = 6 rows in Ex4 although
    c23 alone never holds more than 4 + 2). Self-loops are not listed separately, so the values
    sum to the paper's Total (no reuse between buffers).

    The order must be a complete iteration of (actor, phase) firings, phases from 1, each with
    its input tokens present; OptionError otherwise."""
    q = check_balance(csdf)
    inputs: dict[str, list[Channel]] = {a.name: [] for a in csdf.actors}
    outputs: dict[str, list[Channel]] = {a.name: [] for a in csdf.actors}
    for c in csdf.channels:
        inputs[c.dst].append(c)
        outputs[c.src].append(c)
    groups = {c.name: [c.name] for c in csdf.edges}
    group_of = {c.name: c.name for c in csdf.edges}
    for c in csdf.self_loops:
        if c.carries in groups:
            groups[c.carries].append(c.name)
            group_of[c.name] = c.carries
    touched = {a.name: {group_of[c.name] for c in inputs[a.name] + outputs[a.name] if c.name in group_of}
               for a in csdf.actors}
    tokens = {c.name: c.initial_tokens for c in csdf.channels}
    best = {e: sum(tokens[n] for n in names) for e, names in groups.items()}
    fired = {a.name: 0 for a in csdf.actors}
    for step, item in enumerate(order):
        try:
            a, phase = item
            actor = csdf.actor(a)
        except (KeyError, TypeError, ValueError):
            raise OptionError(f"firing {step + 1} {item!r} is not (actor, phase) of this graph") from None
        p = fired[a] % actor.phases
        if phase != p + 1:
            raise OptionError(f"firing {step + 1}: {a} phase {phase} out of order (next is phase {p + 1})")
        for c in inputs[a]:
            if tokens[c.name] < c.consumption[p]:
                raise OptionError(f"firing {step + 1}: {a} phase {phase} needs {c.consumption[p]} tokens "
                                  f"on {c.name}, which holds {tokens[c.name]}")
            tokens[c.name] -= c.consumption[p]
        for c in outputs[a]:
            tokens[c.name] += c.production[p]
        fired[a] += 1
        for e in touched[a]:
            held = sum(tokens[n] for n in groups[e])
            if held > best[e]:
                best[e] = held
    short = [f"{a.name} ({fired[a.name]} of {q[a.name] * a.phases})" for a in csdf.actors
             if fired[a.name] != q[a.name] * a.phases]
    if short:
        raise OptionError(f"the firing order is not one iteration: {', '.join(short)} phases fired")
    return best


def describe_order(csdf: CSDFGraph, order: Sequence[tuple[str, int]],
                   names: Mapping[str, str] | None = None) -> str:
    """The order in Table II's notation: n21 is phase 1 of n2, n1(1-17) phases 1 to 17 of n1, and
    [n1(18-22), n2(2-6)] alternating phases of an actor and one downstream of it (3 pairs or more)."""
    names = dict(names or {})
    index = {a.name: i for i, a in enumerate(csdf.actors)}
    nm = lambda a: names.get(a, a)  # noqa: E731

    def span(a: str, p0: int, p1: int) -> str:
        return f"{nm(a)}{p0}" if p0 == p1 else f"{nm(a)}({p0}-{p1})"

    out, i, n = [], 0, len(order)
    while i < n:
        a, p = order[i]
        j = i + 1
        while j < n and order[j] == (a, order[j - 1][1] + 1):
            j += 1
        if j - i > 1:
            out.append(span(a, p, order[j - 1][1]))
            i = j
            continue
        if i + 1 < n and index[order[i + 1][0]] > index[a]:
            b, pb = order[i + 1]
            k = i + 2
            while k + 1 < n and order[k] == (a, order[k - 2][1] + 1) and order[k + 1] == (b, order[k - 1][1] + 1):
                k += 2
            if (k - i) // 2 >= 3:
                out.append(f"[{span(a, p, order[k - 2][1])}, {span(b, pb, order[k - 1][1])}]")
                i = k
                continue
        out.append(span(a, p, p))
        i += 1
    return ", ".join(out)


# --- export -------------------------------------------------------------------------------------

def _rle(seq: Sequence[int], sep: str = ",") -> str:
    """Run-length form: SDF3 writes rates as '3*128,0'; the paper writes [3*128, 1*0]."""
    runs: list[list[int]] = []
    for x in seq:
        if runs and runs[-1][1] == x:
            runs[-1][0] += 1
        else:
            runs.append([1, x])
    if sep == ",":
        return ",".join(f"{c}*{x}" if c > 1 else str(x) for c, x in runs)
    return "[" + sep.join(f"{c}*{x}" for c, x in runs) + "]"


def paper_sequence(seq: Sequence[int]) -> str:
    """A rate sequence in the paper's notation, e.g. [3*128, 1*0]."""
    return _rle(seq, ", ")


def to_sdf3_xml(csdf: CSDFGraph, times: Mapping[str, Sequence[int]] | None = None,
                processor: str = "cpu", compact: bool = False) -> str:
    """The graph in SDF3's CSDF XML format (`sdf3 type="csdf"`): actors with one port per channel
    end whose rate is the comma-separated list of tokens per phase ('128,128,128,0'; with
    `compact`, run-length encoded as SDF3's own writer does, '3*128,0'), channels with initial
    tokens, and csdfProperties with one execution time per phase for each actor (`times`,
    default: the phase's multiply-accumulates, at least 1) and the token size (1: tokens are
    already bytes at the itemsize of the conversion). The balance equations are checked first."""
    check_balance(csdf)
    fmt = _rle if compact else (lambda seq: ",".join(str(x) for x in seq))
    times = dict(times or {})
    ports: dict[str, list[tuple[str, str, Sequence[int]]]] = {a.name: [] for a in csdf.actors}
    ends: dict[str, tuple[str, str]] = {}
    for c in csdf.channels:
        sp = f"out_{c.name}"
        dp = f"in_{c.name}"
        ports[c.src].append(("out", sp, c.production))
        ports[c.dst].append(("in", dp, c.consumption))
        ends[c.name] = (sp, dp)
    q = quoteattr
    lines = ['<?xml version="1.0" encoding="UTF-8"?>',
             '<sdf3 type="csdf" version="1.0" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
             'xsi:noNamespaceSchemaLocation="http://www.es.ele.tue.nl/sdf3/xsd/sdf3-csdf.xsd">',
             f"  <applicationGraph name={q(csdf.name)}>",
             f"    <csdf name={q(csdf.name)} type={q(csdf.name)}>"]
    for a in csdf.actors:
        lines.append(f"      <actor name={q(a.name)} type={q(a.op or a.kind)}>")
        for kind, name, rate in ports[a.name]:
            lines.append(f"        <port name={q(name)} type={q(kind)} rate={q(fmt(rate))}/>")
        lines.append("      </actor>")
    for c in csdf.channels:
        sp, dp = ends[c.name]
        lines.append(f"      <channel name={q(c.name)} srcActor={q(c.src)} srcPort={q(sp)} "
                     f"dstActor={q(c.dst)} dstPort={q(dp)} initialTokens={q(str(c.initial_tokens))}/>")
    lines += ["    </csdf>", "    <csdfProperties>"]
    for a in csdf.actors:
        t = list(times.get(a.name, [max(1, m) for m in a.macs] or [1] * a.phases))
        if len(t) != a.phases:
            raise OptionError(f"actor {a.name}: {len(t)} execution times for {a.phases} phases")
        lines += [f"      <actorProperties actor={q(a.name)}>",
                  f"        <processor type={q(processor)} default=\"true\">",
                  f"          <executionTime time={q(fmt(t))}/>",
                  "        </processor>",
                  "      </actorProperties>"]
    for c in csdf.channels:
        lines += [f"      <channelProperties channel={q(c.name)}>",
                  '        <tokenSize sz="1"/>',
                  "      </channelProperties>"]
    lines += ["      <graphProperties/>", "    </csdfProperties>", "  </applicationGraph>", "</sdf3>", ""]
    return "\n".join(lines)


def _dot_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(csdf: CSDFGraph) -> str:
    """The graph in Graphviz DOT: actors with their phases, every channel labelled with its name
    and its production / consumption sequences in the paper's notation; self-loops dashed."""
    check_balance(csdf)
    lines = [f"digraph {_dot_str(csdf.name)} {{", "  rankdir=TB;", "  node [shape=box];"]
    for a in csdf.actors:
        what = a.label if a.kind == "layer" else f"{a.kind} {a.label}"
        label = f"{a.name}\\n{what} ({a.op})\\n{a.phases} phase{'s' if a.phases > 1 else ''}"
        shape = "" if a.kind == "layer" else ", shape=ellipse"
        lines.append(f"  {_dot_str(a.name)} [label=\"{_escape(label)}\"{shape}];")
    for c in csdf.channels:
        label = f"{c.name}\\nU={paper_sequence(c.production)}\\nV={paper_sequence(c.consumption)}"
        style = ", style=dashed" if c.is_self_loop else ""
        lines.append(f"  {_dot_str(c.src)} -> {_dot_str(c.dst)} [label=\"{_escape(label)}\"{style}];")
    lines += ["}", ""]
    return "\n".join(lines)


def _escape(label: str) -> str:
    """Escape quotes in a DOT label that already uses \\n line breaks."""
    return label.replace('"', '\\"')


__all__ = ["Actor", "CSDFError", "CSDFGraph", "Channel", "algorithm1_phases", "buffer_sizes",
           "check_balance", "describe_order", "firing_order", "max_phases", "needs_whole_input",
           "paper_sequence", "repetition_vector", "split_rows", "to_csdf", "to_dot", "to_sdf3_xml"]
