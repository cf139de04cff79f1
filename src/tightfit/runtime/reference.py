"""One layer on the kernel library from whole arrays (the op-case tests' entry), and the random
inputs runs are made with. The whole-graph reference run is tightfit/reference.py."""
from __future__ import annotations

import numpy as np

from tightfit.graph.ir import Graph


def input_shapes(graph: Graph, batch: int | None = None) -> "tuple[int, ...] | dict[str, tuple[int, ...]]":
    """The model's input shape (`batch` samples), or {input name: shape} for a model of several."""
    shapes = {t: tuple(graph.shape(t)) if batch is None else (batch,) + tuple(graph.shape(t)[1:]) for t in graph.inputs}
    return shapes[graph.inputs[0]] if len(shapes) == 1 else shapes


def input_dtype(graph: Graph, tensor: str) -> np.dtype:
    """The element type a model input arrives in: int8 for an int8 graph input (a .tflite whose
    input is int8: its integers, as TFLite Micro takes them), else float32."""
    return np.dtype(np.int8 if graph.tensors[tensor].dtype == "int8" else np.float32)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if dtype == np.int8:
        return rng.integers(-128, 128, shape, dtype=np.int8)
    return rng.standard_normal(shape, dtype=np.float32)


def random_input(graph: Graph, batch: int | None = None, seed: int = 0) -> "np.ndarray | dict[str, np.ndarray]":
    """Seeded random input: an array, or {input name: array} for a model of several inputs (the
    first drawn from `seed` alone, as a model of one input is); an int8 input's are random int8."""
    shapes = input_shapes(graph, batch)
    if not isinstance(shapes, dict):
        return _draw(np.random.default_rng(seed), shapes, input_dtype(graph, graph.inputs[0]))
    return {t: _draw(np.random.default_rng(seed if k == 0 else [seed, k]), s, input_dtype(graph, t))
            for k, (t, s) in enumerate(shapes.items())}


def input_arrays(graph: Graph, x) -> list[np.ndarray]:
    """A model's input(s) as arrays in its input order, each in its own element type (how a file or
    a C program holds them: one after another)."""
    from collections.abc import Mapping

    xs = [x[t] for t in graph.inputs] if isinstance(x, Mapping) else [x]
    return [np.asarray(v, input_dtype(graph, t)) for v, t in zip(xs, graph.inputs)]


def run_layer(layer, inputs, params, out) -> None:
    """One layer's whole output written into `out` (anything numpy views in place: an array, a
    CPU tensor) from whole `inputs`, with `params` the layer's arrays in its order, on the
    kernel library: inputs and output laid out NCHW in an arena of their own."""
    from dataclasses import replace

    from tightfit.kernels.step_args import Bind, Pool, View, _dims4, layer_args
    from tightfit.graph.ir import Tensor
    from tightfit.ops import get_op
    from tightfit.ops.base import Region
    from tightfit.kernels import library as kernels

    y = np.asarray(out)
    arrays = {t: np.asarray(x, dtype=np.float32) for t, x in zip(layer.inputs, inputs)}
    at, views = 0, {}
    for t, shape in list((t, a.shape) for t, a in arrays.items()) + [(layer.output, y.shape)]:
        n, c, h, w = _dims4(shape)
        views[t] = View(at, (n, c, h, w), (c * h * w, h * w, w, 1))
        at += -(-n * c * h * w // 16) * 16
    tensors = {t: Tensor(t, tuple(a.shape)) for t, a in arrays.items()} | {layer.output: Tensor(layer.output, y.shape)}
    graph = Graph("layer", (replace(layer, id=0),), tensors, tuple(arrays), (layer.output,),
                  {p: np.asarray(a, dtype=np.float32) for p, a in zip(layer.params, params)})
    weights, indices = Pool(np.float32), Pool(np.int32)
    region = Region.whole(y.shape)
    windows = get_op(layer.op).input_windows(layer, region, [arrays[t].shape for t in layer.inputs])
    xs = [_window(views[t], w.region, arrays[t].ndim) for t, w in zip(layer.inputs, windows)]  # a kernel reads its window
    args = layer_args(Bind(graph, region, int(y.shape[0]), 0, weights, indices), graph.layers[0], xs, views[layer.output])
    arena = np.zeros(max(at, 1), np.float32)
    for t, a in arrays.items():
        arena[views[t].off : views[t].off + a.size] = a.reshape(-1)
    table, wts, idx = kernels.StepTable([args]), weights.array(), indices.array()
    kernels.library().tf_run(arena.ctypes.data, wts.ctypes.data, idx.ctypes.data, table.address, 1, None, None, 1)
    v = views[layer.output]
    y[...] = arena[v.off : v.off + y.size].reshape(y.shape)


def _window(v, r, rank: int = 4):
    """The part of a whole tensor's view `v` that region `r` (an input window) covers; a tensor of
    another rank than 4 has regions over N alone (its view's other dims stay whole: tokens)."""
    from tightfit.kernels.step_args import View

    sn, _, sh, sw = v.strides
    if rank != 4:
        return View(v.off + r.n0 * sn, (r.n,) + tuple(v.dims[1:]), v.strides)
    return View(v.off + r.n0 * sn + r.h0 * sh + r.w0 * sw, (r.n, v.dims[1], r.h, r.w), v.strides)
