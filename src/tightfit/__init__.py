"""tightfit: make CNN inference fit a memory budget without touching weights or accuracy.

The API the CLI itself uses:

    g = tightfit.load("resnet18")               # zoo name, .onnx path, or "pkg.mod:factory"
    report = tightfit.inspect(g, dtype="fp32")  # per-layer and total memory accounting
    outs = tightfit.run(g, x)                   # reference executor, layer by layer

Names and submodules (tightfit.api, ...) load on first use, so that `import tightfit.cli`
loads no compiled library: the CLI installs its signal handlers first, and an interrupt while
they load (a second or more) is then a clean exit, not a traceback. PyTorch is an optional
extra (`pip install 'tightfit[torch]'`), imported only by tightfit.frontend.torch_import, for
nn.Modules and the zoo's torchvision models.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any

__all__ = ["Graph", "Layer", "Tensor", "inspect", "load", "run"]
__version__ = "0.1.0"

_HOME = {"inspect": "tightfit.api", "load": "tightfit.api", "run": "tightfit.api",
         "Graph": "tightfit.graph.ir", "Layer": "tightfit.graph.ir", "Tensor": "tightfit.graph.ir"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: tightfit.api
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
