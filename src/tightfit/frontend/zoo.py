"""The built-in model zoo: torchvision architectures, models written from published layer tables,
and the ONNX model-zoo graphs shipped in the onnx wheel. Weights are random, fan-in scaled, from
a fixed seed, with batch-norm statistics scaled to a seeded random input (no downloads: the
machine has no internet, and values must neither vanish nor explode).

Exported ONNX bytes are cached on disk (`cache_dir`) and imported graphs in memory (`load`)."""
from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from google.protobuf.message import DecodeError
from onnx import numpy_helper

from tightfit.cache import cache_dir, write_cache
from tightfit.graph.ir import Graph

SEED = 20240601


@dataclass(frozen=True)
class ZooEntry:
    name: str
    input_shape: tuple[int, int, int, int]
    source: str  # "torchvision", "table", "onnxzoo"
    about: str


def _tv(name: str, **kw) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None, **kw)

    return make


# --- models written from published layer tables ---------------------------------------------

def _conv_bn_leaky(cin: int, cout: int, k: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, 1, k // 2, bias=False), nn.BatchNorm2d(cout), nn.LeakyReLU(0.1)]


def yolov2_16() -> nn.Module:
    """YOLOv2's first 16 layers as in MAFAT Table 2.1 (Darknet: conv + BN + leaky, 2x2 max)."""
    spec = [(32, 3), "M", (64, 3), "M", (128, 3), (64, 1), (128, 3), "M",
            (256, 3), (128, 1), (256, 3), "M", (512, 3), (256, 1), (512, 3), (256, 1)]
    return nn.Sequential(*_darknet(spec, 3))


def _darknet(spec: Sequence, cin: int) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for s in spec:
        if s == "M":
            layers.append(nn.MaxPool2d(2, 2))
        elif s == "M1":
            layers += [nn.ReplicationPad2d((0, 1, 0, 1)), nn.MaxPool2d(2, 1)]
        else:
            cout, k = s
            layers += _conv_bn_leaky(cin, cout, k)
            cin = cout
    return layers


def tiny_yolov2() -> nn.Module:
    """Tiny YOLOv2 (VOC, 416x416): 9 conv layers, 6 max pools, 125-channel 13x13 head."""
    spec = [(16, 3), "M", (32, 3), "M", (64, 3), "M", (128, 3), "M", (256, 3), "M", (512, 3), "M1",
            (1024, 3), (1024, 3)]
    return nn.Sequential(*_darknet(spec, 3), nn.Conv2d(1024, 125, 1))


def mobilenet_v1(width: float = 1.0) -> nn.Module:
    """MobileNet v1 (Howard et al. 2017, Table 1) with width multiplier."""
    def c(ch: int) -> int:
        return max(8, int(ch * width))

    layers: list[nn.Module] = [nn.Conv2d(3, c(32), 3, 2, 1, bias=False), nn.BatchNorm2d(c(32)), nn.ReLU()]
    cin = c(32)
    for cout, stride in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]:
        layers += [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU(),
                   nn.Conv2d(cin, c(cout), 1, bias=False), nn.BatchNorm2d(c(cout)), nn.ReLU()]
        cin = c(cout)
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


class Minakova5(nn.Module):
    """The 5-layer example CNN of Minakova & Stefanov Fig. 1: n1 input 32x32x1; n2 17x17 conv to
    16x16x4; n3 5x5 stride-3 conv with crop 1 (pad -1) to 4x4x3; n4 4x4 conv to 1x1x2; n5 output."""

    def __init__(self) -> None:
        super().__init__()
        self.n2 = nn.Conv2d(1, 4, 17)
        self.n3 = nn.Conv2d(4, 3, 5, stride=3)
        self.n4 = nn.Conv2d(3, 2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.n2(x)
        return self.n4(self.n3(F.pad(x, (-1, -1, -1, -1))))


_TORCH: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int, int], str, str]] = {
    "resnet18": (_tv("resnet18"), (1, 3, 224, 224), "torchvision", "ResNet-18"),
    "resnet50": (_tv("resnet50"), (1, 3, 224, 224), "torchvision", "ResNet-50"),
    "mobilenet_v2": (_tv("mobilenet_v2"), (1, 3, 224, 224), "torchvision", "MobileNetV2"),
    "googlenet": (_tv("googlenet", aux_logits=False, init_weights=False, transform_input=False), (1, 3, 224, 224), "torchvision", "GoogLeNet (Inception v1)"),
    "squeezenet1_0": (_tv("squeezenet1_0"), (1, 3, 224, 224), "torchvision", "SqueezeNet 1.0"),
    "densenet121": (_tv("densenet121"), (1, 3, 224, 224), "torchvision", "DenseNet-121"),
    "vgg19": (_tv("vgg19", init_weights=False), (1, 3, 224, 224), "torchvision", "VGG-19"),
    "efficientnet_b0": (_tv("efficientnet_b0"), (1, 3, 224, 224), "torchvision", "EfficientNet-B0"),
    "inception_v3": (_tv("inception_v3", aux_logits=False, init_weights=False, transform_input=False), (1, 3, 299, 299), "torchvision", "Inception v3"),
    "mobilenet_v3_small": (_tv("mobilenet_v3_small"), (1, 3, 224, 224), "torchvision", "MobileNetV3-Small"),
    "yolov2-16": (yolov2_16, (1, 3, 608, 608), "table", "YOLOv2 first 16 layers (MAFAT Table 2.1)"),
    "tiny-yolov2": (tiny_yolov2, (1, 3, 416, 416), "table", "Tiny YOLOv2 (VOC)"),
    "mobilenet_v1": (mobilenet_v1, (1, 3, 224, 224), "table", "MobileNet v1, width 1.0"),
    "mobilenet_v1_025": (functools.partial(mobilenet_v1, 0.25), (1, 3, 224, 224), "table", "MobileNet v1, width 0.25"),
    "minakova5": (Minakova5, (1, 1, 32, 32), "table", "5-layer example CNN of Minakova & Stefanov Fig. 1"),
}

ONNXZOO = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
           "squeezenet", "vgg19", "zfnet512")


def entries() -> list[ZooEntry]:
    out = [ZooEntry(n, s, src, about) for n, (_, s, src, about) in _TORCH.items()]
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

def randomize_module(module: nn.Module, seed: int = SEED,
                     calibrate_shape: Sequence[int] | None = None) -> nn.Module:
    """He-scaled conv and dense weights, non-trivial batch-norm statistics, small biases.

    With `calibrate_shape`, each batch norm's running statistics are then scaled to its input
    on a seeded random batch of that shape (see `_bn_scale`), so that values keep their scale
    however deep the network is: without it, residual networks grow by orders of magnitude
    (ResNet-50's logits reached ~4e3, ShuffleNet's ~1e5, past what fp16 holds)."""
    g = torch.Generator().manual_seed(seed)
    bns = []
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                gain = 1.0 if isinstance(m, nn.Linear) else 2.0
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (gain / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.05)
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.weight.copy_(0.8 + 0.4 * torch.rand(c, generator=g))
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
                bns.append(m)
        module.eval()
        if calibrate_shape is not None and bns:
            x = torch.randn(tuple(calibrate_shape), generator=g)

            def calibrate(bn: nn.Module, args: tuple) -> None:
                # Runs before the batch norm itself, so each one sees calibrated inputs.
                mean, var = _bn_scale(args[0].double().numpy(), bn.running_mean.double().numpy(),
                                      bn.running_var.double().numpy())
                bn.running_mean.copy_(torch.from_numpy(mean))
                bn.running_var.copy_(torch.from_numpy(var))

            hooks = [m.register_forward_pre_hook(calibrate) for m in bns]
            try:
                module(x)
            finally:
                for h in hooks:
                    h.remove()
    return module


def _bn_scale(x: np.ndarray, mean: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def torch_module(name: str) -> nn.Module:
    """The zoo's PyTorch module with its seeded random weights (the reference for tests)."""
    make, shape, _, _ = _TORCH[name]
    return randomize_module(make(), SEED, calibrate_shape=shape)


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
    _calibrate_onnx_bn(model, seed)
    return model


def _calibrate_onnx_bn(model: onnx.ModelProto, seed: int) -> None:
    """randomize_module's batch-norm calibration for an ONNX model (see `_bn_scale`). One pass
    of the reference kernels over the model imported with its batch norms unfused, each batch
    norm calibrated just before it runs (onnxruntime cannot change a weight mid-run, and
    re-running it until the variances settle takes a round per batch norm on a chain)."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    stats_of = {n.name or n.output[0]: (n.input[3], n.input[4]) for n in g.node
                if n.op_type == "BatchNormalization" and len(n.input) >= 5 and n.input[3] in inits and n.input[4] in inits}
    if not stats_of:
        return
    from tightfit.frontend.onnx_import import import_model
    from tightfit.graph.ir import last_reads
    from tightfit.ops import get_op, run_layer

    from tightfit.errors import TightfitError

    try:
        graph = import_model(model, None, "calibration", fuse_batchnorm=False)
    except TightfitError:
        return  # a model tightfit cannot run keeps its drawn statistics
    shape = graph.shape(graph.inputs[0])
    live = {graph.inputs[0]: torch.from_numpy(np.random.default_rng(seed + 1).standard_normal(shape, dtype=np.float32))}
    last = last_reads(graph)
    new: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for layer in graph.layers:
            arrays = [graph.params[p] for p in layer.params]
            stats = stats_of.get(layer.nodes[0]) if layer.op == "batchnorm" else None
            if stats is not None:
                base = [numpy_helper.to_array(inits[t]).astype(np.float64) for t in stats]
                new[stats[0]], new[stats[1]] = _bn_scale(live[layer.inputs[0]].double().numpy(), *base)
                arrays = arrays[:2] + [new[stats[0]], new[stats[1]]]
            out = torch.empty(graph.shape(layer.output), dtype=torch.float32)
            run_layer(layer, [live[t] for t in layer.inputs], get_op(layer.op).prepare_params(layer, arrays), out)
            live[layer.output] = out
            for t in set(layer.inputs):
                if last.get(t) == layer.id:
                    del live[t]
    for var, arr in new.items():
        inits[var].CopyFrom(numpy_helper.from_array(arr, var))


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
    if name.startswith("onnxzoo-"):
        model = onnx.load(_onnxzoo_path(name[len("onnxzoo-"):]))
        data = randomize_onnx(model).SerializeToString()
    else:
        from tightfit.frontend.torch_import import export_onnx

        data = export_onnx(torch_module(name), shape).SerializeToString()
    if path is not None and write_cache(path, data):
        for stale in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.onnx"):
            if stale != path:  # made by another version of the code
                try:
                    stale.unlink()
                except OSError:
                    pass
    return data


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """What the exported bytes depend on besides the name and shape: library versions, the
    seed and the source of this module, the exporter and the importer (the ONNX zoo's batch
    norms are calibrated through it), so editing a model or the weight drawing invalidates the
    cache. The ops' kernels are not keyed: they change the calibrated statistics only by
    rounding."""
    import torchvision

    from tightfit.frontend import onnx_import, torch_import

    h = hashlib.sha256()
    for part in (torch.__version__, torchvision.__version__, onnx.__version__, np.__version__, str(SEED),
                 str(torch_import.OPSET)):
        h.update(part.encode() + b"\0")
    for mod_file in (__file__, torch_import.__file__, onnx_import.__file__):
        h.update(Path(mod_file).read_bytes())
    return h.hexdigest()[:16]


def _cache_path(name: str, shape: tuple[int, ...] | None) -> Path | None:
    base = cache_dir()
    if base is None:
        return None
    dims = "x".join(map(str, shape)) if shape is not None else "declared"
    return base / "zoo" / f"{name}-{dims}-{_code_version()}.onnx"


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
