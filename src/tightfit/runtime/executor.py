"""The arena executor: runs any plan on the kernel library (kernels/tf_kernels.c, loaded by
kernels/library.py). One preallocated arena (a numpy buffer); every step is bound once to the
argument struct the exported program would hold for it (kernels/step_args.py), and a partition's
run is one call of `tf_run` over its table: no Python between steps.

It knows no planner: it reads steps and buffers. Pipelined partitions (plan.concurrent) run in
threads on a stream of inputs, one frame apart, with FIFO buffers double-buffered by the plan.
"""
from __future__ import annotations

import ctypes
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from tightfit.errors import InputDataError
from tightfit.kernels.step_args import Context, View, _aligned_empty, _dims4, step_args
from tightfit.graph.ir import Graph
from tightfit.ops.base import Region
from tightfit.plan.lifetimes import output_accesses, streamed_outputs
from tightfit.plan.schema import Buffer, Plan, Step
from tightfit.kernels.library import INPUT_FN, Sink, Source, StepTable, Store, Tensor, library, tensor_input, tensor_store
from tightfit.kernels.loops import table_rows
from tightfit.runtime.reference import input_dtype

DTYPES = {"fp32": np.float32}


# An int8 tensor's buffer holds 1-byte items: the arena read as int8 (views count its bytes).
ITEM_DTYPES = {4: np.float32, 1: np.int8}


def typed(arena: np.ndarray, item: int) -> np.ndarray:
    """The float32 arena as an array of `item`-byte elements (the same memory)."""
    return arena.view(ITEM_DTYPES[item])


def buffer_view(arena: np.ndarray, b: Buffer, copy: int = 0) -> np.ndarray:
    """The buffer as a logical (N, C, H, W) or flat array over the arena."""
    arena = typed(arena, b.itemsize)
    start = b.offsets[copy] // b.itemsize
    flat = arena[start : start + b.nbytes // b.itemsize]
    if b.layout == "nhwc":
        n, c, h, w = b.shape
        return flat.reshape(n, h, w, c).transpose(0, 3, 1, 2)
    return flat.reshape(b.shape)


def view_array(arena: np.ndarray, v: View, shape: Sequence[int]) -> np.ndarray:
    """View `v` of the arena as an array of logical `shape` (above rank 4: v folds the trailing dims
    of a contiguous tensor, step_args._dims4)."""
    if len(shape) > 4:
        return view_array(arena, v, _dims4(shape)).reshape(tuple(shape))
    strides = tuple(s * arena.itemsize for s in v.strides[: len(shape)])
    return np.lib.stride_tricks.as_strided(arena[v.off :], shape=tuple(shape), strides=strides)


@dataclass(frozen=True)
class _Partition:
    """A partition's steps bound once: its table, (name, shape) of each input of its model (in the
    model's input order, which its input steps' indices count) and, per input region, the rows a
    RowSource is asked for at a time."""

    table: StepTable
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...]
    bands: dict
    input_dtypes: tuple[np.dtype, ...]  # each input's elements (int8 for an int8 graph input)
    sinks: object = None  # a tf_sink per output of its model (ctypes array) where the plan streams outputs


class ArenaExecutor:
    threads = 1  # tf_run's threads (an instance's own from __init__)

    def __init__(self, plan: Plan, graphs: Sequence[Graph], *, fill_nan: bool = False, threads: int = 1):
        if plan.dtype not in DTYPES:
            from tightfit.errors import OptionError

            raise OptionError(f"the executor runs fp32 plans; this plan is {plan.dtype} (accounting only)")
        self.plan, self.graphs = plan, list(graphs)
        # tf_run's threads: a convolution's output rows are shared among them (the same bits for any count).
        self.threads = max(1, int(threads))
        self.lib = library()
        # +1 element so a zero-size plan still has storage; offsets are byte offsets.
        self.arena = _aligned_empty(max(plan.arena_bytes // 4, 1), np.float32)
        self.arena.fill(np.nan if fill_nan else 0.0)
        copies = max((b.copies for b in plan.buffers), default=1)
        ctxs = [Context(plan, self.graphs, c) for c in range(copies)]
        for c in ctxs[1:]:  # one pool of constants for every frame copy
            c.weights, c.indices = ctxs[0].weights, ctxs[0].indices
        # Streamed outputs land in arrays of their own (per frame copy), outside the arena, as a
        # row-band input comes from outside it.
        self._stored = [self._streamed_arrays() for _ in ctxs]
        self.frames = [[self._bind(p, ctx, stored) for p in plan.partitions] for ctx, stored in zip(ctxs, self._stored)]
        self.weights, self.indices = ctxs[0].weights.array(), ctxs[0].indices.array()
        self._outputs = [self._output_views(ctx, stored) for ctx, stored in zip(ctxs, self._stored)]
        self._rows_fn = INPUT_FN(self._fill_rows)  # kept: C holds its address during runs
        self._tensor_fn = tensor_input()
        self._pointers = (self.arena.ctypes.data, self.weights.ctypes.data, self.indices.ctypes.data)

    # --- binding --------------------------------------------------------------------------------
    def _bind(self, p, ctx: Context, stored: dict) -> _Partition:
        graph, batch = self.graphs[p.model], self.plan.models[p.model].batch
        # The rows the exported program's table holds (repeated runs as loops): the same walk of tf_run.
        table = StepTable(table_rows([s.layer for s in p.steps], [step_args(ctx, s) for s in p.steps]))
        bands = {(s.out.tensor,) + _region_key(s.out.region): _rows_per_band(s, graph, self.plan.buffers[s.out.buffer].itemsize)
                 for s in p.steps if s.kind == "input"}
        return _Partition(table, tuple((t, (batch,) + tuple(graph.shape(t)[1:])) for t in graph.inputs), bands,
                          tuple(input_dtype(graph, t) for t in graph.inputs), self._sinks(p.model, stored))

    def _streamed_arrays(self) -> dict[tuple[int, str], tuple[np.ndarray, Store]]:
        """(model, tensor) -> the whole array a streamed output's rows are stored into, and its tf_store."""
        out = {}
        for m, t in sorted(streamed_outputs(self.plan)):
            g = self.graphs[m]
            shape = (self.plan.models[m].batch,) + tuple(g.shape(t)[1:])
            y = np.zeros(shape, np.int8 if g.tensors[t].item_bytes(self.plan.dtype) == 1 else np.float32)
            out[(m, t)] = (y, Store(y.ctypes.data, *_dims4(y.shape)[1:], y.itemsize))
        return out

    def _sinks(self, m: int, stored: dict):
        """A tf_sink per output of model m (in its output order), or None where it streams none."""
        outputs = self.graphs[m].outputs
        if not any((m, t) in stored for t in outputs):
            return None
        fn = tensor_store()
        return (Sink * len(outputs))(*[Sink(fn, ctypes.addressof(stored[(m, t)][1])) if (m, t) in stored else Sink(None, None)
                                       for t in outputs])

    def _output_views(self, ctx: Context, stored: dict) -> list[dict[str, np.ndarray]]:
        outs: list[dict[str, np.ndarray]] = [dict() for _ in self.graphs]
        for (m, t), (y, _) in stored.items():
            outs[m][t] = y
        for m, a in output_accesses(self.plan, self.graphs):
            shape = (a.region.n,) + tuple(self.graphs[m].shape(a.tensor)[1:])
            arena = typed(self.arena, self.plan.buffers[a.buffer].itemsize)
            outs[m][a.tensor] = view_array(arena, ctx.view(m, a), shape)
        return outs

    # --- running --------------------------------------------------------------------------------
    def run(self, inputs, frame: int = 0) -> list[dict[str, np.ndarray]]:
        """One input per model (an array, anything numpy reads as one, or a RowSource; for a model
        of several inputs {input name: one of those}); returns per model its outputs as views into
        the arena (a streamed output: the executor's own array its rows were stored into), valid
        until the next run."""
        xs = [inputs] if _single(inputs) else list(inputs)
        copy = frame % len(self.frames)
        for p, part in zip(self.plan.partitions, self.frames[copy]):
            self.run_partition(part, xs[p.model])
        return self._outputs[copy]

    def run_partition(self, part: _Partition, x) -> None:
        """One call of tf_run over the partition's table, its input steps reading `x` (one source
        per input of the model: each input's array, or its RowSource), its output steps storing
        into the streamed outputs' arrays."""
        arena, weights, indices = self._pointers
        sinks = None if part.sinks is None else ctypes.addressof(part.sinks)
        xs = _by_input(x, part.input_shapes)
        if any(isinstance(v, RowSource) for v in xs):
            _INPUT.xs, _INPUT.bands, _INPUT.error = xs, part.bands, None
            _INPUT.names, _INPUT.dtypes = tuple(n for n, _ in part.input_shapes), part.input_dtypes
            for k, v in enumerate(xs):  # whole arrays take the row path too: each input read as its kind
                if not isinstance(v, RowSource):
                    xs[k] = RowSource.of(_input_array(v, part.input_shapes[k], part.input_dtypes[k]))
            sources = (Source * len(xs))(*[Source(ctypes.cast(self._rows_fn, ctypes.c_void_p).value, k) for k in range(len(xs))])
            status = self.lib.tf_run(arena, weights, indices, part.table.address, part.table.count,
                                     ctypes.addressof(sources), sinks, self.threads)
            if status:
                raise _INPUT.error if _INPUT.error is not None else RuntimeError(f"the input callback returned {status}")
            return
        data = [_input_array(v, named, dt) for v, named, dt in zip(xs, part.input_shapes, part.input_dtypes)]
        tensors = [Tensor(d.ctypes.data, *_dims4(d.shape)[1:], d.itemsize) for d in data]
        sources = (Source * len(tensors))(*[Source(self._tensor_fn, ctypes.addressof(t)) for t in tensors])
        self.lib.tf_run(arena, weights, indices, part.table.address, part.table.count, ctypes.addressof(sources),
                        sinks, self.threads)

    def _fill_rows(self, index, n0, n1, h0, h1, w0, w1, dst, sn, sc, sh, sw) -> int:
        """tf_input_fn over input `index` (its ctx) of this thread's run: its rows into the arena at dst."""
        try:
            source = _INPUT.xs[index or 0]
            shape = (n1 - n0, source.shape[1], h1 - h0, w1 - w0)
            arena = typed(self.arena, _INPUT.dtypes[index or 0].itemsize)  # dst holds the input's own elements
            item = arena.itemsize
            out = np.lib.stride_tricks.as_strided(arena[(dst - arena.ctypes.data) // item :], shape=shape,
                                                  strides=(sn * item, sc * item, sh * item, sw * item))
            region = Region(n0, n1, h0, h1, w0, w1)
            key = (_INPUT.names[index or 0],) + _region_key(region)
            _load_rows(source, out, region, _INPUT.bands.get(key, h1 - h0))
            return 0
        except BaseException as e:  # raised again by run_partition, in the caller's thread
            _INPUT.error = e
            return 1

    def run_stream(self, frames: Iterable, on_output: Callable[[int, list[dict[str, np.ndarray]]], None]) -> int:
        """Run a stream of inputs. Partitions in a concurrent set run in their own threads, each
        on its own frame (a pipeline); `on_output(frame, outputs)` is called in frame order."""
        stages = tuple(range(len(self.plan.partitions)))
        if len(self.plan.concurrent) != 1 or tuple(sorted(self.plan.concurrent[0])) != stages or len(stages) < 2:
            # Only a plan whose partitions form one pipeline runs as one; any other plan runs
            # frame by frame (its conflict relation already keeps concurrent buffers apart).
            n = 0
            for n, x in enumerate(frames, 1):
                on_output(n - 1, self.run(x, n - 1))
            return n
        return _Pipeline(self).run(frames, on_output)


def _single(inputs) -> bool:
    """Whether `inputs` is one model's input (an array-like, a RowSource, or {input name: either}),
    not a sequence of them."""
    return (isinstance(inputs, (RowSource, Mapping)) or hasattr(inputs, "__array__")
            or hasattr(inputs, "__array_interface__"))


def _by_input(x, shapes: Sequence[tuple[str, tuple[int, ...]]]) -> list:
    """A model's input(s) in its input order: {name: input} for any model, or the one input of a
    model of one."""
    if not isinstance(x, Mapping):
        if len(shapes) != 1:
            raise ValueError(f"the model has {len(shapes)} inputs ({', '.join(n for n, _ in shapes)}): "
                             "give {input name: array}")
        return [x]
    missing = [n for n, _ in shapes if n not in x]
    if missing:
        raise ValueError(f"no array for input {missing[0]!r} (inputs: {', '.join(n for n, _ in shapes)})")
    return [x[n] for n, _ in shapes]


def _input_array(x, named: tuple[str, tuple[int, ...]], dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray:
    """Input `named` (its name, its shape) as a contiguous array of `dtype` (more samples allowed):
    an int8 input takes int8 values (integers in [-128, 127]), never floats cast silently."""
    name, shape = named
    data = np.asarray(x)
    if dtype == np.int8:
        data = _int8_values(data, name)
    data = np.ascontiguousarray(data, dtype=dtype)
    if data.shape[1:] != tuple(shape[1:]) or data.shape[0] < shape[0]:
        raise ValueError(f"an input of shape {tuple(data.shape)} for a plan whose input is {tuple(shape)}")
    return data


def _int8_values(data: np.ndarray, name: str) -> np.ndarray:
    """An int8 input's array as given: int8, or integers within int8's range (a float array is the
    user's float data, which only the model's own quantization may turn into int8)."""
    if data.dtype == np.int8:
        return data
    if data.dtype.kind not in "iu" or (data.size and (data.min() < -128 or data.max() > 127)):
        raise InputDataError(f"input {name!r} is int8: give int8 values (an array of dtype {data.dtype}"
                             f"{' out of [-128, 127]' if data.dtype.kind in 'iu' else ''}); quantize with its "
                             "scale and zero point first (q = round(x / scale) + zero_point)")
    return data.astype(np.int8)


def _region_key(r) -> tuple[int, ...]:
    return (r.n0, r.n1, r.h0, r.h1, r.w0, r.w1)


class _InputSlot(threading.local):
    xs: "list[RowSource]" = []
    names: tuple[str, ...] = ()
    dtypes: tuple[np.dtype, ...] = ()
    bands: dict = {}
    error: BaseException | None = None


_INPUT = _InputSlot()


class RowSource:
    """An input delivered by parts, as a camera or decoder delivers row bands: `band(h0, h1)`
    returns rows [h0, h1) of the (N, C, H, W) input; the executor asks for the bands its input
    steps need, so the whole input never has to exist. A source with `rows_into(out, region)`
    writes a region's rows straight into the array view `out` (in the arena), through a line
    buffer of its own (a camera's line, allocated with the source), so a run allocates no band."""

    def __init__(self, shape: Sequence[int], band: Callable[[int, int], np.ndarray],
                 rows_into: "Callable[[np.ndarray, Region], None] | None" = None):
        self.shape = tuple(shape)
        self.band = band
        self.rows_into = rows_into

    @staticmethod
    def of(x: np.ndarray) -> "RowSource":
        """A whole array read by rows."""
        return RowSource(x.shape, lambda h0, h1: x[:, :, h0:h1])

    @staticmethod
    def seeded(shape: Sequence[int], seed: int = 0, dtype: "np.dtype | type" = np.float32) -> "RowSource":
        """Random rows, each row drawn from its own seed (so any band split gives the same input);
        int8 rows for an int8 input."""
        n, c, _, w = shape
        line = np.empty((n, c, 1, w), dtype)

        def draw(h: int) -> np.ndarray:
            rng = np.random.default_rng(seed * 100003 + h)
            line[...] = (rng.integers(-128, 128, line.shape, dtype=np.int8) if line.dtype == np.int8
                         else rng.standard_normal(line.shape, dtype=np.float32))
            return line

        def band(h0: int, h1: int) -> np.ndarray:
            return np.concatenate([draw(h).copy() for h in range(h0, h1)], axis=2)

        def rows_into(out: np.ndarray, region: Region) -> None:
            for h in range(region.h0, region.h1):
                out[:, :, h - region.h0 : h - region.h0 + 1] = draw(h)[region.n0 : region.n1, :, :, region.w0 : region.w1]

        return RowSource(shape, band, rows_into)

    def whole(self) -> np.ndarray:
        return np.asarray(self.band(0, self.shape[2]))


def _rows_per_band(s: Step, graph: Graph, itemsize: int = 4) -> int:
    """Rows an input step asks a RowSource for at a time: as many whole-width rows as its
    scratch holds (a band and its concatenation, see techniques/tiling/planner.py), all of them without scratch."""
    if not s.scratch:
        return s.out.region.h
    n, c, _, w = (s.out.region.n,) + tuple(graph.shape(s.out.tensor)[1:])
    return max(1, s.scratch // (2 * n * c * w * itemsize))


def _load_rows(x: RowSource, out: np.ndarray, region: Region, rows_per_band: int) -> None:
    """A region of a RowSource into the view `out`: straight, or by bands of `rows_per_band` rows
    (their columns and samples sliced from each band)."""
    if x.rows_into is not None:
        x.rows_into(out, region)
        return
    for h0 in range(region.h0, region.h1, rows_per_band):
        h1 = min(h0 + rows_per_band, region.h1)
        band = np.asarray(x.band(h0, h1))
        if out.dtype == np.int8:  # an int8 input's rows: int8 values, as a whole int8 array is checked
            band = _int8_values(band, "of the row source")
        out[:, :, h0 - region.h0 : h1 - region.h0] = band[region.n0 : region.n1, :, :, region.w0 : region.w1]


class _Pipeline:
    """Stages = partitions in order; stage k works on frame f while stage k-1 works on f+1.
    A stage waits for its predecessor's frame f and for its successor to finish frame
    f - copies (whose FIFO copy frame f reuses). The last stage hands its outputs to the caller
    before it starts the next frame, so they are read before being overwritten."""

    def __init__(self, ex: ArenaExecutor):
        self.ex = ex

    def run(self, frames: Iterable, on_output: Callable) -> int:
        ex = self.ex
        n_stages = len(ex.plan.partitions)
        copies = len(ex.frames)
        inboxes: list[queue.Queue] = [queue.Queue() for _ in range(n_stages)]
        free = [threading.Semaphore(copies) for _ in range(n_stages)]
        errors: list[BaseException] = []
        delivered = [0]

        def stage(k: int) -> None:
            try:
                while (item := inboxes[k].get()) is not None:
                    f, xs = item
                    if k + 1 < n_stages:
                        free[k + 1].acquire()
                    ex.run_partition(ex.frames[f % copies][k], xs[ex.plan.partitions[k].model])
                    if k > 0:
                        free[k].release()
                    if k + 1 < n_stages:
                        inboxes[k + 1].put(item)
                    else:
                        on_output(f, ex._outputs[f % copies])
                        delivered[0] += 1
            except BaseException as e:  # surfaced in the caller's thread
                errors.append(e)
            finally:
                if k + 1 < n_stages:
                    inboxes[k + 1].put(None)

        threads = [threading.Thread(target=stage, args=(k,), daemon=True) for k in range(n_stages)]
        for t in threads:
            t.start()
        for f, x in enumerate(frames):
            inboxes[0].put((f, [x] if _single(x) else list(x)))
        inboxes[0].put(None)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return delivered[0]
