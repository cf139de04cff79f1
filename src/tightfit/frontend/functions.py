"""Activations that exporters spell as several elementwise nodes, recognised by their values.

A group of elementwise nodes computing a function of one tensor x runs on sample points; if
its values are an activation's (to float32 rounding), the group is that activation. Node order,
constants written as x / c or x * (1 / c), x ** 3 or x * x * x: all give the same values.

The group's own nodes run in onnx's reference evaluator (not our kernels: what is checked here
is what the file says, and the import needs no kernel library and no PyTorch)."""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

# Sample points: dense where the functions bend, and far out where they saturate.
SAMPLES = np.concatenate([np.linspace(-8.0, 8.0, 321), [-40.0, -20.0, -12.0, 12.0, 20.0, 40.0]]).reshape(1, 1, 1, -1)
RTOL, ATOL = 1e-5, 1e-5

_erf = np.vectorize(math.erf)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


# The activations' definitions, in float64.
KNOWN: dict[tuple, Callable[[np.ndarray], np.ndarray]] = {
    ("silu",): lambda x: x * _sigmoid(x),
    ("hardswish",): lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    ("gelu",): lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    ("gelu_tanh",): lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    ("mish",): lambda x: x * np.tanh(_softplus(x)),
    ("softplus",): _softplus,
    ("hardsigmoid", 1 / 6, 0.5): lambda x: np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    ("sigmoid",): _sigmoid,
}


def recognise(nodes: Sequence[onnx.NodeProto], x: str, resolve: Callable[[str], str],
              consts: Mapping[str, np.ndarray], opset: int) -> tuple | None:
    """The activation that `nodes` (in order, the last one's output the result) compute from
    tensor x, or None. A node input is x where `resolve` maps it to x, a constant where
    `consts` holds it, or an output of an earlier node of the group; anything else: None."""
    made = {t for n in nodes for t in n.output}
    feeds: dict[str, np.ndarray] = {}
    for t in dict.fromkeys(t for n in nodes for t in n.input if t and t not in made):
        if resolve(t) == x:
            feeds[t] = SAMPLES.astype(np.float32)
        elif t in consts or resolve(t) in consts:
            feeds[t] = np.asarray(consts[t] if t in consts else consts[resolve(t)])
        else:
            return None
    y = _evaluate(nodes, feeds, opset)
    if y is None or y.shape != SAMPLES.shape:
        return None
    for kind, fn in KNOWN.items():
        if np.allclose(y, fn(SAMPLES).astype(np.float32), rtol=RTOL, atol=ATOL):
            return kind
    return None


def _evaluate(nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], opset: int) -> np.ndarray | None:
    from onnx.reference import ReferenceEvaluator

    out = nodes[-1].output[0]
    graph = onnx.helper.make_graph(list(nodes), "group", [onnx.helper.make_empty_tensor_value_info(t) for t in feeds],
                                   [onnx.helper.make_empty_tensor_value_info(out)])
    try:
        with np.errstate(all="ignore"):  # far samples overflow exp() on their way to saturating
            y = ReferenceEvaluator(graph, opsets={"": opset}).run([out], dict(feeds))[0]
    except Exception:  # a node the evaluator rejects is not a known activation
        return None
    return np.asarray(y, dtype=np.float32) if np.issubdtype(np.asarray(y).dtype, np.floating) else None
