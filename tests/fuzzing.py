"""Fuzzing helpers (issue 23): random small CNNs built with onnx.helper and random edits of them
(dims, attributes, initializers, wiring), random edits of plan and application files and of
command-line values, and a runner that puts each case through the CLI and classifies the outcome.

Every case must end in exit 0 with verified outputs, or exit 2 with exactly one line on stderr;
never a traceback, a signal, a hang or a file left behind. Randomness is seeded per case, so a
failure is reproduced by its (kind, seed) alone."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# --- random CNNs -----------------------------------------------------------------------------


@dataclass
class _Net:
    """A model being built: nodes, initializers, and the live tensors with their shapes."""

    rng: random.Random
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict)
    count: int = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count}"

    def const(self, stem: str, array: np.ndarray) -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def weights(self, *shape: int) -> np.ndarray:
        seed = self.rng.randrange(2**31)
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) / max(1.0, float(np.prod(shape[1:])) ** 0.5)

    def add(self, op: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(f"n_{op}_"), **attrs))
        self.shapes[out] = shape
        return out


def _conv(net: _Net, x: str) -> str:
    r = net.rng
    n, c, h, w = net.shapes[x]
    k = r.choice((1, 1, 3, 3, 5)) if min(h, w) >= 5 else r.choice((1, 3)) if min(h, w) >= 3 else 1
    stride = r.choice((1, 1, 2))
    pad = r.choice((0, k // 2))
    depthwise = c > 1 and r.random() < 0.3
    groups = c if depthwise else 1
    cout = c if depthwise else r.choice((1, 2, 3, 4, 8))
    weight = net.const("w", net.weights(cout, c // groups, k, k))
    inputs = [x, weight] + ([net.const("b", net.weights(cout))] if r.random() < 0.7 else [])
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    return net.add("Conv", inputs, (n, cout, oh, ow), kernel_shape=[k, k], strides=[stride, stride],
                   pads=[pad, pad, pad, pad], group=groups)


def _pool(net: _Net, x: str) -> str:
    r = net.rng
    n, c, h, w = net.shapes[x]
    if min(h, w) < 2:
        return _act(net, x)
    k, s = r.choice(((2, 2), (3, 1), (3, 2))) if min(h, w) >= 3 else (2, 2)
    op = r.choice(("MaxPool", "AveragePool"))
    return net.add(op, [x], (n, c, (h - k) // s + 1, (w - k) // s + 1), kernel_shape=[k, k], strides=[s, s])


def _act(net: _Net, x: str) -> str:
    op = net.rng.choice(("Relu", "Sigmoid", "LeakyRelu", "Tanh"))
    return net.add(op, [x], net.shapes[x])


def _batchnorm(net: _Net, x: str) -> str:
    c = net.shapes[x][1]
    stats = [net.const("bn", a) for a in (net.weights(c) + 1, net.weights(c), net.weights(c), np.abs(net.weights(c)) + 0.5)]
    return net.add("BatchNormalization", [x] + stats, net.shapes[x])


def _residual(net: _Net, x: str) -> str:
    """x + f(x) with f a shape-keeping conv, or a concat of x with it."""
    n, c, h, w = net.shapes[x]
    weight = net.const("w", net.weights(c, c, 3, 3)) if min(h, w) >= 1 else None
    y = net.add("Conv", [x, weight], (n, c, h, w), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if net.rng.random() < 0.5:
        return net.add("Add", [x, y], (n, c, h, w))
    return net.add("Concat", [x, y], (n, 2 * c, h, w), axis=1)


def _pad(net: _Net, x: str) -> str:
    n, c, h, w = net.shapes[x]
    p = net.rng.choice((1, 2))
    pads = net.const("pads", np.array([0, 0, p, p, 0, 0, p, p], dtype=np.int64))
    return net.add("Pad", [x, pads], (n, c, h + 2 * p, w + 2 * p))


def _resize(net: _Net, x: str) -> str:
    n, c, h, w = net.shapes[x]
    scales = net.const("scales", np.array([1, 1, 2, 2], dtype=np.float32))
    return net.add("Resize", [x, "", scales], (n, c, 2 * h, 2 * w), mode="nearest")


def _head(net: _Net, x: str) -> str:
    """GlobalAveragePool -> Flatten -> Gemm (-> Softmax), or Flatten -> Gemm, or a Reshape."""
    r = net.rng
    n, c, h, w = net.shapes[x]
    choice = r.random()
    if choice < 0.4:
        x = net.add("GlobalAveragePool", [x], (n, c, 1, 1))
        c, h, w = c, 1, 1
    if choice < 0.8:
        flat = net.add("Flatten", [x], (n, c * h * w), axis=1)
        out = r.choice((2, 5, 10))
        y = net.add("Gemm", [flat, net.const("fc", net.weights(out, c * h * w)), net.const("fcb", net.weights(out))],
                    (n, out), transB=1)
        return net.add("Softmax", [y], (n, out), axis=1) if r.random() < 0.3 else y
    target = net.const("shape", np.array([n, c * h, w], dtype=np.int64) if r.random() < 0.5 else np.array([n, -1], dtype=np.int64))
    return net.add("Reshape", [x, target], (n, c * h * w) if net.inits[-1].dims[0] == 2 else (n, c * h, w))


BODY = (_conv, _conv, _conv, _pool, _act, _batchnorm, _residual, _pad, _resize)


def random_model(rng: random.Random) -> onnx.ModelProto:
    """A valid small CNN: an NCHW input, 1-5 body layers, sometimes a head."""
    net = _Net(rng)
    shape = (1, rng.choice((1, 2, 3, 4)), rng.randint(3, 12), rng.randint(3, 12))
    net.shapes["input"] = shape
    x = "input"
    for _ in range(rng.randint(1, 5)):
        if net.shapes[x][2] * net.shapes[x][3] > 2000:
            break
        x = rng.choice(BODY)(net, x)
    if rng.random() < 0.4:
        x = _head(net, x)
    graph = helper.make_graph(net.nodes, "fuzz", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], net.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


# --- edits of models -------------------------------------------------------------------------

BAD_INTS = (0, -1, -2, 1, 2, 3, 7, 100, 2**20, 2**31 - 1, 2**40)


def _edit_attribute(m: onnx.ModelProto, r: random.Random) -> str:
    nodes = [n for n in m.graph.node if n.attribute]
    if not nodes:
        return "none"
    node = r.choice(nodes)
    attr = r.choice(list(node.attribute))
    if attr.type == onnx.AttributeProto.INTS and attr.ints:
        i = r.randrange(len(attr.ints))
        attr.ints[i] = r.choice(BAD_INTS)
        if r.random() < 0.2:
            attr.ints.append(r.choice(BAD_INTS))
    elif attr.type == onnx.AttributeProto.INT:
        attr.i = r.choice(BAD_INTS)
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = r.choice((0.0, -1.0, float("nan"), float("inf"), 1e30))
    elif attr.type == onnx.AttributeProto.STRING:
        attr.s = r.choice((b"", b"bogus", b"SAME_UPPER", b"VALID", b"\xff\xfe"))
    return f"attribute {attr.name} of {node.op_type}"


def _edit_initializer(m: onnx.ModelProto, r: random.Random) -> str:
    if not m.graph.initializer:
        return "none"
    init = r.choice(list(m.graph.initializer))
    try:
        a = numpy_helper.to_array(init)
    except ValueError:  # cut short by an earlier edit
        return "none"
    how = r.choice(("dim", "short", "rank", "dtype", "drop", "nan", "huge"))
    if how == "dim" and a.ndim:
        shape = list(a.shape)
        shape[r.randrange(len(shape))] = r.choice((0, 1, 2, 3, 5))
        b = np.resize(a, shape) if np.prod(shape) else np.zeros(shape, a.dtype)
    elif how == "short":  # the declared dims stay, the data is cut short
        init.CopyFrom(numpy_helper.from_array(a, init.name))
        if init.raw_data:
            init.raw_data = init.raw_data[: len(init.raw_data) // 2]
        return f"short initializer {init.name}"
    elif how == "rank":
        b = a.reshape(-1) if a.ndim != 1 else a.reshape(1, -1)
    elif how == "dtype":
        b = a.astype(r.choice((np.float64, np.int64, np.float16, np.int32)))
    elif how == "drop":
        m.graph.initializer.remove(init)
        return f"dropped initializer {init.name}"
    elif how == "nan":
        b = a.copy()
        if b.size and b.dtype.kind == "f":
            b.flat[r.randrange(b.size)] = r.choice((np.nan, np.inf))
    else:  # an integer constant (reshape target, pads) set to a huge or negative value
        b = a.copy()
        if b.size:
            b.flat[r.randrange(b.size)] = r.choice((-5, -1, 0, 2**31 - 1, 10**12)) if b.dtype.kind == "i" else 1e30
    init.CopyFrom(numpy_helper.from_array(np.asarray(b), init.name))
    return f"initializer {init.name} ({how})"


def _edit_wiring(m: onnx.ModelProto, r: random.Random) -> str:
    nodes = list(m.graph.node)
    if not nodes:
        return "none"
    node = r.choice(nodes)
    how = r.choice(("undefined", "cycle", "self", "swap", "dup_output", "drop_node", "extra_input", "output_undefined"))
    if how == "undefined" and node.input:
        node.input[0] = "nowhere"
    elif how == "cycle" and len(nodes) > 1:
        later = nodes[r.randrange(nodes.index(node), len(nodes))]
        node.input[0] = later.output[0]
    elif how == "self":
        node.input[0] = node.output[0]
    elif how == "swap" and len(nodes) > 1:
        i, j = r.sample(range(len(nodes)), 2)
        a, b = copy.deepcopy(nodes[i]), copy.deepcopy(nodes[j])
        m.graph.node[i].CopyFrom(b)
        m.graph.node[j].CopyFrom(a)
    elif how == "dup_output" and len(nodes) > 1:
        other = r.choice([n for n in nodes if n is not node])
        node.output[0] = other.output[0]
    elif how == "drop_node":
        m.graph.node.remove(node)
    elif how == "extra_input":
        node.input.append(r.choice(["input", node.output[0], ""]))
    elif how == "output_undefined":
        m.graph.output[0].name = "nothing"
    return f"wiring {how} at {node.op_type}"


def _edit_input(m: onnx.ModelProto, r: random.Random) -> str:
    dims = m.graph.input[0].type.tensor_type.shape.dim
    how = r.choice(("dim", "rank", "dynamic", "dtype", "huge"))
    if how == "dim":
        value, at = r.choice((0, 1, 2, 1000, 2**16)), r.randrange(len(dims))
        # Large but valid dims are valid jobs, not bad inputs (2^20 samples: 18 GiB with --verify;
        # 2^20 columns: over a minute on a loaded machine): at most 2^16, the batch at most 1000.
        # Sizes beyond memory are the "huge" edit's.
        dims[at].dim_value = min(value, 1000) if at == 0 else value
    elif how == "huge":
        # Beyond any machine's memory (a few TiB): refused before anything is allocated.
        h, w = r.choice(((2**20, 2**20), (2**31, 2**12), (2**40, 1)))
        at = 2 if len(dims) >= 4 else max(len(dims) - 2, 0)  # an earlier edit may have dropped dims
        for d, v in zip(dims[at:], (h, w)):
            d.dim_value = v
    elif how == "rank":
        if r.random() < 0.5:
            dims.add().dim_value = 2
        else:
            del dims[-1]
    elif how == "dynamic":
        dims[r.randrange(len(dims))].dim_param = "n"
    else:
        m.graph.input[0].type.tensor_type.elem_type = r.choice((TensorProto.DOUBLE, TensorProto.INT64, TensorProto.FLOAT16))
    return f"input {how}"


def _edit_op(m: onnx.ModelProto, r: random.Random) -> str:
    if not m.graph.node:
        return "none"
    node = r.choice(list(m.graph.node))
    node.op_type = r.choice(("Conv", "MaxPool", "Add", "Concat", "Gemm", "Reshape", "Relu", "BatchNormalization",
                             "Flatten", "GlobalAveragePool", "Softmax", "Pad", "Resize", "Mul", "LRN", "Transpose",
                             "Squeeze", "Unsqueeze", "AveragePool", "NoSuchOp"))
    return f"op type -> {node.op_type}"


MODEL_EDITS: tuple[Callable[[onnx.ModelProto, random.Random], str], ...] = (
    _edit_attribute, _edit_attribute, _edit_initializer, _edit_initializer, _edit_wiring, _edit_input, _edit_op)


def mutated_model(seed: int) -> tuple[bytes, str]:
    """A random CNN with 0-3 random edits (a fifth of the cases unedited), as bytes, and what was
    done to it."""
    r = random.Random(seed)
    m = random_model(r)
    edits = [] if r.random() < 0.2 else [r.choice(MODEL_EDITS)(m, r) for _ in range(r.randint(1, 3))]
    data = m.SerializeToString()
    if r.random() < 0.03:  # a truncated or corrupted file
        cut = r.randrange(1, len(data))
        data = data[:cut] if r.random() < 0.5 else data[:cut] + bytes(r.randrange(256) for _ in range(8)) + data[cut + 8:]
        edits.append("bytes corrupted")
    return data, "; ".join(edits) or "unedited"


# --- edits of plans and applications ---------------------------------------------------------

def _json_paths(d, prefix=()):
    """Every (path, value) of a JSON document."""
    yield prefix, d
    if isinstance(d, dict):
        for k, v in d.items():
            yield from _json_paths(v, prefix + (k,))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from _json_paths(v, prefix + (i,))


def _set(d, path, value):
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


BAD_VALUES = (0, -1, 1, 2, 3, 63, 64, 10**6, 2**31, 2**63, 10**30, -(10**30), 1.5, float("nan"), True, None, "x", "", [], {},
              [0, 0, 0], "../../etc/passwd")


def mutated_plan_text(valid: str, seed: int) -> bytes:
    """A valid plan file with 1-3 random edits of its values, keys or bytes."""
    r = random.Random(seed)
    how = r.random()
    if how < 0.06:  # raw bytes: invalid UTF-8, truncation, a deep nest, a huge number
        kind = r.choice(("utf8", "truncate", "deep", "digits", "nan", "empty"))
        if kind == "utf8":
            return valid.encode()[:50] + b"\xff\xfe\x80" + valid.encode()[50:]
        if kind == "truncate":
            return valid.encode()[: r.randrange(len(valid))]
        if kind == "deep":
            return b"[" * 100000 + b"]" * 100000
        if kind == "digits":
            return valid.replace('"arena_bytes":', '"arena_bytes":' + "9" * 5000 + "0*", 1).replace("0*", "", 1).encode()
        if kind == "nan":
            return valid.replace('"arena_bytes":', '"arena_bytes":NaN,"x":', 1).encode()
        return b""
    d = json.loads(valid)
    for _ in range(r.randint(1, 3)):
        paths = [p for p, _ in _json_paths(d) if p]
        if not paths:
            break
        path = r.choice(paths)
        op = r.random()
        if op < 0.55:
            value = r.choice(BAD_VALUES)
            current = _get(d, path)
            if isinstance(current, int) and not isinstance(current, bool) and r.random() < 0.5:
                value = current + r.choice((-64, -4, -1, 1, 4, 64, 10**9))
            _set(d, path, copy.deepcopy(value))
        elif op < 0.7:
            parent = _get(d, path[:-1])
            if isinstance(parent, dict):
                del parent[path[-1]]
            elif isinstance(parent, list) and parent:
                parent.pop(path[-1])
        elif op < 0.85:  # duplicate or reorder a list entry (steps, buffers, partitions)
            parent = _get(d, path[:-1])
            if isinstance(parent, list) and parent:
                if r.random() < 0.5:
                    parent.insert(r.randrange(len(parent) + 1), copy.deepcopy(r.choice(parent)))
                else:
                    r.shuffle(parent)
        else:
            targeted = r.choice(("scratch", "concurrent", "offsets", "spec", "arena", "batch", "overlay", "knobs"))
            try:
                _targeted_plan_edit(d, targeted, r)
            except (TypeError, KeyError, IndexError, AttributeError):  # an earlier edit changed what it edits
                pass
    return json.dumps(d, allow_nan=True).encode()


def _get(d, path):
    for k in path:
        d = d[k]
    return d


def _targeted_plan_edit(d: dict, what: str, r: random.Random) -> None:
    steps = [s for p in d.get("partitions", []) if isinstance(p, dict) for s in p.get("steps", []) if isinstance(s, dict)]
    if what == "scratch" and steps:
        r.choice(steps)["scratch"] = r.choice((0, 1, 10**12, 10**15, -5))
    elif what == "concurrent":
        d["concurrent"] = r.choice(([[0, 7]], [[0, 0]], [[-1]], [[0], [0]], [[10**9]]))
    elif what == "offsets" and d.get("buffers"):
        r.choice(d["buffers"])["offsets"] = r.choice(([10**12], [0, 0], [-4], [], [2**62]))
        if r.random() < 0.5:
            d["arena_bytes"] = 10**12 + 4096
    elif what == "spec" and d.get("models"):
        d["models"][0]["spec"] = r.choice(("nosuchmodel", "/nonexistent.onnx", "", "minakova5", "\x00"))
    elif what == "arena":
        d["arena_bytes"] = r.choice((0, -1, 10**13, 2**63))
    elif what == "batch" and d.get("models"):
        d["models"][0]["batch"] = r.choice((0, 2, 10**6, -1))
    elif what == "overlay" and d.get("buffers"):
        r.choice(d["buffers"])["overlay"] = r.choice(([0, 0], [1, 64], [10**9, 0], [0, -64]))
    elif what == "knobs":
        d["knobs"] = r.choice(({"tiling": "bogus"}, {"phases": {"0": -1}}, [], {"vbs": {"table": [[1] * 3]}}))


def app_texts(models: list[str], seed: int, layers: int = 3) -> tuple[bytes, str]:
    """An application file over the given .onnx paths (YAML or JSON), valid or edited; the first
    model has `layers` layers."""
    r = random.Random(seed)
    names = ["a", "b", "c"][: len(models)]
    cnns = [{"name": n, "model": m} for n, m in zip(names, models)]
    partitions = [{"cnn": n, "layers": "all"} for n in names]
    data = {"cnns": cnns, "partitions": partitions}
    if len(names) > 1 and r.random() < 0.3:
        data["pipelines"] = [[0, 1]]
    edit = r.choice(("none", "dup_name", "order", "range", "huge_range", "pipeline", "types", "shape", "missing",
                     "utf8", "deep", "alias_bomb", "extra", "empty", "overlap", "digits"))
    ext = r.choice((".yaml", ".json"))
    if edit == "dup_name" and len(cnns) > 1:
        cnns[1]["name"] = cnns[0]["name"]
    elif edit == "order":  # one CNN's layers split in two partitions, listed last part first
        data["partitions"] = [{"cnn": names[0], "layers": f"1-{layers - 1}"}, {"cnn": names[0], "layers": "0"}] + partitions[1:]
    elif edit == "range":
        partitions[0]["layers"] = r.choice(("0-200", "-1", "5-2", "a-b", "3-", "0,0", 17, None, [0, 1], "0-1,1-2"))
    elif edit == "huge_range":
        partitions[0]["layers"] = r.choice(("0-99999999999", "0-" + "9" * 400, "99999999999999"))
    elif edit == "pipeline":
        data["pipelines"] = r.choice(([[0, 9]], [[-1]], [["a"]], "x", [[0, 0]], [[0], [0]], [[True]]))
    elif edit == "types":
        cnns[0][r.choice(("name", "model"))] = r.choice((1, None, ["x"], {"a": 1}, True))
    elif edit == "shape":
        cnns[0]["input_shape"] = r.choice(("1x3", "0x1x1x1", "axb", "1x" + "9" * 400 + "x4x4", 5, [1, 2], "1x1x99999x99999"))
    elif edit == "missing":
        cnns[0]["model"] = r.choice(("nosuch.onnx", "nosuchzoo", "../../x.onnx"))
    elif edit == "extra":
        data["cnns"].append(r.choice((5, "x", {"name": "z"}, {"model": models[0]})))
    elif edit == "overlap" and len(names) >= 1:
        data["partitions"] = [{"cnn": names[0], "layers": "all"}, {"cnn": names[0], "layers": "0"}] + partitions[1:]
    elif edit == "empty":
        data = r.choice(({}, {"cnns": []}, [], "x", None, {"cnns": "abc"}, {"cnns": [{}]}, {"cnns": cnns, "partitions": "x"}))
    if edit == "utf8":
        return b"cnns: [\xff\xfe]\n", ".yaml"
    if edit == "deep":
        return (b"[" * 50000 + b"]" * 50000, ext)
    if edit == "digits":
        return json.dumps({"cnns": cnns, "partitions": [{"cnn": names[0], "layers": 10**5000 if False else 0}]}).replace(
            '"layers": 0', '"layers": ' + "9" * 5000).encode(), ".json"
    if edit == "alias_bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
        return ("\n".join(lines) + "\ncnns: *a8\n").encode(), ".yaml"
    if ext == ".json":
        return json.dumps(data).encode(), ext
    import yaml

    return yaml.safe_dump(data).encode(), ext


# --- command-line values ---------------------------------------------------------------------

JUNK = ("", "0", "-1", "1e400", "9" * 400, "9" * 400 + "MB", "nan", "inf", "1x" * 300, "0x0", "\x00", "1.5.5",
        "3" * 30 + "kB", "2**40", "1e-300kB", "10 GiB", ",,,", "0-0:0x0", "0-99:2x2", "a=b", "0=0", "0=" + "9" * 400,
        "1x1x100000x100000", "70000x1x64x64", "1x1x1x" + "9" * 30, "9" * 40, "100000000", "-3", "2")


def cli_values(model: str, seed: int) -> list[str]:
    """A command over a valid model with one odd value for a size, shape, count, phases or
    tiling option: every value with every option in turn, as the seed counts up."""
    value = JUNK[seed % len(JUNK)]
    commands = (
        ["plan", model, "--method", "parts", "--budget", value, "--time-limit", "5"],
        ["plan", model, "--method", "parts", "--phases", value],
        ["plan", model, "--method", "parts", "--rows", value],
        ["plan", model, "--method", "tiling", "--tiling", value],
        ["inspect", model, "--input-shape", value],
        ["run", model, "--input-shape", value],
        ["inspect", model, "--batch", value],
        ["plan", model, "--batch", value],
        ["csdf", model, "--source-phases", value],
        ["csdf", model, "--source-rows", value],
        ["csdf", model, "--phases", value],
        ["plan", model, "--method", "parts", "--hold", value],
    )
    return commands[(seed // len(JUNK)) % len(commands)]


# --- running a case --------------------------------------------------------------------------

@dataclass
class Outcome:
    """How one case ended: 'ok' (exit 0, outputs verified), 'refused' (exit 2, one line), or a
    failure ('traceback', 'lines', 'status', 'hang', 'signal', 'leftover', 'wrong')."""

    kind: str
    status: int
    detail: str


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_cli(argv: list[str], seconds: float = 60.0) -> tuple[int | None, str, str]:
    """tightfit.cli.main in this process with stdout and stderr captured and an alarm; status
    None on a hang. An exception main lets out is a traceback, as `python -m` would print."""
    from tightfit.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 1
            except _Hang:
                raise
            except BaseException:  # noqa: BLE001 (any exception is a finding)
                traceback.print_exc(file=err)
                status = 1
    except _Hang:
        status = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return status, out.getvalue(), err.getvalue()


def run_subprocess(argv: list[str], seconds: float = 120.0) -> tuple[int | None, str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    try:
        p = subprocess.run([sys.executable, "-m", "tightfit.cli", *argv], capture_output=True, text=True, timeout=seconds, env=env)
    except subprocess.TimeoutExpired:
        return None, "", ""
    return p.returncode, p.stdout, p.stderr


def classify(status: int | None, stdout: str, stderr: str, verified_on_success: bool = True) -> Outcome:
    lines = [l for l in stderr.splitlines() if l.strip()]
    if status is None:
        return Outcome("hang", -1, "no answer within the time limit")
    if status < 0:
        return Outcome("signal", status, f"killed by signal {-status}")
    if "Traceback (most recent call last)" in stderr:
        return Outcome("traceback", status, lines[-1] if lines else "")
    if status == 2:
        # Notes printed before the refusal (a dynamic batch taken as 1) are not part of it.
        notes = [l for l in lines[:-1] if l.startswith("tightfit: ") and not l.startswith("tightfit: error")]
        if len(lines) == len(notes) + 1 and lines[-1].startswith("tightfit: error: "):
            return Outcome("refused", 2, lines[-1])
        if len(lines) == 1 and lines[0].startswith("tightfit: error:") is False and "usage" in stderr:
            return Outcome("refused", 2, lines[0])
        if lines and lines[0].startswith("usage:") and lines[-1].startswith("tightfit"):  # argparse's own
            return Outcome("refused", 2, lines[-1])
        return Outcome("lines", 2, " | ".join(lines[:4]))
    if status == 0:
        if verified_on_success and '"ok": false' in stdout.replace(" ", "").replace('"ok":false', '"ok": false'):
            return Outcome("wrong", 0, "outputs differ")
        return Outcome("ok", 0, "")
    if status == 1 and '"ok": false' in stdout:
        return Outcome("wrong", 1, "outputs differ from the reference")
    return Outcome("status", status, " | ".join(lines[-2:]))


def leftovers(folder: Path, expected: set[str]) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in expected)


@dataclass
class Tally:
    """Counts per class of input and outcome; failures with their reproduction key."""

    counts: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)

    def add(self, klass: str, key: str, outcome: Outcome) -> None:
        per = self.counts.setdefault(klass, {})
        per[outcome.kind] = per.get(outcome.kind, 0) + 1
        if outcome.kind not in ("ok", "refused"):
            self.failures.append((klass, key, outcome.kind, outcome.detail))

    def total(self) -> int:
        return sum(sum(v.values()) for v in self.counts.values())

    def table(self) -> str:
        rows = [f"{'class':<16} {'cases':>6}  outcomes"]
        for klass, per in sorted(self.counts.items()):
            rows.append(f"{klass:<16} {sum(per.values()):>6}  " + ", ".join(f"{k} {v}" for k, v in sorted(per.items())))
        rows.append(f"{'total':<16} {self.total():>6}  failures {len(self.failures)}")
        return "\n".join(rows)


# --- the campaigns ---------------------------------------------------------------------------

def model_case(seed: int, folder: Path) -> Outcome:
    """An edited model: `run --verify` (against onnxruntime); if it imports, every third case
    also `plan --out` and `run PLAN --verify` (the arena executor against the reference)."""
    data, _ = mutated_model(seed)
    path = folder / "model.onnx"
    path.write_bytes(data)
    outcome = classify(*run_cli(["run", str(path), "--verify", "--json"]))
    expected = {"model.onnx"}
    if outcome.kind == "ok" and seed % 3 == 0:
        plan = folder / "plan.json"
        method = random.Random(seed).choice((["--method", "reuse"], ["--method", "parts"], ["--method", "naive"],
                                             ["--method", "parts", "--rows", "2"], ["--order", "memory"]))
        outcome = classify(*run_cli(["plan", str(path), *method, "--out", str(plan), "--json"]))
        if outcome.kind == "ok":
            expected.add("plan.json")
            outcome = classify(*run_cli(["run", str(plan), "--verify", "--json"]))
    extra = leftovers(folder, expected)
    return Outcome("leftover", outcome.status, ", ".join(extra)) if extra and outcome.kind in ("ok", "refused") else outcome


def valid_plan(folder: Path, seed: int = 1) -> tuple[Path, str]:
    """A small model that imports and its plan (text), for the plan mutator."""
    r = random.Random(seed)
    while True:
        m = random_model(r)
        if len(m.graph.node) >= 3:
            break
    model = folder / "base.onnx"
    model.write_bytes(m.SerializeToString())
    out = folder / "base.json"
    # The first command imports torch, onnx and onnxruntime and may build our kernels: no hang limit to speak of.
    status, _, err = run_cli(["plan", str(model), "--method", "parts", "--rows", "2", "--out", str(out)], seconds=600.0)
    run_cli(["run", str(model), "--verify"], seconds=600.0)
    if status != 0:
        raise RuntimeError(f"the base plan could not be made: {err}")
    return model, out.read_text()


def plan_case(seed: int, base_text: str, folder: Path) -> Outcome:
    path = folder / "plan.json"
    path.write_bytes(mutated_plan_text(base_text, seed))
    outcome = classify(*run_cli(["run", str(path), "--verify", "--json"]))
    extra = leftovers(folder, {"plan.json"})
    return Outcome("leftover", outcome.status, ", ".join(extra)) if extra and outcome.kind in ("ok", "refused") else outcome


def app_case(seed: int, models: list[str], folder: Path, layers: int = 3) -> Outcome:
    r = random.Random(seed)
    text, ext = app_texts(models[: r.randint(1, len(models))], seed, layers)
    path = folder / f"app{ext}"
    path.write_bytes(text)
    outcome = classify(*run_cli(["plan", str(path), "--json"]))
    extra = leftovers(folder, {path.name})
    return Outcome("leftover", outcome.status, ", ".join(extra)) if extra and outcome.kind in ("ok", "refused") else outcome


def cli_case(seed: int, model: str, folder: Path) -> Outcome:
    argv = cli_values(model, seed)
    # A budget that parses starts a search (cost profiling of new step shapes is not bounded by
    # --time-limit): a long limit, as a hang is a case that never answers.
    status, out, err = run_cli(argv + ["--json"] if argv[0] != "csdf" else argv, seconds=120.0)
    outcome = classify(status, out, err, verified_on_success=False)
    extra = leftovers(folder, set())
    return Outcome("leftover", outcome.status, ", ".join(extra)) if extra and outcome.kind in ("ok", "refused") else outcome


def children() -> list[int]:
    """Ids of this process's live child processes (from /proc)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def campaign(n_models: int, n_plans: int, n_apps: int, n_cli: int, folder: Path, seed0: int = 0,
             say: Callable[[str], None] = lambda s: None) -> Tally:
    """Run the four kinds of case, each in a fresh folder under `folder` with the temporary
    folder pointed into it; seeds seed0, seed0+1, ... After each case, nothing may be left in
    the case folder or the temporary folder, and no child process alive."""
    import tempfile

    tally = Tally()
    base = folder / "base"
    base.mkdir()
    tmp = folder / "tmp"
    tmp.mkdir()
    before_children = set(children())
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    try:
        _run_kinds(tally, n_models, n_plans, n_apps, n_cli, folder, base, tmp, before_children, seed0, say)
    finally:
        tempfile.tempdir = saved_tempdir
    return tally


def _run_kinds(tally: Tally, n_models: int, n_plans: int, n_apps: int, n_cli: int, folder: Path, base: Path, tmp: Path,
               before_children: set[int], seed0: int, say: Callable[[str], None]) -> None:
    model, plan_text = valid_plan(base)
    import tightfit

    layers = len(tightfit.load(str(model)).layers)
    other = base / "other.onnx"
    other.write_bytes(random_model(random.Random(7)).SerializeToString())
    kinds = [("model", n_models, lambda s, f: model_case(s, f)),
             ("plan file", n_plans, lambda s, f: plan_case(s, plan_text, f)),
             ("application", n_apps, lambda s, f: app_case(s, [str(model), str(other)], f, layers)),
             ("option value", n_cli, lambda s, f: cli_case(s, str(model), f))]
    for klass, n, case in kinds:
        for i in range(n):
            seed = seed0 + i
            case_dir = folder / f"{klass.replace(' ', '_')}-{seed}"
            case_dir.mkdir()
            outcome = case(seed, case_dir)
            stray = [p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor")]  # torch's own cache
            if stray and outcome.kind in ("ok", "refused"):
                outcome = Outcome("leftover", outcome.status, "in the temporary folder: " + ", ".join(stray))
            alive = set(children()) - before_children
            if alive and outcome.kind in ("ok", "refused"):
                outcome = Outcome("process", outcome.status, f"child processes left: {sorted(alive)}")
            tally.add(klass, f"{klass}:{seed}", outcome)
            if outcome.kind not in ("ok", "refused"):
                say(f"{klass} seed {seed}: {outcome.kind}: {outcome.detail}")
            if tally.total() % 250 == 0:  # a long run reports as it goes, so a cut-off one has counts
                say(f"{tally.total()} cases, {len(tally.failures)} failures, last {klass} seed {seed}")
            for p in (*case_dir.iterdir(), *tmp.iterdir()):
                p.unlink() if p.is_file() else shutil.rmtree(p, ignore_errors=True)
