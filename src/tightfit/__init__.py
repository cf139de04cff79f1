"""tightfit: make CNN inference fit a memory budget without touching weights or accuracy.

The API the CLI itself uses:

    g = tightfit.load("resnet18")               # zoo name, .onnx path, or "pkg.mod:factory"
    report = tightfit.inspect(g, dtype="fp32")  # per-layer and total memory accounting
    outs = tightfit.run(g, x)                   # reference executor, layer by layer
"""
from tightfit.api import inspect, load, run
from tightfit.graph.ir import Graph, Layer, Tensor

__all__ = ["Graph", "Layer", "Tensor", "inspect", "load", "run"]
__version__ = "0.1.0"
