"""The built-in model zoo: torchvision architectures, models written from published layer tables,
and the ONNX model-zoo graphs shipped in the onnx wheel, all with random weights from a fixed
seed (weights.py).

The table models (tables.py) and the ONNX zoo's are ONNX graphs from the start: they need no
PyTorch. The torchvision models are exported from torch, the optional extra (torch_import.py).
Made ONNX bytes are cached on disk (`cache_dir`) and imported graphs in memory (`load`)."""
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

from tightfit.cache import cache_dir, write_cache
from tightfit.frontend.tables import TABLES
from tightfit.frontend.weights import SEED, randomize_onnx
from tightfit.graph.ir import Graph


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


def torch_module(name: str):
    """A torchvision model of the zoo as a PyTorch module with its seeded random weights (the
    reference for tests; needs the torch extra)."""
    from tightfit.frontend import torch_import

    kw, shape, _ = TORCHVISION[name]
    return torch_import.randomize_module(torch_import.torchvision_factory(name, **kw)(), SEED, calibrate_shape=shape)


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
    from importlib.metadata import version

    from tightfit.frontend import tables, weights

    # onnxruntime's version read from its metadata: importing it here would add ~20 MB to a
    # process that may never run it.
    parts = [onnx.__version__, np.__version__, version("onnxruntime"), str(SEED)]
    files = [__file__, tables.__file__, weights.__file__]
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
    """A zoo name, whose model can be made here: a torchvision model needs the torch extra."""
    if name not in names():
        from tightfit.errors import ModelLoadError

        raise ModelLoadError(f"no zoo model {name!r}; `tightfit zoo` lists them")
    if name in TORCHVISION:
        from tightfit.frontend.torch_import import require_torch

        require_torch(f"zoo model {name!r} (from torchvision)", torchvision=True)


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
