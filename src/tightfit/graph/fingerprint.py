"""A graph's fingerprint: what a plan made for it depends on, so a plan is never run on another
model (plan/schema.ModelRef keeps it) and caches keyed by a model stay apart."""
from __future__ import annotations

import hashlib

from tightfit.graph.ir import Graph


def fingerprint(graph: Graph) -> str:
    """A hash of what a plan depends on: layers, ops, attrs, tensor shapes (not weights)."""
    h = hashlib.sha256()
    for layer in graph.layers:
        attrs = {k: v for k, v in layer.attrs.items() if not k.startswith("_")}
        h.update(repr((layer.id, layer.op, layer.inputs, layer.output, sorted(attrs.items()),
                       [graph.params[p].shape for p in layer.params])).encode())
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        # A float tensor hashes as before (plans made before quantized tensors existed still load).
        h.update(repr((name, t.shape) if t.dtype == "fp32" else (name, t.shape, t.dtype, t.quant)).encode())
    return h.hexdigest()[:16]
