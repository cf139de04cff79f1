"""The small public API; the CLI is built on it."""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from tightfit.analysis.memory import ModelMemory, account
from tightfit.errors import ModelLoadError, OptionError
from tightfit.graph.ir import Graph


def load(model: "str | Path | torch.nn.Module | Graph", input_shape: Sequence[int] | None = None) -> Graph:
    """A zoo name, an .onnx path, 'package.module:factory', or an nn.Module (with input_shape)."""
    from tightfit.graph import zoo
    from tightfit.graph.onnx_import import load_onnx
    from tightfit.graph.torch_import import from_module

    if isinstance(model, Graph):
        return model
    if isinstance(model, torch.nn.Module):
        if input_shape is None:
            raise OptionError("a PyTorch module needs an input shape, e.g. (1, 3, 224, 224)")
        return from_module(model, input_shape, type(model).__name__)
    spec = str(model)
    if spec in zoo.names():
        return zoo.load(spec, input_shape)
    if spec.endswith(".onnx") or Path(spec).exists():
        return load_onnx(spec, input_shape)
    if ":" in spec:
        return _load_factory(spec, input_shape)
    raise ModelLoadError(f"{spec!r} is not a zoo model (see `tightfit zoo`), an .onnx file, or module:factory")


def _load_factory(spec: str, input_shape: Sequence[int] | None) -> Graph:
    from tightfit.graph.torch_import import from_module

    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"cannot import {spec!r}: {e}") from None
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"{spec!r} returned {type(module).__name__}, not a torch.nn.Module")
    if input_shape is None:
        raise OptionError(f"{spec} is a PyTorch module: give --input-shape, e.g. 1x3x224x224")
    return from_module(module, input_shape, attr)


def inspect(graph: Graph, dtype: str = "fp32", workspace: str = "torch", batch: int = 1) -> ModelMemory:
    return account(graph, dtype, workspace, batch)


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, torch.Tensor]
    seconds: float


def run(graph: Graph, x: torch.Tensor | None = None, keep: Sequence[str] = ()) -> RunResult:
    """Run the reference executor once on `x` (a seeded random input if None)."""
    from tightfit.runtime.reference import random_input, run_reference

    x = random_input(graph) if x is None else x
    t0 = time.perf_counter()
    outs = run_reference(graph, x, keep)
    return RunResult(outs, time.perf_counter() - t0)
