"""The arena executor: runs any plan. One preallocated arena; every buffer is a view at
arena + offset; every step's views are built once, so the per-step loop only calls kernels, and
a run of consecutive steps on our own kernels (ops/native.py) is one call of a C loop.

It knows no planner: it reads steps and buffers. Pipelined partitions (plan.concurrent) run in
threads on a stream of inputs, one frame apart, with FIFO buffers double-buffered by the plan.
"""
from __future__ import annotations

import functools
import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import torch

from tightfit.graph.ir import Graph
from tightfit.ops import get_op
from tightfit.ops.native import NativeCalls, copy_call, input_call, move_call
from tightfit.plan.lifetimes import output_accesses
from tightfit.plan.schema import Access, Buffer, Plan, Step
from tightfit.runtime.reference import load_params

DTYPES = {"fp32": torch.float32}


def buffer_view(arena: torch.Tensor, b: Buffer, copy: int = 0) -> torch.Tensor:
    """The buffer as a logical (N, C, H, W) or flat tensor over the arena's bytes."""
    start = b.offsets[copy] // b.itemsize
    flat = arena[start : start + b.nbytes // b.itemsize]
    if b.layout == "nhwc":
        n, c, h, w = b.shape
        return flat.view(n, h, w, c).permute(0, 3, 1, 2)
    return flat.view(b.shape)


def access_view(buf: torch.Tensor, a: Access) -> torch.Tensor:
    n, h, w = a.at
    r = a.region
    if buf.dim() == 4:
        return buf[n : n + r.n, :, h : h + r.h, w : w + r.w]
    return buf[n : n + r.n]


@dataclass(frozen=True)
class _Compiled:
    """One step ready to run: a kernel call with its views bound."""

    run: Callable[..., None]
    args: tuple


@dataclass(frozen=True)
class _Partition:
    """A partition's steps ready to run, each run of consecutive native calls merged into one.
    `steps` read the input set by `set_input` (any input: a RowSource too); `tensor_steps`, where
    every input step has a native copy, read a contiguous fp32 tensor of `input_shape`, whose
    address each run writes into `patches` ((copy arguments, byte offset) per input step)."""

    steps: list[_Compiled]
    tensor_steps: list[_Compiled] | None = None
    patches: tuple = ()
    input_shape: tuple[int, ...] = ()

    def run(self, x: "torch.Tensor | RowSource | None") -> None:
        steps = self.steps
        if (self.tensor_steps is not None and isinstance(x, torch.Tensor) and x.dtype == torch.float32
                and tuple(x.shape) == self.input_shape and x.is_contiguous()):
            base = x.data_ptr()
            for args, offset in self.patches:
                args.x = base + offset
            steps = self.tensor_steps
        else:
            _INPUT.x = x
        for st in steps:
            st.run(*st.args)


class ArenaExecutor:
    def __init__(self, plan: Plan, graphs: Sequence[Graph], params: Sequence[dict] | None = None, fill_nan: bool = False):
        if plan.dtype not in DTYPES:
            from tightfit.errors import OptionError

            raise OptionError(f"the executor runs fp32 plans; this plan is {plan.dtype} (accounting only)")
        self.plan, self.graphs = plan, list(graphs)
        self.params = list(params) if params is not None else [load_params(g) for g in graphs]
        # +1 element so a zero-size plan still has storage; offsets are byte offsets.
        self.arena = torch.empty(max(plan.arena_bytes // 4, 1), dtype=torch.float32)
        self.arena.fill_(float("nan") if fill_nan else 0.0)
        copies = max((b.copies for b in plan.buffers), default=1)
        self.frames = [self._compile(c) for c in range(copies)]
        self._outputs = [self._output_views(c) for c in range(copies)]

    # --- compilation --------------------------------------------------------------------------
    def _views(self, copy: int) -> list[torch.Tensor]:
        views = []
        base = self.arena.data_ptr()
        for b in self.plan.buffers:
            v = buffer_view(self.arena, b, copy % b.copies)
            assert v.data_ptr() == base + b.offsets[copy % b.copies], f"buffer {b.id} is not at arena + offset"
            views.append(v)
        return views

    def _compile(self, copy: int) -> list[_Partition]:
        """Per partition, its steps bound to the views of frame parity `copy`."""
        views = self._views(copy)
        return [self._compile_partition(p, views) for p in self.plan.partitions]

    def _compile_partition(self, p, views: list[torch.Tensor]) -> _Partition:
        graph, batch = self.graphs[p.model], self.plan.models[p.model].batch
        steps = [compile_step(s, views, graph, self.params[p.model], batch) for s in p.steps]
        input_shape = (batch,) + graph.shape(graph.inputs[0])[1:]
        natives = {i: native_input(s, views, input_shape) for i, s in enumerate(p.steps) if s.kind == "input"}
        if not natives or None in natives.values():
            return _Partition(batch_native(steps))
        tensor_steps = [_Compiled(natives[i][0], ()) if i in natives else st for i, st in enumerate(steps)]
        patches = tuple((args, offset) for _, args, offset in natives.values())
        return _Partition(batch_native(steps), batch_native(tensor_steps), patches, input_shape)

    def _output_views(self, copy: int) -> list[dict[str, torch.Tensor]]:
        views = self._views(copy)
        outs: list[dict[str, torch.Tensor]] = [dict() for _ in self.graphs]
        for m, a in output_accesses(self.plan, self.graphs):
            outs[m][a.tensor] = access_view(views[a.buffer], a)
        return outs

    # --- running --------------------------------------------------------------------------------
    def run(self, inputs: torch.Tensor | Sequence[torch.Tensor], frame: int = 0) -> list[dict[str, torch.Tensor]]:
        """One input per model; returns per model its outputs as views into the arena (valid until
        the next run)."""
        xs = [inputs] if isinstance(inputs, (torch.Tensor, RowSource)) else list(inputs)
        copy = frame % len(self.frames)
        with torch.no_grad():
            for p, compiled in zip(self.plan.partitions, self.frames[copy]):
                compiled.run(xs[p.model])
        return self._outputs[copy]

    def run_stream(self, frames: Iterable[torch.Tensor | Sequence[torch.Tensor]],
                   on_output: Callable[[int, list[dict[str, torch.Tensor]]], None]) -> int:
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


def compile_step(s: Step, views: Sequence[torch.Tensor], graph: Graph, params: dict, batch: int) -> _Compiled:
    """One step bound to the buffer views it reads and writes (views[buffer id])."""
    out_view = access_view(views[s.out.buffer], s.out)
    if s.kind == "input":
        return _Compiled(_load_input, (out_view, s.out.region, _rows_per_band(s, graph, out_view.element_size())))
    if s.kind == "copy":
        src = s.inputs[0]
        src_view = access_view(views[src.buffer], src)
        if src.buffer == s.out.buffer and _overlap(src, s.out):
            native = move_call(out_view, src_view)
            if native is not None:
                return _Compiled(native, ())
            moved = [d for d in range(3) if src.at[d] != s.out.at[d]]
            if len(moved) == 1:  # samples, rows or columns moved along one dimension
                dim = (0, 2, 3)[moved[0]]
                return _Compiled(_shift, (out_view, src_view, src.at[moved[0]] - s.out.at[moved[0]], dim))
            return _Compiled(_copy_via_temp, (out_view, src_view))
        return _Compiled(copy_call(out_view, src_view) or functools.partial(torch.Tensor.copy_, out_view, src_view), ())
    layer = graph.layers[s.layer]
    op = get_op(layer.op)
    in_shapes = [(batch,) + graph.shape(t)[1:] for t in layer.inputs]
    windows = op.input_windows(layer, s.out.region, in_shapes)
    ins = [access_view(views[a.buffer], a) for a in s.inputs]
    return _Compiled(op.bind(layer, ins, windows, out_view, s.out.region, params[layer.id]), ())


def native_input(s: Step, views: Sequence[torch.Tensor], input_shape: tuple[int, ...]) -> tuple | None:
    """Input step `s` as our copy from a contiguous input tensor of `input_shape` (see
    native.input_call: the call, its arguments, the byte offset), or None."""
    r = s.out.region
    return input_call(access_view(views[s.out.buffer], s.out), (r.n0, r.h0, r.w0), input_shape)


def batch_native(steps: list[_Compiled]) -> list[_Compiled]:
    """The steps with each run of consecutive native calls (ops/native.py) merged into one."""
    out: list[_Compiled] = []
    for native, run in itertools.groupby(steps, key=lambda st: isinstance(st.run, NativeCalls)):
        run = list(run)
        out += [_Compiled(NativeCalls.merged([st.run for st in run]), ())] if native and len(run) > 1 else run
    return out


def _overlap(a: Access, b: Access) -> bool:
    """Whether two accesses of one buffer share cells (their regions have the same size)."""
    size = (a.region.n, a.region.h, a.region.w)
    return all(x < y + k and y < x + k for x, y, k in zip(a.at, b.at, size))


def _copy_via_temp(out: torch.Tensor, src: torch.Tensor) -> None:
    """A move within one buffer whose source and destination overlap other than by whole rows
    (counted as scratch)."""
    out.copy_(src.clone())


def _shift(out: torch.Tensor, src: torch.Tensor, shift: int, dim: int) -> None:
    """Samples, rows or columns (`dim`) moved `shift` places towards the start (the end if
    negative) within one buffer, without a temporary: in chunks of |shift|, in the order that
    reads every place before it is overwritten."""
    size, step = out.shape[dim], abs(shift)
    starts = range(0, size, step) if shift > 0 else reversed(range(0, size, step))
    for i in starts:
        out.narrow(dim, i, min(step, size - i)).copy_(src.narrow(dim, i, min(step, size - i)))


class _InputSlot(threading.local):
    x: torch.Tensor | None = None


_INPUT = _InputSlot()


def set_input(x: "torch.Tensor | RowSource | None") -> None:
    """The model input that this thread's input steps read."""
    _INPUT.x = x


class RowSource:
    """An input delivered by parts, as a camera or decoder delivers row bands: `band(h0, h1)`
    returns rows [h0, h1) of the (N, C, H, W) input; the executor asks for the bands its input
    steps need, so the whole input never has to exist. A source with `rows_into(out, region)`
    writes a region's rows straight into the view `out`, through a line buffer of its own (a
    camera's line, allocated with the source), so a run allocates no band."""

    def __init__(self, shape: Sequence[int], band: Callable[[int, int], torch.Tensor],
                 rows_into: "Callable[[torch.Tensor, object], None] | None" = None):
        self.shape = tuple(shape)
        self.band = band
        self.rows_into = rows_into

    @staticmethod
    def seeded(shape: Sequence[int], seed: int = 0) -> "RowSource":
        """Random rows, each row drawn from its own seed (so any band split gives the same input)."""
        n, c, _, w = shape
        line = torch.empty((n, c, 1, w))
        generator = torch.Generator()

        def draw(h: int) -> torch.Tensor:
            return torch.randn((n, c, 1, w), generator=generator.manual_seed(seed * 100003 + h), out=line)

        def band(h0: int, h1: int) -> torch.Tensor:
            return torch.cat([draw(h).clone() for h in range(h0, h1)], dim=2)

        def rows_into(out: torch.Tensor, region) -> None:
            for h in range(region.h0, region.h1):
                out[:, :, h - region.h0 : h - region.h0 + 1].copy_(draw(h)[region.n0 : region.n1, :, :, region.w0 : region.w1])

        return RowSource(shape, band, rows_into)

    def whole(self) -> torch.Tensor:
        return self.band(0, self.shape[2])


def _rows_per_band(s: Step, graph: Graph, itemsize: int) -> int:
    """Rows an input step asks a RowSource for at a time: as many whole-width rows as its
    scratch holds (a band and its concatenation, see techniques/tiling/planner.py), all of them without scratch."""
    if not s.scratch:
        return s.out.region.h
    n, c, _, w = (s.out.region.n,) + tuple(graph.shape(s.out.tensor)[1:])
    return max(1, s.scratch // (2 * n * c * w * itemsize))


def _load_input(out: torch.Tensor, region, rows_per_band: int) -> None:
    """Copy a region of the current input into its buffer: a slice of a whole tensor (one copy),
    or the bands a RowSource delivers, `rows_per_band` rows at a time (their columns and samples
    sliced from each band)."""
    x = _INPUT.x
    if not isinstance(x, RowSource):
        out.copy_(region.slice(x))
        return
    if x.rows_into is not None:
        x.rows_into(out, region)
        return
    for h0 in range(region.h0, region.h1, rows_per_band):
        h1 = min(h0 + rows_per_band, region.h1)
        band = x.band(h0, h1)
        out[:, :, h0 - region.h0 : h1 - region.h0].copy_(band[region.n0 : region.n1, :, :, region.w0 : region.w1])


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
                with torch.no_grad():
                    while (item := inboxes[k].get()) is not None:
                        f, xs = item
                        if k + 1 < n_stages:
                            free[k + 1].acquire()
                        ex.frames[f % copies][k].run(xs[ex.plan.partitions[k].model])
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
            inboxes[0].put((f, [x] if isinstance(x, torch.Tensor) else list(x)))
        inboxes[0].put(None)
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return delivered[0]
