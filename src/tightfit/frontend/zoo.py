"""The built-in model zoo: torchvision architectures, models written from published layer tables,
and the ONNX model-zoo graphs shipped in the onnx wheel. Weights are random, fan-in scaled, from
a fixed seed, with batch-norm statistics scaled to a seeded random input (no downloads: the
machine has no internet, and values must neither vanish nor explode).

The table models and the ONNX zoo's are ONNX graphs from the start (tables.py): they need no
PyTorch. The torchvision models are exported from torch (the optional extra, torch_import.py).
Exported ONNX bytes are cached on disk (`cache_dir`) and imported graphs in memory (`load`)."""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from tightfit.cache import cache_dir, write_cache
from tightfit.frontend.tables import TABLES
from tightfit.graph.ir import Graph

SEED = 20240601


@dataclass(frozen=True)
class ZooEntry:
    name: str
    input_shape: tuple[int, int, int, int]
    source: str  # "torchvision" (needs the torch extra), "table", "onnxzoo"
    about: str


# name -> (torchvision's keyword arguments, input shape, about)
TORCHVISION: dict[str, tuple[dict[str, Any], tuple[int, int, int, int], str]] = {
    "resnet18": ({}, (1, 3, 224, 224), "ResNet-18"),
    "resnet50": ({}, (1, 3, 224, 224), "ResNet-50"),
    "mobilenet_v2": ({}, (1, 3, 224, 224), "MobileNetV2"),
    "googlenet": ({"aux_logits": False, "init_weights": False, "transform_input": False}, (1, 3, 224, 224), "GoogLeNet (Inception v1)"),
    "squeezenet1_0": ({}, (1, 3, 224, 224), "SqueezeNet 1.0"),
    "densenet121": ({}, (1, 3, 224, 224), "DenseNet-121"),
    "vgg19": ({"init_weights": False}, (1, 3, 224, 224), "VGG-19"),
    "efficientnet_b0": ({}, (1, 3, 224, 224), "EfficientNet-B0"),
    "inception_v3": ({"aux_logits": False, "init_weights": False, "transform_input": False}, (1, 3, 299, 299), "Inception v3"),
    "mobilenet_v3_small": ({}, (1, 3, 224, 224), "MobileNetV3-Small"),
}

ONNXZOO = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
           "squeezenet", "vgg19", "zfnet512")


def entries() -> list[ZooEntry]:
    out = [ZooEntry(n, shape, "torchvision", about) for n, (_, shape, about) in TORCHVISION.items()]
    out += [ZooEntry(n, shape, "table", about) for n, (_, shape, about) in TABLES.items()]
    for n in ONNXZOO:
        out.append(ZooEntry(f"onnxzoo-{n}", _onnxzoo_shape(n), "onnxzoo", f"ONNX model zoo {n} (onnx wheel, weights re-drawn)"))
    return out


def names() -> list[str]:
    return [e.name for e in entries()]


def _onnxzoo_path(name: str) -> str:
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", f"light_{name}.onnx")


@functools.lru_cache(maxsize=None)
def _onnxzoo_shape(name: str) -> tuple[int, int, int, int]:
    model = onnx.load(_onnxzoo_path(name), load_external_data=False)
    init = {i.name for i in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in init)
    return tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)  # type: ignore[return-value]


# --- random weights -------------------------------------------------------------------------

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


def torch_module(name: str):
    """A torchvision model of the zoo as a PyTorch module with its seeded random weights (the
    reference for tests; needs the torch extra)."""
    from tightfit.frontend import torch_import

    kw, shape, _ = TORCHVISION[name]
    return torch_import.randomize_module(torch_import.torchvision_factory(name, **kw)(), SEED, calibrate_shape=shape)


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


def onnx_model(name: str, input_shape: Sequence[int] | None = None) -> bytes:
    """The zoo model as ONNX bytes with its random weights (what tests give onnxruntime).

    Torch models are exported at `input_shape` (default: the zoo's); the ONNX zoo's models
    keep their own declared shape (give the shape to `load` instead). Exporting is slow (VGG-19
    takes ~15 s), so the bytes are kept on disk, see `cache_dir`."""
    _check_name(name)
    if name in TORCHVISION:
        from tightfit.frontend.torch_import import require_torch

        require_torch(f"zoo model {name!r} (from torchvision)", torchvision=True)
    if name.startswith("onnxzoo-"):
        shape = None
    else:
        shape = _default_shape(name) if input_shape is None else tuple(int(d) for d in input_shape)
    return _onnx_bytes(name, shape)


@functools.lru_cache(maxsize=2)
def _onnx_bytes(name: str, shape: tuple[int, ...] | None) -> bytes:
    path = _cache_path(name, shape)
    cached = _cached_model(path)
    if cached is not None:
        return cached
    data = _make(name, shape).SerializeToString()
    if path is not None and write_cache(path, data):
        for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.onnx"):
            if stale != path:  # made by another version of the code
                try:
                    stale.unlink()
                except OSError:
                    pass
    return data


def _make(name: str, shape: tuple[int, ...] | None) -> onnx.ModelProto:
    if name.startswith("onnxzoo-"):
        return randomize_onnx(onnx.load(_onnxzoo_path(name[len("onnxzoo-"):])))
    if name in TABLES:
        model = onnx.load_from_string(_table_bytes(name))
        dims = model.graph.input[0].type.tensor_type.shape.dim
        for d, n in zip(dims, shape or ()):
            d.dim_value = n
        return model
    from tightfit.frontend.torch_import import export_onnx

    return export_onnx(torch_module(name), shape)


@functools.lru_cache(maxsize=2)
def _table_bytes(name: str) -> bytes:
    """A table model with its weights drawn and calibrated at the zoo's input shape, whatever
    shape it is then declared at (as the torch models are): the same weights at every shape."""
    build, shape, _ = TABLES[name]
    return randomize_onnx(build(shape)).SerializeToString()


def _source(name: str) -> str:
    return "onnxzoo" if name.startswith("onnxzoo-") else "table" if name in TABLES else "torchvision"


@functools.lru_cache(maxsize=None)
def _code_version(source: str) -> str:
    """What the made bytes depend on besides the name and shape: library versions, the seed and
    the sources that build and draw them (onnxruntime calibrates the batch norms; torch exports
    the torchvision models), so editing a model or the weight drawing invalidates the cache."""
    import onnxruntime

    from tightfit.frontend import tables

    parts = [onnx.__version__, np.__version__, onnxruntime.__version__, str(SEED)]
    files = [__file__, tables.__file__]
    if source == "torchvision":
        from tightfit.frontend import torch_import

        parts += [*torch_import.versions(), str(torch_import.OPSET)]
        files.append(torch_import.__file__)
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() + b"\0")
    for mod_file in files:
        h.update(Path(mod_file).read_bytes())
    return h.hexdigest()[:16]


def _cache_path(name: str, shape: tuple[int, ...] | None) -> Path | None:
    base = cache_dir()
    if base is None:
        return None
    dims = "x".join(map(str, shape)) if shape is not None else "declared"
    return base / "zoo" / f"{name}-{dims}-{_code_version(_source(name))}.onnx"


def _cached_model(path: Path | None) -> bytes | None:
    """The cached ONNX bytes if they hold a model with a graph (inputs, outputs, nodes); None
    when missing or damaged (truncated, overwritten, another file's bytes): made again then."""
    if path is None:
        return None
    try:
        data = path.read_bytes()
        model = onnx.load_from_string(data)
    except (OSError, DecodeError, ValueError):
        return None
    g = model.graph
    return data if g.node and g.input and g.output and g.initializer and model.opset_import else None


def _check_name(name: str) -> None:
    if name not in names():
        from tightfit.errors import ModelLoadError

        raise ModelLoadError(f"no zoo model {name!r}; `tightfit zoo` lists them")


def _default_shape(name: str) -> tuple[int, ...]:
    return next(e.input_shape for e in entries() if e.name == name)


def load(name: str, input_shape: Sequence[int] | None = None) -> Graph:
    """Import a zoo model. Graphs are immutable and cached per (name, shape): callers share
    them, so never write into a graph's parameter arrays."""
    _check_name(name)
    shape = _default_shape(name) if input_shape is None else tuple(int(d) for d in input_shape)
    return _load(name, shape)


@functools.lru_cache(maxsize=None)
def _load(name: str, shape: tuple[int, ...]) -> Graph:
    from tightfit.frontend.onnx_import import import_model

    model = onnx.load_from_string(onnx_model(name, shape))
    return import_model(model, shape, name)


def clear_cache() -> None:
    """Drop the in-memory caches of graphs and ONNX bytes (the disk cache stays)."""
    _load.cache_clear()
    _onnx_bytes.cache_clear()
    _table_bytes.cache_clear()
