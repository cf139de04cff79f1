"""Random weights for the zoo's ONNX models: drawn by each weight's role, fan-in scaled, from a
seed, with batch-norm statistics scaled to a seeded random input (no downloads: the machine has
no internet, and values must neither vanish nor explode). numpy and onnxruntime only: no PyTorch."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

SEED = 20240601


def bn_scale(x: np.ndarray, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch norm's running (mean, variance) from its input `x` (channels on axis 1): the
    drawn values scaled to the input's size, mean x rms and variance x mean square per channel,
    so the output keeps about the scale of gamma however deep the network. The mean stays a
    small random fraction of the rms rather than the measured mean: subtracting a channel's
    true mean from values close to it would make the check ill-conditioned (float32
    cancellation amplified by mean / std). A channel silent on this batch gets a floor of 1% of
    the average mean square, so that another input cannot blow it up."""
    axes = tuple(i for i in range(x.ndim) if i != 1)
    ms = np.mean(np.square(x, dtype=np.float64), axis=axes)
    floor = 0.01 * float(ms.mean()) if ms.size and ms.mean() > 0 else 1.0
    ms = np.maximum(ms, floor)
    return (mean * np.sqrt(ms)).astype(np.float32), (var * ms).astype(np.float32)


# Nodes a weight may pass through on its way to the node that gives it its role.
_PASS_THROUGH = ("Unsqueeze", "Squeeze", "Reshape", "Identity", "Cast", "Flatten")


def randomize_onnx(model: onnx.ModelProto, seed: int = SEED) -> onnx.ModelProto:
    """Re-draw the float weights by role: conv / dense weights He-scaled by fan-in, batch-norm
    statistics non-trivial, per-channel scales (Caffe's Scale layer: Mul) near 1, biases and
    shifts small. Other constants (shapes, scalar factors) are kept.

    The ONNX zoo's "light" models ship their weights as ConstantOfShape placeholders (every
    value 0.02) computed from shape initializers; those nodes become initializers here, so the
    weights are real constants like in any exported model. Modifies and returns `model`."""
    rng = np.random.default_rng(seed)
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    placeholders: dict[str, np.ndarray] = {}
    nodes = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in consts:
            value = next((numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"),
                         np.zeros(1, np.float32))
            shape = tuple(int(d) for d in consts[node.input[0]].reshape(-1))
            placeholders[node.output[0]] = np.full(shape, value.reshape(-1)[0], dtype=value.dtype)
        else:
            nodes.append(node)
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in nodes:
        for i, t in enumerate(node.input):
            users.setdefault(t, []).append((node, i))

    def role(t: str) -> tuple[str, int, dict]:
        for _ in range(8):
            if not users.get(t):
                break
            node, i = users[t][0]
            if node.op_type in _PASS_THROUGH and i == 0:
                t = node.output[0]
                continue
            return node.op_type, i, {a.name: a for a in node.attribute}
        return "", -1, {}

    arrays = [(i.name, consts[i.name]) for i in g.initializer] + list(placeholders.items())
    inits = []
    for name, arr in arrays:
        if name not in users:
            continue  # only fed a placeholder (a shape), or unused
        new = _redraw(arr, *role(name), rng)
        inits.append(numpy_helper.from_array((arr if new is None else new).astype(arr.dtype), name))
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(inits)
    # Before IR version 4 every initializer is also a graph input: keep the inputs in step.
    kept = {i.name for i in inits}
    dropped = set(consts) - kept
    inputs = [i for i in g.input if i.name not in dropped]
    if model.ir_version < 4:
        listed = {i.name for i in inputs}
        inputs += [onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                   for i in inits if i.name not in listed]
    del g.input[:]
    g.input.extend(inputs)
    _calibrate_bn(model, seed)
    return model


def _calibrate_bn(model: onnx.ModelProto, seed: int) -> None:
    """randomize_module's batch-norm calibration for an ONNX model (see `bn_scale`): one pass of
    onnxruntime over the graph on a seeded random input, cut at each batch norm so that its
    statistics are scaled to its input just before it runs (onnxruntime cannot change a weight
    mid-run, and re-running the whole graph until the variances settle takes a round per batch
    norm on a chain)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    if not any(_calibrated(n, inits) for n in g.node):
        return
    x = next(i for i in g.input if i.name not in inits)
    shape = tuple(d.dim_value for d in x.type.tensor_type.shape.dim)
    live = {x.name: np.random.default_rng(seed + 1).standard_normal(shape, dtype=np.float32)}
    last = {t: k for k, n in enumerate(g.node) for t in n.input if t}
    for start, stop in _segments(g.node, inits):
        node = g.node[start]
        if _calibrated(node, inits):
            stats = node.input[3], node.input[4]
            base = [numpy_helper.to_array(inits[t]).astype(np.float64) for t in stats]
            for t, arr in zip(stats, bn_scale(live[node.input[0]].astype(np.float64), *base)):
                inits[t].CopyFrom(numpy_helper.from_array(arr, t))
        live.update(_run_segment(model, start, stop, live, inits))
        for t in [t for t in live if last.get(t, -1) < stop]:
            del live[t]


def _calibrated(node: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> bool:
    return node.op_type == "BatchNormalization" and len(node.input) >= 5 and node.input[3] in inits and node.input[4] in inits


def _segments(nodes: Sequence[onnx.NodeProto], inits: dict[str, onnx.TensorProto]) -> list[tuple[int, int]]:
    """[start, stop) ranges of the (topologically ordered) nodes, a new one at each batch norm."""
    cuts = [0] + [k for k, n in enumerate(nodes) if k and _calibrated(n, inits)] + [len(nodes)]
    return list(zip(cuts, cuts[1:]))


def _run_segment(model: onnx.ModelProto, start: int, stop: int, live: dict[str, np.ndarray],
                 inits: dict[str, onnx.TensorProto]) -> dict[str, np.ndarray]:
    """Run nodes [start, stop) in onnxruntime on the live tensors; every tensor they make."""
    import onnxruntime as ort

    nodes = list(model.graph.node[start:stop])
    made = [t for n in nodes for t in n.output if t]
    used = dict.fromkeys(t for n in nodes for t in n.input if t)
    feeds = {t: live[t] for t in used if t in live}
    graph = onnx.helper.make_graph(
        nodes, "segment", [onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                           for t, a in feeds.items()],
        [onnx.helper.make_empty_tensor_value_info(t) for t in made], [inits[t] for t in used if t in inits])
    sub = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=max(model.ir_version, 4))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    session = ort.InferenceSession(sub.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip(made, session.run(made, feeds)))


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)  # float32: VGG's 143M weights in ~1 s


def _redraw(arr: np.ndarray, op: str, idx: int, attrs: dict, rng: np.random.Generator) -> np.ndarray | None:
    if arr.dtype.kind != "f":
        return None
    if op == "Conv" and idx == 1:
        return _normal(rng, arr.shape) * float(np.sqrt(2.0 / np.prod(arr.shape[1:])))
    if op in ("Gemm", "MatMul") and idx == 1 and arr.ndim >= 2:
        # Caffe conversions store the weight 4-D, (out, in, 1, 1), and Reshape it to 2-D.
        trans_b = op == "Gemm" and "transB" in attrs and onnx.helper.get_attribute_value(attrs["transB"])
        fan_in = int(np.prod(arr.shape[1:])) if trans_b else arr.shape[0]
        return _normal(rng, arr.shape) / float(np.sqrt(fan_in))
    if op in ("Conv", "Gemm") and idx == 2:
        return rng.standard_normal(arr.shape) * 0.05
    if op == "BatchNormalization":
        n = arr.shape
        return {1: 0.8 + 0.4 * rng.random(n), 2: rng.standard_normal(n) * 0.1,
                3: rng.standard_normal(n) * 0.1, 4: 0.5 + rng.random(n)}.get(idx)
    if op in ("Mul", "Add", "Sum") and arr.size > 1:
        # A per-channel scale or shift (Caffe's Scale layer after a batch norm).
        return 0.8 + 0.4 * rng.random(arr.shape) if op == "Mul" else rng.standard_normal(arr.shape) * 0.1
    return None
