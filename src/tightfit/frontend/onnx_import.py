"""ONNX -> Graph. PyTorch modules come through here too (exported to ONNX first), so there is
one path into the IR.

Steps: load and check the file; fix the input shape; fold everything computed from constants
alone; map each remaining node to an op; fuse the patterns the papers count as one layer
(conv + batch norm + activations, pad into conv, flatten into dense, SiLU / hard-swish
patterns); freeze into a validated Graph.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from tightfit.errors import InputShapeError, ModelLoadError, UnsupportedOpsError
from tightfit.frontend.validate import check_layer, check_layer_shape, check_wiring, validate
from tightfit.graph.ir import Graph, Layer, Quant, Tensor
from tightfit.ops import get_op, onnx_op_for, onnx_types
from tightfit.ops.activation import ONNX_ACTIVATIONS, onnx_activation
from tightfit.ops.base import InvalidNode, OnnxNode, Region
from tightfit.ops.conv import fold_batchnorm
from tightfit.ops.conv_transpose import fold_batchnorm_transposed
from tightfit.frontend import batch_axis, channels_last, folding, qdq, qoperator

# Node types the importer handles itself rather than mapping to an op. Cast (to a float type)
# and Expand (to the shape the data has) of activations are no-ops; any node computed from
# constants alone (Shape, Gather, Range, ...) is folded (frontend/folding.py).
STRUCTURAL_TYPES = ("Constant", "Identity", "Dropout", "Shape", "Cast", "Expand")
# Ops that can absorb the elementwise activations that follow them.
ACTIVATION_HOSTS = ("conv", "maxpool", "avgpool", "gemm", "add", "batchnorm", "global_pool", "concat", "mul",
                    "conv_transpose", "eltwise", "channel_norm", "instancenorm", "channel_reduce",
                    "matmul", "layer_norm", "reduce")  # issue 38


def supported_onnx_types() -> list[str]:
    """The ONNX node types the importer takes: the ops' own, the activations and the structural ones."""
    return sorted(set(onnx_types()) | set(STRUCTURAL_TYPES) | set(ONNX_ACTIVATIONS))


def load_onnx(path: str | os.PathLike, input_shape: Sequence[int] | None = None, name: str | None = None,
              nchw_shape: bool = False) -> Graph:
    """Import an ONNX file. External data may only live beside the model (same folder or below).
    `input_shape` is in the input's own layout, or NCHW with `nchw_shape` (a plan's record)."""
    model = _read_model(Path(path))
    return import_model(model, input_shape, name or Path(path).stem, nchw_shape=nchw_shape)


def _read_model(path: Path) -> onnx.ModelProto:
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelLoadError(f"model path is a folder, not an ONNX file: {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError and others for non-ONNX bytes
        raise ModelLoadError(f"{path} is not a readable ONNX model ({type(e).__name__})") from None
    if not model.graph.node:
        raise ModelLoadError(f"{path} is not an ONNX model (no graph nodes; truncated or another format?)")
    _load_external_data(model, path.parent.resolve())
    return model


def _load_external_data(model: onnx.ModelProto, base: Path) -> None:
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        location = ExternalDataInfo(tensor).location
        target = (base / location).resolve()
        if base != target and base not in target.parents:
            raise ModelLoadError(f"external data {location!r} of tensor {tensor.name!r} lies outside the model's folder {base}")
        if not target.is_file():
            raise ModelLoadError(f"external data file {location!r} of tensor {tensor.name!r} not found beside the model")
    try:
        onnx.load_external_data_for_model(model, str(base))
    except Exception as e:
        raise ModelLoadError(f"external data could not be read: {e}") from None


MIN_OPSET, MAX_OPSET = 1, 21  # older forms are read (opset 4's Reshape attribute: tests/test_zoo.py; opset 6: tests/test_pytorch_converted.py)


def import_model(model: onnx.ModelProto, input_shape: Sequence[int] | None, name: str,
                 fuse_batchnorm: bool = True, nchw_shape: bool = False) -> Graph:
    """`fuse_batchnorm=False` keeps every batch norm a layer of its own (with its ONNX node's
    name as the layer's first node), for tools that need to see batch-norm inputs.
    `nchw_shape`: `input_shape` is the graph's NCHW shape even where the file's input is NHWC."""
    try:
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    except Exception:
        opset = 13
    if not MIN_OPSET <= opset <= MAX_OPSET:  # the range the importer's ops are written and tested for
        raise ModelLoadError(f"{name}: ONNX opset {opset} is not supported: tightfit imports opsets {MIN_OPSET}-{MAX_OPSET} "
                             f"(convert it with onnx.version_converter.convert_version(model, 17), or export again at opset 17)")
    check_wiring(model)
    if qoperator.is_qoperator(model):
        model = qoperator.to_qdq(model)
    b = _Builder(model, opset, name)
    b.set_inputs(input_shape, nchw_shape)
    b.nodes = channels_last.rewrite(b.nodes, b.consts, {o.name for o in model.graph.output}, opset)
    b.nodes = batch_axis.rewrite(b.nodes, b.consts, {o.name for o in model.graph.output})
    b.check_supported()
    b.walk()
    return b.finish(fuse_batchnorm)


@dataclass
class _Proto:
    """A layer being built: mutable until the fusion passes are done."""

    op: str
    name: str
    inputs: list[str]
    output: str
    attrs: dict[str, Any]
    params: list[np.ndarray] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    onnx_type: str = ""


# (a group of elementwise layers in order, the tensor x they read) -> the activation kind, or None
Recogniser = Callable[[list[_Proto], str], "tuple | None"]


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            try:
                v = v.decode()
            except UnicodeDecodeError:
                raise ModelLoadError(f"node {node.name or node.output[0]!r} ({node.op_type}): attribute {a.name!r} is not UTF-8 text") from None
        elif isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


class _Builder:
    def __init__(self, model: onnx.ModelProto, opset: int, name: str):
        self.model, self.opset, self.name = model, opset, name
        g = model.graph
        self.consts: dict[str, np.ndarray] = {i.name: _initializer(i) for i in g.initializer}
        self.operands = _resize_operands(g, set(self.consts))
        self.original_params = sum(_weight_size(a) for k, a in self.consts.items() if k not in self.operands)
        # A quantized file's integer weights, biases and zero points (what its DequantizeLinear nodes
        # read), in their stored bytes.
        dequantized = {t for n in g.node if n.op_type == "DequantizeLinear"
                       for t in list(n.input)[:1] + list(n.input)[2:3]}
        self.original_int_params = sum(int(a.nbytes) for k, a in self.consts.items()
                                       if k in dequantized and a.dtype.kind in "iu")
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.alias: dict[str, str] = {}
        self.protos: list[_Proto] = []
        self.original: list[str] = []
        self.nodes: list[onnx.NodeProto] = list(g.node)
        self.qconsts: dict[str, qdq.QConst] = {}  # DequantizeLinear outputs of constants (int8 weights, int32 biases)
        self.windows: dict[str, int] = {}  # tensors held with windows folded into the batch (batch_axis)

    # --- inputs -------------------------------------------------------------------------
    def set_inputs(self, input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None", nchw_shape: bool = False) -> None:
        """Each input's shape, from the file or `input_shape` (in the input's own layout: NHWC for
        a model that starts with a Transpose from NHWC, whose graph input is then the NCHW
        tensor that Transpose makes, so the first layers can still be split by rows). A model with
        several inputs takes `input_shape` as {input name: shape}; an input it leaves out keeps
        the file's shape."""
        inputs = [i for i in self.model.graph.input if i.name not in self.consts]
        if not inputs:
            raise ModelLoadError(f"{self.name} has no input: nothing to run")
        given = _shapes_by_input(input_shape, [i.name for i in inputs])
        self.inputs: list[str] = []
        self.input_forms: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
        self.absorbed: set[str] = set()  # outputs of the nodes that only change the input's form
        for k, inp in enumerate(inputs):
            declared = self._set_input(inp, given.get(inp.name), nchw_shape, several=len(inputs) > 1)
            if k == 0:
                self.declared_batch = declared
        self.input = self.inputs[0]  # the batch every input shares (dim 0)
        for name in self.inputs[1:]:
            if self.shapes[name][0] != self.shapes[self.input][0]:
                raise InputShapeError(f"input {name!r} has batch {self.shapes[name][0]} and input {self.input!r} "
                                      f"{self.shapes[self.input][0]}; every input takes the same batch")

    def _set_input(self, inp: onnx.ValueInfoProto, input_shape: Sequence[int] | None, nchw_shape: bool,
                   several: bool) -> int | None:
        """One input's NCHW shape into self.shapes; answers its declared batch (None: dynamic or reshaped)."""
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in inp.type.tensor_type.shape.dim]
        nhwc_transpose = _nhwc_transpose(self.model.graph, inp.name) if len(dims) == 4 else None
        layout = "NHWC" if nhwc_transpose is not None else "NCHW"
        if nchw_shape and layout == "NHWC" and input_shape is not None and len(input_shape) == 4:
            n, c, h, w = input_shape
            input_shape = (n, h, w, c)
        elif nchw_shape and len(dims) != 4 and all(d is not None for d in dims):
            input_shape = None  # reshaped to NCHW in the file: its own shape (a fingerprint checks the result)
        shape = self._file_shape(inp.name, dims, layout, several) if input_shape is None else _given_shape(inp.name, dims, input_shape)
        elem = inp.type.tensor_type.elem_type
        if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.UNDEFINED):
            raise ModelLoadError(f"input {inp.name!r} holds {onnx.TensorProto.DataType.Name(elem).lower()}; tightfit takes float32 inputs")
        check_layer_shape(f"input {inp.name!r}", shape)
        self.inputs.append(inp.name)
        declared = inp.type.tensor_type.shape.dim[0].dim_value or None if dims else None
        if len(shape) != 4:
            # A chain of reshapes to NCHW (a CHW or flat input): the graph's input is its end.
            chain = _reshape_chain(self.model.graph, inp.name, shape, self.consts, self.opset)
            if chain is None:
                raise InputShapeError(f"input {inp.name!r} has rank {len(shape)}; tightfit takes NCHW images (rank 4)")
            nodes, nchw = chain
            self.input_forms, declared = self.input_forms + ((inp.name, "reshape", shape),), None
            self.alias[nodes[-1].output[0]] = inp.name
            self.absorbed |= {n.output[0] for n in nodes}
            shape = nchw
        elif nhwc_transpose is not None:
            self.input_forms += ((inp.name, "nhwc", shape),)
            shape = (shape[0], shape[3], shape[1], shape[2])
            self.alias[nhwc_transpose.output[0]] = inp.name
            self.absorbed.add(nhwc_transpose.output[0])
        self.shapes[inp.name] = shape
        self.original.append(inp.name)
        return declared

    def _file_shape(self, name: str, dims: list[int | None], layout: str, several: bool) -> tuple[int, ...]:
        """The input's shape as the file declares it (a dynamic batch taken as 1)."""
        if len(dims) > 1 and dims[0] is None and all(d is not None for d in dims[1:]):
            dims = [1] + dims[1:]
            _say_once(f"tightfit: input {name!r} of {self.name} has a dynamic batch dimension; using batch 1 "
                      "(--input-shape gives another)")
        if not dims or any(d is None for d in dims):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            example = (1, 224, 224, 3) if layout == "NHWC" else (1, 3, 224, 224)
            hint = "x".join(map(str, [e if d is None or i == 0 else d for i, (d, e) in enumerate(zip(dims, example))]
                                if len(dims) == 4 else example))
            raise InputShapeError(f"input {name!r} has a dynamic shape ({shown}, {layout}); give --input-shape "
                                  f"in that layout, e.g. {f'{name}={hint}' if several else hint}")
        return tuple(int(d) for d in dims)  # type: ignore[arg-type]

    # --- support check before anything runs ---------------------------------------------
    def check_supported(self) -> None:
        const = set(self.consts)
        unsupported: dict[str, str] = {}
        for node in self.nodes:
            is_const = node.op_type == "Constant" or all(not i or i in const for i in node.input)
            if is_const or node.op_type == "Shape":
                const.update(node.output)
                continue
            if node.op_type in STRUCTURAL_TYPES or node.op_type in ONNX_ACTIVATIONS:
                continue
            if onnx_op_for(node.op_type) is None and node.domain in ("", "ai.onnx"):
                unsupported.setdefault(node.op_type, node.name or node.output[0])
            elif node.domain not in ("", "ai.onnx"):
                unsupported.setdefault(f"{node.domain}.{node.op_type}", node.name or node.output[0])
        if unsupported:
            raise UnsupportedOpsError(unsupported, supported_onnx_types())

    # --- the walk -----------------------------------------------------------------------
    def resolve(self, t: str) -> str:
        while t in self.alias:
            t = self.alias[t]
        return t

    def walk(self) -> None:
        for node in self.nodes:
            if node.output and node.output[0] in self.absorbed:
                continue  # the input arrives in NCHW (see set_inputs)
            inputs = [self.resolve(i) if i else "" for i in node.input]
            if node.op_type == "Constant":
                value = _constant_value(node)
                self.consts[node.output[0]] = value
                if node.output[0] not in self.operands:  # weights held in Constant nodes are parameters too
                    self.original_params += _weight_size(value)
            elif node.op_type == "Shape" and inputs[0] in self.shapes:
                held = batch_axis.file_shape(self.shapes[inputs[0]], self.windows.get(inputs[0], 1))
                self.consts[node.output[0]] = _shape_value(node, held)
            elif all(not i or i in self.consts for i in inputs):
                if node.op_type == "DequantizeLinear":  # folded here: onnx's evaluator lacks opset 13's
                    found = qdq.QConst.of(node.name or node.output[0], [self.consts[i] if i else None for i in inputs],
                                          _attrs(node))
                    self.qconsts[node.output[0]] = found
                    self.consts[node.output[0]] = found.real()
                else:
                    self._fold(node, inputs)
            else:
                self._data_node(*self._unfolded(node, inputs))

    def _unfolded(self, node: onnx.NodeProto, inputs: list[str]) -> tuple[onnx.NodeProto, list[str]]:
        """The node as it runs on tensors with windows folded into the batch (batch_axis.fold_node),
        its output's windows noted; the node as it is where it touches none."""
        found = batch_axis.fold_node(node, inputs, self.shapes, self.consts, self.windows, self.shapes[self.input][0])
        if found is None:
            return node, inputs
        node, k = found
        if k == 0:
            raise UnsupportedOpsError({node.op_type: f"{node.name or node.output[0]}: a {node.op_type} of a tensor whose "
                                                     "batch holds windows (Swin-style window partition), in a form not "
                                                     "rewritten for it"}, supported_onnx_types())
        if k > 1:
            self.windows[node.output[0]] = k
        return node, [self.resolve(i) if i else "" for i in node.input]

    def _data_node(self, node: onnx.NodeProto, inputs: list[str]) -> None:
        """A node reading activations: an alias, a no-op, or layers."""
        if node.op_type in ("Identity", "Dropout"):
            self.alias[node.output[0]] = inputs[0]
        elif node.op_type in ("Cast", "Expand"):
            same = self._no_op(node, inputs)
            if same is None:
                self._add_layer(self._times_ones(node, inputs), [inputs[0], f"{node.output[0]}::ones"])
            else:
                self.alias[node.output[0]] = same
        elif node.op_type == "Concat" and any(i in self.consts for i in inputs):
            for part in self._concat_constants(node, inputs):  # issue 38: a class token
                self._add_layer(part, [self.resolve(i) if i else "" for i in part.input])
        else:
            self._add_layer(node, inputs)

    def _times_ones(self, node: onnx.NodeProto, inputs: list[str]) -> onnx.NodeProto:
        """An Expand that broadcasts dims of 1 as a Mul by ones of the target's shape (exact)."""
        target = tuple(int(d) for d in self.consts[inputs[1]].reshape(-1))
        grown = np.broadcast_shapes(self.shapes[inputs[0]], target)
        self.consts[f"{node.output[0]}::ones"] = np.ones((1,) + tuple(grown[1:]), np.float32)
        return onnx.helper.make_node("Mul", [node.input[0], f"{node.output[0]}::ones"], list(node.output),
                                     name=node.name or node.output[0])

    def _concat_constants(self, node: onnx.NodeProto, inputs: list[str]) -> list[onnx.NodeProto]:
        """A Concat of one activation and constants along a token or map axis (a ViT's class token
        before its patch tokens) as nodes the ops take: the activation padded with zeros where the
        constants go (a Pad over H or W; tokens (N, T, C) through an Unsqueeze to (N, 1, T, C)),
        plus the constants at those places and zeros elsewhere: exact, as x + 0 is x."""
        label = node.name or node.output[0]
        data = [i for i in inputs if i not in self.consts]
        shape = self.shapes.get(data[0]) if len(data) == 1 else None
        rank = len(shape) if shape else 0
        axis = int(_attrs(node).get("axis", 0)) % max(rank, 1)
        if shape is None or (rank, axis) not in ((3, 1), (3, 2), (4, 2), (4, 3)):
            raise UnsupportedOpsError({"Concat": f"{label}: a concatenation of constants and activations other than one "
                                                 "activation of tokens (N, T, C) or maps along T, C, H or W"},
                                      supported_onnx_types())
        parts, at = [], inputs.index(data[0])
        for i in inputs:
            c = np.zeros((1,) + shape[1:], np.float32) if i == data[0] else np.asarray(self.consts[i], np.float32)
            if c.ndim != rank or c.shape[0] != 1 or c.shape[1:axis] + c.shape[axis + 1:] != shape[1:axis] + shape[axis + 1:]:
                raise ModelLoadError(f"node {label!r} (Concat): a constant of shape {c.shape} does not fit {shape} along axis {axis}")
            parts.append(c)
        before, after = (sum(p.shape[axis] for p in parts[:at]), sum(p.shape[axis] for p in parts[at + 1:]))
        key = f"{node.output[0]}::"
        self.consts[key + "added"] = np.concatenate(parts, axis=axis)
        four = axis + (rank == 3)  # the padded axis of the 4-D tensor: H (2) or W (3)
        pads = [0] * 8
        pads[four], pads[4 + four] = before, after
        self.consts[key + "pads"] = np.asarray(pads, np.int64)
        self.consts[key + "axes"] = np.asarray([1], np.int64)
        x, out = data[0], [key + "padded"]
        nodes = []
        if rank == 3:
            nodes.append(self._axes_node("Unsqueeze", x, key + "axes", key + "map", label))
            x = key + "map"
        pad_in = [x, key + "pads"] if self.opset >= 11 else [x]
        pad_attrs = {} if self.opset >= 11 else {"pads": pads}
        nodes.append(onnx.helper.make_node("Pad", pad_in, out, name=f"{label}::pad", mode="constant", **pad_attrs))
        if rank == 3:
            nodes.append(self._axes_node("Squeeze", out[0], key + "axes", key + "tokens", label))
            out = [key + "tokens"]
        nodes.append(onnx.helper.make_node("Add", [out[0], key + "added"], list(node.output), name=label))
        return nodes

    def _axes_node(self, op: str, x: str, axes: str, out: str, label: str) -> onnx.NodeProto:
        """An Unsqueeze or Squeeze of axis 1 in the model's opset's form."""
        if self.opset >= 13:
            return onnx.helper.make_node(op, [x, axes], [out], name=f"{label}::{op.lower()}")
        return onnx.helper.make_node(op, [x], [out], name=f"{label}::{op.lower()}", axes=[1])

    def _no_op(self, node: onnx.NodeProto, inputs: list[str]) -> str | None:
        """The data a Cast or Expand of activations passes on unchanged, None for an Expand that
        broadcasts dims of 1 (a product with ones, `_times_ones`), or a clear error."""
        label = node.name or node.output[0]
        x = inputs[0]
        if node.op_type == "Cast":
            to = int(_attrs(node).get("to", 0))
            if to not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16):
                raise UnsupportedOpsError({"Cast": f"{label}: a cast of activations to {onnx.TensorProto.DataType.Name(to)}"
                                           " (only float casts, which change nothing here)"}, supported_onnx_types())
            return x
        target = self.consts.get(inputs[1]) if len(inputs) > 1 else None
        shape = self.shapes.get(x)
        if target is None or shape is None:
            raise UnsupportedOpsError({"Expand": f"{label}: an Expand of activations to a shape that is not a constant"},
                                      supported_onnx_types())
        try:
            grown = np.broadcast_shapes(shape, tuple(int(d) for d in target.reshape(-1)))
        except ValueError:
            grown = None
        if grown is not None and grown != shape and len(grown) == len(shape) and grown[0] == shape[0]:
            return None  # dims of 1 broadcast (F.normalize's expand_as): a product with ones
        if grown != shape:
            raise UnsupportedOpsError({"Expand": f"{label}: an Expand of activations {shape} to {tuple(target.reshape(-1))}"
                                       " (only to the shape they have, or dims of 1 broadcast)"}, supported_onnx_types())
        return x

    def _fold(self, node: onnx.NodeProto, inputs: list[str]) -> None:
        from onnx.reference import ReferenceEvaluator

        values = [self.consts[i] if i else None for i in inputs]
        try:
            folded = folding.fold(node.op_type, _attrs(node), values, self.opset)
        except Exception as e:
            raise ModelLoadError(f"could not fold constant node {node.name or node.output[0]!r} ({node.op_type}): {e}") from None
        if folded is not None:
            self.consts[node.output[0]] = folded
            return

        clone = onnx.helper.make_node(node.op_type, [i for i in node.input], list(node.output), domain=node.domain)
        clone.attribute.extend(node.attribute)
        feeds = {orig: self.consts[res] for orig, res in zip(node.input, inputs) if orig}
        # Wrap the node in a graph: a bare NodeProto is evaluated at the newest opset, which
        # misreads old attribute forms (Unsqueeze `axes` before opset 13, ...).
        graph = onnx.helper.make_graph(
            [clone], "fold", [onnx.helper.make_empty_tensor_value_info(i) for i in dict.fromkeys(feeds)],
            [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o])
        try:
            results = ReferenceEvaluator(graph, opsets={"": self.opset}).run(None, feeds)
        except Exception as e:
            raise ModelLoadError(f"could not fold constant node {node.name or node.output[0]!r} ({node.op_type}): {e}") from None
        for out, value in zip(node.output, results):
            self.consts[out] = np.asarray(value)

    def _add_layer(self, node: onnx.NodeProto, inputs: list[str]) -> None:
        label = node.name or node.output[0]
        if node.op_type in ONNX_ACTIVATIONS and not _tensor_bounds(node, inputs, self.consts):
            op_name = "activation"
            try:
                spec_attrs = {"act": (_activation_spec(node, self.consts, inputs),)}
            except (ValueError, KeyError) as e:
                raise UnsupportedOpsError({node.op_type: f"{label}: {e}"}, supported_onnx_types()) from None
            spec_inputs, params = [inputs[0]], []
        else:
            # Clip with bounds that are data or per-element constants is an elementwise max, min.
            op_name = "eltwise" if node.op_type == "Clip" else onnx_op_for(node.op_type)
            op = get_op(op_name)
            attrs, inputs = self._legacy_forms(node, label, _attrs(node), inputs)
            view = OnnxNode(node.op_type, label, attrs, tuple(inputs), tuple(node.output),
                            self.consts.get, self.shapes.__getitem__, self.opset)
            try:
                specs = op.from_onnx_outputs(view)
            except InvalidNode as e:
                raise ModelLoadError(f"node {label!r} ({node.op_type}): {e}") from None
            except KeyError as e:  # an attribute the op needs
                raise ModelLoadError(f"node {label!r} ({node.op_type}) lacks the attribute or input {e}") from None
            except ValueError as e:
                raise UnsupportedOpsError({node.op_type: f"{label}: {e}"}, supported_onnx_types()) from None
            except (IndexError, TypeError, ZeroDivisionError, OverflowError, AttributeError) as e:  # malformed attributes
                raise ModelLoadError(f"node {label!r} ({node.op_type}) cannot be read: {type(e).__name__}: {e}") from None
            if len(specs) > 1:  # one layer per output (Split), none for an output nothing reads
                g = self.model.graph
                used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
                for out, spec in zip(node.output, specs):
                    if out in used:
                        self._add_proto(_Proto(spec.op or op_name, label, spec.inputs, out, spec.attrs, spec.params,
                                               [label], node.op_type))
                return
            spec_attrs, spec_inputs, params = specs[0].attrs, specs[0].inputs, specs[0].params
            op_name = specs[0].op or op_name
        self._add_proto(_Proto(op_name, label, spec_inputs, node.output[0], spec_attrs, params, [label], node.op_type))

    def _add_proto(self, proto: _Proto) -> None:
        op_name, label, params = proto.op, proto.name, proto.params
        where = f"node {label!r} ({proto.onnx_type})"
        if "" in proto.inputs:  # ONNX's name of an absent optional input, where this op needs a tensor
            raise ModelLoadError(f"{where}: input {proto.inputs.index('') + 1} is empty (absent), and it is not optional")
        in_shapes = [self.shapes[t] for t in proto.inputs]
        layer = _freeze(proto, 0, {})
        check_layer(layer, in_shapes, [np.asarray(p) for p in params], where)
        self.shapes[proto.output] = tuple(get_op(op_name).output_shape(layer, in_shapes))
        check_layer_shape(f"{where} output", self.shapes[proto.output])
        self.protos.append(proto)
        self.original.append(proto.output)

    def _legacy_forms(self, node: onnx.NodeProto, label: str, attrs: dict[str, Any],
                      inputs: list[str]) -> tuple[dict[str, Any], list[str]]:
        """Rewrite attribute forms of older opsets into the current ones the ops read, so that
        no op needs to know the model's opset."""
        t = node.op_type
        if t in ("Softmax", "LogSoftmax") and self.opset < 13 and "axis" not in attrs:
            # Before opset 13 the default axis is 1 (the input is coerced to 2-D at the axis); the
            # softmax op takes axis 1 of (N, C) or (N, C, 1, 1) data, where both forms agree.
            attrs["axis"] = 1
        elif t == "Reshape":
            if "shape" in attrs and len(inputs) < 2:  # opset < 5
                key = f"{node.output[0]}::shape"
                self.consts[key] = np.asarray(attrs.pop("shape"), dtype=np.int64)
                inputs = [inputs[0], key]
            inputs = self._free_batch(inputs)
        elif t == "Pad" and "paddings" in attrs:  # opset 1
            attrs["pads"] = attrs.pop("paddings")
        elif t == "Upsample" and "scales" not in attrs and "height_scale" in attrs:  # opset 1
            attrs["scales"] = [1.0, 1.0, float(attrs.pop("height_scale")), float(attrs.pop("width_scale", 1.0))]
        elif t == "BatchNormalization" and int(attrs.get("spatial", 1)) == 0:  # opset < 9
            stats = [self.consts.get(i) for i in inputs[1:5]]
            if any(s is not None and s.ndim > 1 for s in stats):
                raise UnsupportedOpsError({t: f"{label}: batch norm with spatial=0 (per-activation statistics)"},
                                          supported_onnx_types())
        return attrs, inputs

    def _free_batch(self, inputs: list[str]) -> list[str]:
        """Old exporters write the batch into Reshape targets ((1, 2048) before a classifier,
        (1, g, C/g, H, W) in a channel shuffle). When the model runs at another batch, a target
        that starts with the declared batch and keeps each sample's size means "this sample"."""
        target = self.consts.get(inputs[1]) if len(inputs) > 1 else None
        x = self.shapes.get(inputs[0])
        if target is None or x is None or target.ndim != 1 or not target.size or self.declared_batch is None:
            return inputs
        dims = [int(d) for d in target]
        if dims[0] != self.declared_batch or x[0] == self.declared_batch or -1 in dims[1:] or 0 in dims[1:]:
            return inputs
        if int(np.prod(dims[1:])) != int(np.prod(x[1:])):
            return inputs
        key = f"{inputs[1]}::batch{x[0]}"
        self.consts[key] = np.asarray([x[0]] + dims[1:], dtype=np.int64)
        return [inputs[0], key]

    # --- fusion and freezing --------------------------------------------------------------
    def finish(self, fuse_batchnorm: bool = True) -> Graph:
        outputs = self._output_names()
        for t in outputs:
            if t not in self.shapes:
                raise ModelLoadError(f"model output {t!r} is computed from constants alone; nothing to run")
        protos = fuse(self.protos, set(outputs), self.shapes, fuse_batchnorm, self._recognise)
        quants: dict[str, Quant] = {}
        if any(p.op in ("quantize", "dequantize") for p in protos):
            protos, quants = qdq.fold(protos, self.qconsts, self._node_inputs, set(outputs), self._node_attrs)
        layers, params = [], {}
        for i, p in enumerate(protos):
            layers.append(_freeze(p, i, params))
        _dedupe_names(layers)
        used = set(self.inputs) | {t for l in layers for t in l.inputs} | {l.output for l in layers}
        tensors = {t: Tensor(t, self.shapes[t], "int8", quants[t]) if t in quants else Tensor(t, self.shapes[t])
                   for t in used}
        graph = Graph(
            name=self.name, layers=tuple(layers), tensors=tensors, inputs=tuple(self.inputs),
            outputs=tuple(outputs), params=params,
            original_tensors=tuple(Tensor(t, self.shapes[t], "int8", quants[t]) if t in quants else Tensor(t, self.shapes[t])
                                   for t in self.original),
            original_param_count=self.original_params, original_int_param_bytes=self.original_int_params,
            input_forms=self.input_forms,
        )
        return validate(graph)

    def _node_by_label(self) -> dict[str, onnx.NodeProto]:
        if not hasattr(self, "_labels"):
            self._labels = {node.name or node.output[0]: node for node in self.nodes}
        return self._labels

    def _node_inputs(self, label: str) -> list[str]:
        node = self._node_by_label().get(label)
        return [] if node is None else list(node.input)

    def _node_attrs(self, label: str) -> dict[str, Any]:
        node = self._node_by_label().get(label)
        return {} if node is None else {**_attrs(node), "__type": node.op_type}

    def _recognise(self, group: list[_Proto], x: str) -> tuple | None:
        """The activation a group of elementwise layers computes from x (frontend.functions), run
        on the group's own nodes; None where a label names more than one node."""
        from tightfit.frontend.functions import recognise

        by_label: dict[str, list[onnx.NodeProto]] = {}
        for node in self.nodes:
            by_label.setdefault(node.name or node.output[0], []).append(node)
        found = [by_label.get(label, []) for p in group for label in p.nodes]
        if any(len(nodes) != 1 for nodes in found):
            return None
        return recognise([nodes[0] for nodes in found], x, self.resolve, self.consts, self.opset)

    def _output_names(self) -> list[str]:
        """The model's outputs by their own names: a layer whose result reaches an output
        through Identity nodes is renamed to the output (every result, JSON and API then speak
        of the model's names)."""
        declared = [o.name for o in self.model.graph.output]
        outputs = []
        for name in declared:
            t = self.resolve(name)
            if t in self.inputs:
                raise ModelLoadError(f"model output {name!r} is the input itself; nothing to run")
            if t != name and t in self.shapes and t not in declared and t not in outputs:
                self._rename(t, name)
                t = name
            outputs.append(t)
        return outputs

    def _rename(self, old: str, new: str) -> None:
        for p in self.protos:
            p.inputs = [new if t == old else t for t in p.inputs]
            if p.output == old:
                p.output = new
        self.shapes[new] = self.shapes.pop(old)
        self.original = [new if t == old else t for t in self.original]


def _freeze(p: _Proto, idx: int, params: dict[str, np.ndarray]) -> Layer:
    names = []
    for j, arr in enumerate(p.params):
        key = f"{idx}.{j}"
        # Integer arrays are an int8 layer's weight and bias (frontend/qdq.py): kept as they are.
        params[key] = np.ascontiguousarray(arr, dtype=None if np.asarray(arr).dtype.kind == "i" else np.float32)
        names.append(key)
    return Layer(id=idx, name=p.name, op=p.op, inputs=tuple(p.inputs), output=p.output,
                 attrs=dict(p.attrs), params=tuple(names), nodes=tuple(p.nodes))


def _dedupe_names(layers: list[Layer]) -> None:
    seen: dict[str, int] = {}
    for i, layer in enumerate(layers):
        if layer.name in seen or layer.name.isdigit():
            new = f"{layer.name}_{i}"
            layers[i] = Layer(layer.id, new, layer.op, layer.inputs, layer.output, layer.attrs, layer.params, layer.nodes)
        seen[layers[i].name] = i


def _resize_operands(graph: onnx.GraphProto, consts: set[str]) -> set[str]:
    """The constants a Resize's roi and scales are computed from: operands, not weights."""
    const = set(consts)
    producer = {}
    for n in graph.node:
        if n.op_type == "Constant" or all(not i or i in const for i in n.input):
            const.update(n.output)
            for o in n.output:
                producer[o] = n
    todo = [t for n in graph.node if n.op_type in ("Resize", "Upsample") for t in n.input[1:] if t in const]
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t not in seen:
            seen.add(t)
            todo += [i for i in producer[t].input if i] if t in producer else []
    return seen


def _weight_size(a: np.ndarray) -> int:
    """How many parameters a constant holds: the values of a float tensor; a float scalar (a
    Clip bound, the 6 of `x / 6`) is an operand of an op, not a weight."""
    return int(a.size) if a.dtype.kind == "f" and a.ndim > 0 else 0


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    """A note on stderr, once per process (a model is loaded many times by one command)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr)


def _shapes_by_input(input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None",
                     names: list[str]) -> dict[str, Sequence[int]]:
    """{input name: shape} from one shape (a model with one input) or shapes by name."""
    if input_shape is None:
        return {}
    if isinstance(input_shape, Mapping):
        unknown = [k for k in input_shape if k not in names]
        if unknown:
            raise InputShapeError(f"--input-shape names {unknown[0]!r}, which is not an input of the model "
                                  f"(its inputs: {', '.join(names)})")
        return dict(input_shape)
    if len(names) != 1:
        raise InputShapeError(f"the model has {len(names)} inputs ({', '.join(names)}); give each input's shape by "
                              f"name, e.g. --input-shape {names[0]}=SHAPE,{names[1]}=SHAPE")
    return {names[0]: input_shape}


def _given_shape(name: str, dims: list[int | None], input_shape: Sequence[int]) -> tuple[int, ...]:
    """A shape given for input `name`, checked against the dims the file fixes (the batch is free)."""
    shape = tuple(int(d) for d in input_shape)
    if len(shape) != len(dims) or any(s <= 0 for s in shape):
        raise InputShapeError(f"--input-shape {'x'.join(map(str, shape))} does not fit input {name!r} of rank {len(dims)}")
    for i, (given, known) in enumerate(zip(shape, dims)):
        if i > 0 and known is not None and given != known:
            raise InputShapeError(f"--input-shape {'x'.join(map(str, shape))} conflicts with input {name!r} dim {i} = {known}")
    return shape


def _nhwc_transpose(graph: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    """The Transpose (0, 3, 1, 2) that is the only reader of input `name`, if there is one."""
    readers = [n for n in graph.node if name in n.input]
    if len(readers) != 1 or readers[0].op_type != "Transpose" or name in {o.name for o in graph.output}:
        return None
    perm = next((list(a.ints) for a in readers[0].attribute if a.name == "perm"), None)
    return readers[0] if perm == [0, 3, 1, 2] else None


RESHAPE_TYPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def _reshape_chain(graph: onnx.GraphProto, name: str, shape: tuple[int, ...], consts: dict[str, np.ndarray],
                   opset: int) -> tuple[list[onnx.NodeProto], tuple[int, ...]] | None:
    """The nodes that take input `name` of `shape` to a rank-4 tensor by reshapes alone (each
    the only reader of what it reads), and that tensor's shape; None if there is no such chain."""
    known = dict(consts)
    known.update({n.output[0]: _constant_value(n) for n in graph.node if n.op_type == "Constant"})
    nodes: list[onnx.NodeProto] = []
    t, s = name, tuple(shape)
    for _ in range(8):
        readers = [n for n in graph.node if t in n.input]
        if len(readers) != 1 or readers[0].op_type not in RESHAPE_TYPES or readers[0].input[0] != t:
            return None
        node = readers[0]
        if any(i and i != t and i not in known for i in node.input):
            return None
        try:
            s = _output_shape(node, {t: np.zeros(s, np.float32), **{i: known[i] for i in node.input[1:] if i}}, opset)
        except Exception:  # a malformed node (inputs or attributes it does not take): the import reports it as one
            return None
        nodes.append(node)
        t = node.output[0]
        if len(s) == 4:
            return nodes, s
    return None


def _output_shape(node: onnx.NodeProto, feeds: dict[str, np.ndarray], opset: int) -> tuple[int, ...]:
    from onnx.reference import ReferenceEvaluator

    graph = onnx.helper.make_graph([node], "shape", [onnx.helper.make_empty_tensor_value_info(i) for i in feeds],
                                   [onnx.helper.make_empty_tensor_value_info(node.output[0])])
    return tuple(np.asarray(ReferenceEvaluator(graph, opsets={"": opset}).run(None, feeds)[0]).shape)


def _initializer(t: onnx.TensorProto) -> np.ndarray:
    """An initializer's array; one whose data does not fill its dims (a short or corrupt
    initializer) is a model error, not numpy's."""
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # numpy_helper raises ValueError, TypeError or others on inconsistent data
        raise ModelLoadError(f"initializer {t.name!r} of dims {list(t.dims)} cannot be read ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'inconsistent data'})") from None


def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    if len(node.attribute) != 1:
        raise ModelLoadError(f"Constant node {node.name or node.output[0]!r} needs exactly one value attribute")
    a = node.attribute[0]
    if a.name == "value":
        return _initializer(a.t)
    v = onnx.helper.get_attribute_value(a)
    return np.asarray(v, dtype=np.float32 if "float" in a.name else np.int64)


def _shape_value(node: onnx.NodeProto, shape: tuple[int, ...]) -> np.ndarray:
    attrs = _attrs(node)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.asarray(shape[start:end], dtype=np.int64)


def _tensor_bounds(node: onnx.NodeProto, inputs: list[str], consts: dict[str, np.ndarray]) -> bool:
    """Whether a Clip has a bound that is data or a constant of more than one value."""
    return node.op_type == "Clip" and any(t and (t not in consts or consts[t].size != 1) for t in inputs[1:3])


def _activation_spec(node: onnx.NodeProto, consts: dict[str, np.ndarray], inputs: list[str]) -> tuple:
    a = _attrs(node)
    if node.op_type == "Clip":
        lo = a.get("min", consts[inputs[1]] if len(inputs) > 1 and inputs[1] else -np.inf)
        hi = a.get("max", consts[inputs[2]] if len(inputs) > 2 and inputs[2] else np.inf)
        return ("clip", float(np.asarray(lo).reshape(-1)[0]), float(np.asarray(hi).reshape(-1)[0]))
    return onnx_activation(node.op_type, a)


# --- fusion passes: each takes and returns the proto list -------------------------------------

def _consumers(protos: list[_Proto]) -> dict[str, list[_Proto]]:
    out: dict[str, list[_Proto]] = {}
    for p in protos:
        for t in dict.fromkeys(p.inputs):
            out.setdefault(t, []).append(p)
    return out


def _sole_consumer(protos: list[_Proto], tensor: str, keep: set[str]) -> _Proto | None:
    if tensor in keep:
        return None
    users = _consumers(protos).get(tensor, [])
    return users[0] if len(users) == 1 else None


def fuse(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]] | None = None,
         fuse_batchnorm: bool = True, recognise: Recogniser | None = None) -> list[_Proto]:
    """Apply the fusions in order; `keep` are tensors that must stay visible (graph outputs);
    `shapes` are the imported tensors' shapes (the passes that need them skip without);
    `recognise` names the activation a group of elementwise layers computes (without it, such
    groups stay as they are)."""
    shapes = shapes or {}
    protos = _fuse_channel_shuffle(protos, keep, shapes)
    protos = _fuse_depth_space(protos, keep, shapes)
    functions = functools.partial(_fuse_functions, recognise=recognise or (lambda group, x: None))
    layernorm = functools.partial(_fuse_layernorm, shapes=shapes)
    steps = ((_fuse_silu, functions, layernorm, _fuse_batchnorm, _fuse_affine, _fuse_pad) if fuse_batchnorm
             else (_fuse_silu, functions, layernorm, _fuse_affine, _fuse_pad))
    for step in steps:
        protos = step(protos, keep)
    protos = _fuse_flatten(protos, keep, shapes)
    protos = _attention_to_rank4(_fuse_activations(protos, keep), keep, shapes)
    return _tokens_to_rank4(protos, keep, shapes)


def _attention_chain(protos: list[_Proto], p: _Proto, keep: set[str],
                     shapes: dict[str, tuple[int, ...]]) -> tuple[_Proto, _Proto] | None:
    """(softmax, second matmul) of attention `p` (q k^T) -> softmax over the last axis -> (.) v,
    all rank 5 with the same batch dims (N, windows or patch pixels, heads), or None."""
    if p.op != "matmul" or p.output in keep or any(t not in shapes for t in p.inputs):
        return None
    a, b = (shapes[t] for t in p.inputs)
    if len(a) != 5 or len(b) != 5 or a[:3] != b[:3]:
        return None
    soft = _sole_consumer(protos, p.output, keep)
    if soft is None or soft.op != "softmax_axis" or soft.attrs["axis"] != 4:
        return None
    mm = _sole_consumer(protos, soft.output, keep)
    if mm is None or mm.op != "matmul" or mm.inputs[0] != soft.output or mm.inputs[1] not in shapes:
        return None
    v = shapes[mm.inputs[1]]
    return (soft, mm) if len(v) == 5 and v[:3] == a[:3] and mm.output not in keep else None


def _attention_to_rank4(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]]) -> list[_Proto]:
    """Rank-5 attention (MobileViT's patch pixels, or windows, by heads by tokens) run on rank 4:
    dims 1 and 2 are batch dims of both matmuls and the softmax works along the last axis, so
    merging them changes no value; on rank 4 the scores split by bands of query tokens
    (ops/attention.py), where a rank-5 tensor is one whole step. q, k^T and v are reshaped to
    rank 4 (small: tokens by head dims) and the result back to rank 5; the scores never are."""
    out: list[_Proto] = []
    after: dict[int, _Proto] = {}
    merged: dict[str, str] = {}
    for p in protos:
        chain = _attention_chain(protos, p, keep, shapes)
        if chain is not None:
            soft, mm = chain
            for m in (p, mm):
                for j, t in enumerate(m.inputs):
                    if t == soft.output:
                        continue
                    if t not in merged:
                        s = shapes[t]
                        merged[t] = f"{t}:rank4"
                        shapes[merged[t]] = (s[0], s[1] * s[2], *s[3:])
                        out.append(_Proto("reshape", f"{m.name}/rank4_{j}", [t], merged[t],
                                          {"sample_shape": shapes[merged[t]][1:]}, onnx_type="Reshape"))
                    m.inputs[j] = merged[t]
            for t in (p.output, soft.output):
                s = shapes[t]
                shapes[t] = (s[0], s[1] * s[2], *s[3:])
            soft.attrs["axis"] = 3
            y = mm.output
            mm.output = f"{y}:rank4"
            shapes[mm.output] = (shapes[y][0], shapes[y][1] * shapes[y][2], *shapes[y][3:])
            after[id(mm)] = _Proto("reshape", f"{mm.name}/rank5", [mm.output], y, {"sample_shape": shapes[y][1:]},
                                   onnx_type="Reshape")
        out.append(p)
        if id(p) in after:
            out.append(after[id(p)])
    return out


# Ops on rank-3 tokens (N, T, C) whose tokens are independent of each other (elementwise, or
# along C alone): held as (N, 1, T, C), rank 4 with T as the rows, they split by bands of tokens.
_TOKENWISE_OPS = ("layer_norm", "add", "mul", "eltwise", "activation", "gemm")


def _tokenwise(p: _Proto, keep: set[str], shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether `p` works on each token of rank-3 tokens on its own: every data input is (N, T, C)
    or (N, T, 1) of the output's N and T, constants are per token or per channel."""
    y = shapes.get(p.output)
    if p.op not in _TOKENWISE_OPS or y is None or len(y) != 3 or y[1] < 2 or not p.inputs:
        return False
    if p.op == "gemm" and not p.attrs.get("last_axis"):
        return False
    if any(t not in shapes or len(shapes[t]) != 3 or shapes[t][:2] != y[:2] for t in p.inputs):
        return False
    if p.op == "gemm" or p.op == "layer_norm":
        return True
    return all(np.asarray(c).ndim == 3 for c in p.params)


def _to_rank4(s: tuple[int, ...]) -> tuple[int, ...]:
    return (s[0], 1, *s[1:])


def _tokens_to_rank4(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]]) -> list[_Proto]:
    """Rank-3 tokens (N, T, C) of tokenwise layers (layer norms, Linear over tokens, elementwise)
    held as (N, 1, T, C): on rank 4 the tokens are the rows, so those layers split by bands of
    tokens (ops' `splits_rows`), where rank 3 has no rows and each is one whole step. Tokens of
    an H x W map run h * W + w, so a band of image rows is a band of tokens. No value changes:
    the same elements in the same order. Where the tokens come from or go to a Reshape (a map's
    flatten, possibly through the Transpose (0, 2, 1) to channels last) that Reshape takes the
    rank-4 form; elsewhere a Reshape is added at the edge of the run. Not in QDQ graphs: the
    int8 folding (qdq.fold) pairs each layer with the quantize / dequantize beside it."""
    if any(p.op in ("quantize", "dequantize") for p in protos):
        return protos
    inside = {id(p) for p in protos if _tokenwise(p, keep, shapes)}
    if not inside:
        return protos
    readers = _consumers(protos)
    by_out = {p.output: p for p in protos}
    made = {p.output for p in protos if id(p) in inside}
    before: dict[int, list[_Proto]] = {}
    renamed: dict[str, str] = {}
    for t in dict.fromkeys(t for p in protos if id(p) in inside for t in p.inputs if t not in made):
        if not _rank4_source(t, by_out, readers, inside, keep, shapes):
            renamed[t] = f"{t}:rank4"
            shapes[renamed[t]] = _to_rank4(shapes[t])
            first = next(p for p in protos if id(p) in inside and t in p.inputs)
            before.setdefault(id(first), []).append(
                _Proto("reshape", f"{t}/rank4", [t], renamed[t], {"sample_shape": shapes[renamed[t]][1:]}, onnx_type="Reshape"))
    after: dict[int, _Proto] = {}
    for p in protos:
        if id(p) not in inside:
            continue
        y = p.output
        if not _rank4_sink(y, readers, inside, keep, shapes):
            p.output = renamed[y] = f"{y}:rank4"
            after[id(p)] = _Proto("reshape", f"{y}/rank3", [p.output], y, {"sample_shape": shapes[y][1:]}, onnx_type="Reshape")
        shapes[p.output] = _to_rank4(shapes[y])
        _params_to_rank4(p)
    out: list[_Proto] = []
    for p in protos:
        out.extend(before.get(id(p), ()))
        if id(p) in inside:
            p.inputs = [renamed.get(t, t) for t in p.inputs]
        out.append(p)
        if id(p) in after:
            out.append(after[id(p)])
    return out


def _params_to_rank4(p: _Proto) -> None:
    if p.op in ("add", "mul", "eltwise"):
        p.params = [np.asarray(c).reshape(_to_rank4(np.asarray(c).shape)) for c in p.params]
        if "param_shape" in p.attrs:
            p.attrs["param_shape"] = _to_rank4(tuple(p.attrs["param_shape"]))


def _only_inside(t: str, readers: dict[str, list[_Proto]], inside: set[int], keep: set[str]) -> bool:
    return t not in keep and all(id(r) in inside for r in readers.get(t, ()))


def _rank4_source(t: str, by_out: dict[str, _Proto], readers: dict[str, list[_Proto]], inside: set[int],
                  keep: set[str], shapes: dict[str, tuple[int, ...]]) -> bool:
    """Make the Reshape (or Reshape -> Transpose (0, 2, 1)) producing tokens read only by the run
    produce them as rank 4; False where they are produced otherwise (the caller adds a Reshape)."""
    p = by_out.get(t)
    if p is None or not _only_inside(t, readers, inside, keep):
        return False
    if p.op == "reshape":
        p.attrs["sample_shape"] = _to_rank4(shapes[p.output])[1:]
    elif p.op == "transpose" and tuple(p.attrs["perm"]) == (0, 2, 1):
        src = by_out.get(p.inputs[0])
        if src is None or src.op != "reshape" or p.inputs[0] in keep or [id(q) for q in readers.get(p.inputs[0], ())] != [id(p)]:
            return False
        n, c, t = shapes[p.inputs[0]]
        src.attrs["sample_shape"] = (c, 1, t)
        shapes[p.inputs[0]] = (n, c, 1, t)
        p.attrs["perm"] = (0, 2, 3, 1)
    else:
        return False
    shapes[p.output] = _to_rank4(shapes[p.output])
    return True


def _rank4_sink(t: str, readers: dict[str, list[_Proto]], inside: set[int], keep: set[str],
                shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the rank-4 tokens `t` can stay as they are for every reader outside the run: a
    Reshape (same elements, any rank), or a Transpose (0, 2, 1) read by Reshapes alone (made
    (0, 3, 1, 2): (N, C, 1, T), the same elements as (N, C, T)). Adjusts those Transposes."""
    if t in keep:
        return False
    outside = [r for r in readers.get(t, ()) if id(r) not in inside]
    ok = all(r.op == "reshape" or (r.op == "transpose" and tuple(r.attrs["perm"]) == (0, 2, 1) and r.output not in keep
                                   and all(q.op == "reshape" for q in readers.get(r.output, ()))) for r in outside)
    if not ok:
        return False
    for r in outside:
        if r.op == "transpose":
            r.attrs["perm"] = (0, 3, 1, 2)
            n, c, tt = shapes[r.output]
            shapes[r.output] = (n, c, 1, tt)
    return True


def _merge(host: _Proto, tail: _Proto) -> None:
    host.output = tail.output
    host.nodes.extend(tail.nodes)


def _fuse_silu(protos: list[_Proto], keep: set[str]) -> list[_Proto]:
    """x * sigmoid(x) -> silu(x); x * hardsigmoid(x) (alpha 1/6, beta 1/2) -> hardswish(x)."""
    by_out = {p.output: p for p in protos}
    drop: set[int] = set()
    for p in protos:
        if p.op != "mul" or len(p.inputs) != 2:
            continue
        for x, gate in (p.inputs, p.inputs[::-1]):
            g = by_out.get(gate)
            if g is None or g.op != "activation" or g.inputs != [x] or _sole_consumer(protos, gate, keep) is not p:
                continue
            kind = g.attrs["act"][0]
            if kind == ("sigmoid",) or (kind[0] == "hardsigmoid" and abs(kind[1] - 1 / 6) < 1e-6 and abs(kind[2] - 0.5) < 1e-6):
                p.op, p.inputs = "activation", [x]
                p.attrs = {"act": (("silu",) if kind == ("sigmoid",) else ("hardswish",),)}
                p.nodes = g.nodes + p.nodes
                drop.add(id(g))
                break
    return [p for p in protos if id(p) not in drop]


# Elementwise layers that may be a step of a function of one tensor spelled as several nodes.
POINTWISE_OPS = ("activation", "add", "mul", "eltwise")


def _pointwise(p: _Proto) -> bool:
    return p.op in POINTWISE_OPS and bool(p.inputs) and all(np.asarray(a).size == 1 for a in p.params)


def _fuse_functions(protos: list[_Proto], keep: set[str], recognise: Recogniser) -> list[_Proto]:
    """Elementwise layers that together compute a known activation of one tensor x (GELU as
    x * 0.5 * (1 + erf(x / sqrt 2)) or its tanh form, hard-swish as x * relu6(x + 3) / 6, Mish as
    x * tanh(softplus(x)), SiLU, ...) become that activation, which then fuses into the layer
    producing x. Recognised by value, whatever the exporter's node order or constants: the
    layers run on sample points and must give the activation's values."""
    position = {id(p): i for i, p in enumerate(protos)}
    root: dict[str, str] = {}
    members: dict[str, list[_Proto]] = {}
    for p in protos:
        if not _pointwise(p):
            continue
        roots = {root.get(t, t) for t in p.inputs}
        if len(roots) != 1:
            continue
        group = {id(m): m for t in p.inputs for m in members.get(t, ())}
        group[id(p)] = p
        members[p.output] = sorted(group.values(), key=lambda m: position[id(m)])
        root[p.output] = roots.pop()
    readers = _consumers(protos)
    drop: set[int] = set()
    for p in reversed(protos):
        group = members.get(p.output, [])
        if len(group) < 2 or id(p) in drop or any(id(m) in drop for m in group):
            continue
        inside = {id(m) for m in group}
        if any(m.output in keep or any(id(r) not in inside for r in readers.get(m.output, ())) for m in group if m is not p):
            continue
        kind = recognise(group, root[p.output])
        if kind is None:
            continue
        p.op, p.inputs, p.attrs, p.params = "activation", [root[p.output]], {"act": (kind,)}, []
        p.nodes = [n for m in group for n in m.nodes]
        drop.update(id(m) for m in group if m is not p)
    return [p for p in protos if id(p) not in drop]


def _scalar_param(p: _Proto) -> float | None:
    if len(p.inputs) != 1 or len(p.params) != 1 or np.asarray(p.params[0]).size != 1 or p.attrs.get("act"):
        return None
    return float(np.asarray(p.params[0]).reshape(-1)[0])


def _layernorm_chain(div: _Proto, by_out: dict[str, _Proto], readers: dict[str, list[_Proto]],
                     keep: set[str], shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[str, float, list[_Proto]] | None:
    """(x, epsilon, the layers) of (x - mean_C x) / sqrt(mean_C (x - mean_C x)^2 + eps) ending in
    `div`, LayerNorm over channels as exporters before opset 17 spell it, or None. With `shapes`,
    the means may be over the last axis instead (LayerNorm of tokens), both alike."""
    shapes = shapes or {}

    def made(t: str, op: str, **attrs) -> _Proto | None:
        p = by_out.get(t)
        if op == "channel_reduce" and p is not None and p.op == "reduce":  # a mean over the last axis
            rank = len(shapes.get(p.inputs[0], ()))
            ok = p.attrs["kind"] == "mean" and p.attrs["keepdims"] and tuple(p.attrs["axes"]) == (rank - 1,) and not p.attrs["act"]
            return p if ok and t not in keep else None
        ok = p is not None and p.op == op and all(p.attrs.get(k) == v for k, v in attrs.items())
        return p if ok and t not in keep else None

    if div.op != "eltwise" or div.attrs.get("fn") != "div" or tuple(div.attrs["order"]) != (0, 1) or div.params:
        return None
    d, s = div.inputs
    sub, sqrt = made(d, "eltwise", fn="sub"), made(s, "activation", act=(("sqrt",),))
    add = made(sqrt.inputs[0], "add") if sqrt else None
    eps = _scalar_param(add) if add else None
    var = made(add.inputs[0], "channel_reduce", kind="mean") if eps is not None else None
    square = made(var.inputs[0], "eltwise", fn="pow") if var else None
    if sub is None or square is None or square.inputs != [d] or _scalar_param(square) != 2.0 or tuple(sub.attrs["order"]) != (0, 1):
        return None
    x, m = sub.inputs
    mean = made(m, "channel_reduce", kind="mean")
    if mean is None or mean.inputs != [x] or sub.params or mean.op != var.op:
        return None
    chain = [mean, sub, square, var, add, sqrt, div]
    sole = {m: sub, square.output: var, var.output: add, add.output: sqrt, s: div}
    if any(readers.get(t, []) != [r] for t, r in sole.items()) or {id(r) for r in readers.get(d, [])} != {id(square), id(div)}:
        return None
    return x, eps, chain


def _fuse_layernorm(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]] | None = None) -> list[_Proto]:
    """LayerNorm over channels spelled as reductions and arithmetic (ReduceMean, Sub, Pow,
    ReduceMean, Add, Sqrt, Div, then Mul by the scale and Add of the bias: opsets before 17,
    inside a channels-last block made NCHW) becomes one channel_norm layer: one tensor instead
    of eight between x and the normalized output; over the last axis of tokens (issue 38), one
    layer_norm layer."""
    by_out = {p.output: p for p in protos}
    readers = _consumers(protos)
    drop: set[int] = set()
    for div in protos:
        found = _layernorm_chain(div, by_out, readers, keep, shapes)
        if found is None or any(id(p) in drop for p in found[2]):
            continue
        x, eps, chain = found
        last = chain[0].op == "reduce"
        vector = _last_axis_vector if last else _channel_vector
        channels = shapes[x][-1] if last else None
        tail = chain[-1]
        scale = bias = None
        nxt = _sole_consumer(protos, tail.output, keep)
        if nxt is not None and nxt.op == "mul" and nxt.inputs == [tail.output]:
            channels = channels or (int(np.asarray(nxt.params[0]).size) if len(nxt.params) == 1 else None)
            scale = vector(nxt, channels) if channels else None
            if scale is not None:
                chain, tail = chain + [nxt], nxt
                nxt = _sole_consumer(protos, tail.output, keep)
        if nxt is not None and nxt.op == "add" and nxt.inputs == [tail.output] and len(nxt.params) == 1:
            channels = channels or int(np.asarray(nxt.params[0]).size)
            bias = vector(nxt, channels)
            if bias is not None:
                chain, tail = chain + [nxt], nxt
        if channels is None or (channels == 1 and not last):
            continue  # the channel count is not known here without a per-channel scale or bias
        tail.op, tail.inputs, tail.attrs = "layer_norm" if last else "channel_norm", [x], {"epsilon": eps, "act": ()}
        tail.params = [np.ones(channels, np.float32) if scale is None else scale.astype(np.float32),
                       np.zeros(channels, np.float32) if bias is None else bias.astype(np.float32)]
        tail.nodes = [n for p in chain for n in p.nodes]
        drop.update(id(p) for p in chain if p is not tail)
    return [p for p in protos if id(p) not in drop]


def _fuse_batchnorm(protos: list[_Proto], keep: set[str]) -> list[_Proto]:
    drop: set[int] = set()
    for p in protos:
        if p.op not in ("conv", "gemm", "conv_transpose") or p.attrs.get("act"):
            continue
        bn = _sole_consumer(protos, p.output, keep)
        if bn is None or bn.op != "batchnorm" or bn.attrs.get("act"):
            continue
        scale, shift, mean, var = bn.params
        bias = p.params[1] if len(p.params) > 1 else None
        if p.op == "conv_transpose":
            w, b = fold_batchnorm_transposed(p.params[0], bias, p.attrs["groups"], scale, shift, mean, var,
                                             bn.attrs["epsilon"])
        else:
            w, b = fold_batchnorm(p.params[0], bias, scale, shift, mean, var, bn.attrs["epsilon"])
        p.params = [w, b]
        _merge(p, bn)
        drop.add(id(bn))
    return [p for p in protos if id(p) not in drop]


def _channel_vector(p: _Proto, channels: int) -> np.ndarray | None:
    """The constant operand of a one-input Mul/Add as a per-channel vector of `channels`
    values, or None if it varies over anything but channels (or is not a lone constant)."""
    if len(p.inputs) != 1 or len(p.params) != 1 or p.attrs.get("act"):
        return None
    c = np.asarray(p.params[0])
    if c.ndim not in (2, 4) or c.shape[0] != 1 or any(d != 1 for d in c.shape[2:]) or c.shape[1] not in (1, channels):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (channels,))


def _last_axis_vector(p: _Proto, size: int) -> np.ndarray | None:
    """The constant operand of a one-input Mul/Add as a vector along the last axis (a Linear's bias
    on tokens, a LayerNorm's scale), or None if it varies over anything else."""
    if len(p.inputs) != 1 or len(p.params) != 1 or p.attrs.get("act"):
        return None
    c = np.asarray(p.params[0])
    if c.ndim < 1 or any(d != 1 for d in c.shape[:-1]) or c.shape[-1] not in (1, size):
        return None
    return np.broadcast_to(c.reshape(-1).astype(np.float64), (size,))


def _fuse_affine(protos: list[_Proto], keep: set[str]) -> list[_Proto]:
    """A per-channel Mul or Add by a constant after a conv, dense or batch norm (Caffe's Scale
    layer: BN -> Mul -> Add, as in the ONNX zoo's DenseNet and Inception v2) folds into it."""
    by_out = {p.output: p for p in protos}
    drop: set[int] = set()
    for p in protos:
        if p.op not in ("mul", "add") or len(p.inputs) != 1:
            continue
        host = by_out.get(p.inputs[0])
        if host is None or id(host) in drop or host.attrs.get("act") or _sole_consumer(protos, host.output, keep) is not p:
            continue
        if host.op == "conv":
            channels = host.attrs["out_channels"]
        elif host.op == "gemm":
            channels = host.attrs["out_features"]
        elif host.op == "batchnorm":
            channels = int(np.asarray(host.params[0]).size)
        else:
            continue
        v = _last_axis_vector(p, channels) if host.attrs.get("last_axis") else _channel_vector(p, channels)
        if v is None:
            continue
        if host.op == "batchnorm":
            gamma, beta, mean, var = (np.asarray(a, dtype=np.float64) for a in host.params)
            if p.op == "mul":
                gamma, beta = gamma * v, beta * v
            else:
                beta = beta + v
            host.params = [a.astype(np.float32) for a in (gamma, beta, mean, var)]
        else:
            w = np.asarray(host.params[0], dtype=np.float64)
            b = np.asarray(host.params[1], dtype=np.float64) if len(host.params) > 1 else np.zeros(channels)
            if p.op == "mul":
                w = w * v.reshape((-1,) + (1,) * (w.ndim - 1))
                b = b * v
            else:
                b = b + v
            host.params = [w.astype(np.float32), b.astype(np.float32)]
        del by_out[host.output]
        _merge(host, p)
        by_out[host.output] = host
        drop.add(id(p))
    return [p for p in protos if id(p) not in drop]


def _fuse_channel_shuffle(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]]) -> list[_Proto]:
    """Reshape (N, C, H, W) -> (N, g, C/g, H, W), Transpose (0, 2, 1, 3, 4), Reshape back to
    (N, C, H, W): ShuffleNet's channel shuffle, one splittable layer."""
    drop: set[int] = set()
    for p in protos:
        if p.op != "reshape" or id(p) in drop or p.inputs[0] not in shapes:
            continue
        x = shapes[p.inputs[0]]
        split = tuple(p.attrs["sample_shape"])
        if len(x) != 4 or len(split) != 4 or split[0] * split[1] != x[1] or split[2:] != x[2:]:
            continue
        t = _sole_consumer(protos, p.output, keep)
        if t is None or t.op != "transpose" or tuple(t.attrs["perm"]) != (0, 2, 1, 3, 4):
            continue
        back = _sole_consumer(protos, t.output, keep)
        if back is None or back.op != "reshape" or tuple(back.attrs["sample_shape"]) != tuple(x[1:]):
            continue
        back.op, back.inputs, back.attrs = "channel_shuffle", [p.inputs[0]], {"groups": int(split[0])}
        back.nodes = p.nodes + t.nodes + back.nodes
        back.params = []
        drop.update((id(p), id(t)))
    return [p for p in protos if id(p) not in drop]


def _fuse_depth_space(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]]) -> list[_Proto]:
    """Reshape to 6-D -> Transpose -> Reshape to 4-D that moves elements as DepthToSpace or
    SpaceToDepth does (PyTorch's pixel_unshuffle): one splittable layer of that op."""
    from tightfit.ops.rearrange import depth_space_equivalent

    drop: set[int] = set()
    for p in protos:
        if p.op != "reshape" or id(p) in drop or len(shapes.get(p.inputs[0], ())) != 4:
            continue
        t = _sole_consumer(protos, p.output, keep)
        back = _sole_consumer(protos, t.output, keep) if t is not None and t.op == "transpose" else None
        if back is None or back.op != "reshape":
            continue
        found = depth_space_equivalent(shapes[p.inputs[0]], p.attrs["sample_shape"], t.attrs["perm"],
                                       back.attrs["sample_shape"])
        if found is None:
            continue
        back.op, back.attrs = found
        back.inputs, back.params, back.nodes = [p.inputs[0]], [], p.nodes + t.nodes + back.nodes
        drop.update((id(p), id(t)))
    return [p for p in protos if id(p) not in drop]


def _fuse_pad(protos: list[_Proto], keep: set[str]) -> list[_Proto]:
    """A zero Pad over H and W followed by a conv becomes the conv's padding (negative = crop)."""
    drop: set[int] = set()
    for p in protos:
        if p.op != "pad" or not p.attrs.get("foldable"):
            continue
        conv = _sole_consumer(protos, p.output, keep)
        if conv is None or conv.op != "conv":
            continue
        t, l, b, r = p.attrs["pads_hw"]
        ct, cl, cb, cr = conv.attrs["pads"]
        # Zero padding adds to zero padding; a crop (negative) only folds where the conv pads
        # nothing on that side, since cropping then padding is not padding by the sum.
        if any(pad < 0 and own != 0 for pad, own in ((t, ct), (l, cl), (b, cb), (r, cr))):
            continue
        conv.attrs["pads"] = (ct + t, cl + l, cb + b, cr + r)
        conv.inputs = [p.inputs[0]]
        conv.nodes = p.nodes + conv.nodes
        drop.add(id(p))
    return [p for p in protos if id(p) not in drop]


def _fuse_flatten(protos: list[_Proto], keep: set[str], shapes: dict[str, tuple[int, ...]] | None = None) -> list[_Proto]:
    """A Flatten (or a Reshape that flattens each sample, as old models spell it) into the dense
    layer that reads it."""
    shapes = shapes or {}
    drop: set[int] = set()
    for p in protos:
        if p.op == "reshape":
            x = shapes.get(p.inputs[0])
            flat = len(p.attrs["sample_shape"]) == 1 and x is not None and int(np.prod(x[1:])) == p.attrs["sample_shape"][0]
            if not flat:
                continue
        elif p.op != "flatten" or p.attrs.get("axis", 1) != 1:
            continue
        dense = _sole_consumer(protos, p.output, keep)
        if dense is None or dense.op != "gemm" or dense.inputs[0] != p.output:
            continue
        dense.inputs = [p.inputs[0]] + dense.inputs[1:]
        dense.nodes = p.nodes + dense.nodes
        drop.add(id(p))
    return [p for p in protos if id(p) not in drop]


def _fuse_activations(protos: list[_Proto], keep: set[str]) -> list[_Proto]:
    by_out = {p.output: p for p in protos}
    drop: set[int] = set()
    for p in protos:
        if p.op != "activation" or len(p.inputs) != 1:
            continue
        host = by_out.get(p.inputs[0])
        if host is None or host.op not in ACTIVATION_HOSTS or id(host) in drop:
            continue
        if _sole_consumer(protos, host.output, keep) is not p:
            continue
        host.attrs["act"] = tuple(host.attrs.get("act", ())) + tuple(p.attrs["act"])
        del by_out[host.output]
        _merge(host, p)
        by_out[host.output] = host
        drop.add(id(p))
    return [p for p in protos if id(p) not in drop]
