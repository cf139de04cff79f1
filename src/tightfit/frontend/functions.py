"""Activations that exporters spell as several elementwise nodes, recognised by their values.

A group of elementwise layers computing a function of one tensor x runs on sample points; if
its values are an activation's (to float32 rounding), the group is that activation. Node order,
constants written as x / c or x * (1 / c), x ** 3 or x * x * x: all give the same values."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from tightfit.graph.ir import Layer

# Sample points: dense where the functions bend, and far out where they saturate.
SAMPLES = torch.cat([torch.linspace(-8.0, 8.0, 321), torch.tensor([-40.0, -20.0, -12.0, 12.0, 20.0, 40.0])]).view(1, 1, 1, -1)
RTOL, ATOL = 1e-5, 1e-5

KNOWN: dict[tuple, Callable[[torch.Tensor], torch.Tensor]] = {
    ("silu",): F.silu,
    ("hardswish",): F.hardswish,
    ("gelu",): F.gelu,
    ("gelu_tanh",): lambda x: F.gelu(x, approximate="tanh"),
    ("mish",): F.mish,
    ("softplus",): F.softplus,
    ("hardsigmoid", 1 / 6, 0.5): F.hardsigmoid,
    ("sigmoid",): torch.sigmoid,
}


def recognise(group: Sequence[Any], x: str, freeze: Callable[[Any], Layer]) -> tuple | None:
    """The activation the layers of `group` (protos in order, each reading x or an earlier
    member's output) compute from tensor x, or None. `freeze` makes a proto a Layer."""
    from tightfit.ops import get_op, run_layer

    values = {x: SAMPLES.clone()}
    with torch.no_grad():
        for m in group:
            layer = freeze(m)
            op = get_op(layer.op)
            params = op.prepare_params(layer, [np.asarray(a, dtype=np.float32) for a in m.params])
            out = torch.empty(SAMPLES.shape)
            try:
                run_layer(layer, [values[t] for t in layer.inputs], params, out)
            except (RuntimeError, ValueError, KeyError):
                return None
            values[layer.output] = out
        y = values[group[-1].output]
        for kind, fn in KNOWN.items():
            if torch.allclose(y, fn(SAMPLES), rtol=RTOL, atol=ATOL):
                return kind
    return None
