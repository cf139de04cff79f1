"""The graph IR: layers in the papers' sense joined by tensors with logical NCHW shapes.

Dim 0 of every tensor shape is the batch N. It is stored as imported (normally 1) but is free:
ops infer shapes for any N and accounting takes the batch as an argument.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import numpy as np

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"fp32": 4, "fp16": 2, "int8": 1})


def itemsize(dtype: str) -> int:
    from tightfit.errors import OptionError

    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise OptionError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class Quant:
    """How a quantized tensor's integers map to reals: real = (q - zero_point) * scale. One scale
    and zero point per tensor (activations), or one per index of `axis` (a weight's output
    channels, per-channel quantization)."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", tuple(float(s) for s in self.scale))
        object.__setattr__(self, "zero_point", tuple(int(z) for z in self.zero_point))

    @property
    def per_tensor(self) -> bool:
        return len(self.scale) == 1


@dataclass(frozen=True)
class Tensor:
    """An activation tensor. `dtype` "fp32" follows the plan's accounting dtype (a float model
    may be accounted in any); a quantized tensor ("int8", with its `quant`) always counts its own
    bytes per element."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "fp32"
    quant: Quant | None = None

    @property
    def per_sample(self) -> int:
        return prod(self.shape[1:])

    def item_bytes(self, dtype: str = "fp32") -> int:
        """Bytes per element in a plan of float dtype `dtype`."""
        return itemsize(dtype if self.dtype == "fp32" else self.dtype)

    def nbytes(self, dtype: str = "fp32", batch: int | None = None) -> int:
        n = self.shape[0] if batch is None else batch
        return n * self.per_sample * self.item_bytes(dtype)


def spatial(shape: tuple[int, ...]) -> tuple[int, int]:
    """(H, W) of a logical shape; tensors without spatial dims count as 1 x 1."""
    if len(shape) == 4:
        return shape[2], shape[3]
    return 1, 1


def last_reads(graph: "Graph", order: Sequence[int] | None = None) -> dict[str, int]:
    """tensor -> position in `order` (layer ids; default: the imported order) of its last
    reader; tensors no layer reads are absent."""
    last: dict[str, int] = {}
    for pos, lid in enumerate(range(len(graph.layers)) if order is None else order):
        for t in graph.layers[lid].inputs:
            last[t] = pos
    return last


@dataclass(frozen=True)
class Layer:
    """One layer: an op with its fused batch norm and elementwise activations.

    `inputs` are activation tensors (dynamic data); `params` name arrays in Graph.params in the
    order the op expects; `nodes` are the original model nodes folded into this layer.
    """

    id: int
    name: str
    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    params: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)


@dataclass(frozen=True, eq=False)
class Graph:
    name: str
    layers: tuple[Layer, ...]
    tensors: Mapping[str, Tensor]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, np.ndarray]
    # The imported model's own activation tensors and parameter count, for naive accounting
    # (every original tensor in its own buffer, as DL frameworks do).
    original_tensors: tuple[Tensor, ...] = ()
    original_param_count: int = 0
    # The imported model's integer parameters (an int8 file's weights, int32 biases, zero points,
    # and its per-channel scales as the file stores them), in their stored bytes: they do not take
    # the plan's dtype as the float ones counted above do.
    original_int_param_bytes: int = 0
    # How the model file's own inputs differ from the graph's NCHW inputs: (graph input, form,
    # the file's shape), form "nhwc" for an input the file takes channels-last (its Transpose
    # absorbed) or "reshape" for one it reshapes to NCHW (CHW, flat; the reshapes absorbed).
    input_forms: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    # The same of outputs: (graph output, "nhwc", the file's shape) for a 4-D output the file gives
    # channels-last (a .tflite's): the graph computes it NCHW, the boundaries give it as the file does.
    output_forms: tuple[tuple[str, str, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "tensors", MappingProxyType(dict(self.tensors)))
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        by_name = {layer.name: layer for layer in self.layers}
        object.__setattr__(self, "_by_name", by_name)
        producer = {layer.output: layer for layer in self.layers}
        consumers: dict[str, list[Layer]] = {t: [] for t in self.tensors}
        for layer in self.layers:
            for t in dict.fromkeys(layer.inputs):
                consumers.setdefault(t, []).append(layer)
        object.__setattr__(self, "_producer", producer)
        object.__setattr__(self, "_consumers", {k: tuple(v) for k, v in consumers.items()})

    def __reduce__(self):
        """Pickled by its fields (a worker process gets the graph itself, not a model name)."""
        return Graph, (self.name, self.layers, dict(self.tensors), self.inputs, self.outputs, dict(self.params),
                       self.original_tensors, self.original_param_count, self.input_forms, self.output_forms,
                       self.original_int_param_bytes)

    def layer(self, key: int | str) -> Layer:
        if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
            idx = int(key)
            if 0 <= idx < len(self.layers):
                return self.layers[idx]
        elif key in self._by_name:  # type: ignore[attr-defined]
            return self._by_name[key]  # type: ignore[attr-defined]
        from tightfit.errors import OptionError

        raise OptionError(f"no layer {key!r} in {self.name} (ids 0-{len(self.layers) - 1} or names)")

    def producer(self, tensor: str) -> Layer | None:
        return self._producer.get(tensor)  # type: ignore[attr-defined]

    def consumers(self, tensor: str) -> tuple[Layer, ...]:
        return self._consumers.get(tensor, ())  # type: ignore[attr-defined]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.tensors[tensor].shape

    @property
    def param_count(self) -> int:
        return sum(int(a.size) for a in self.params.values())
