"""Loading a model by what the user names: a zoo name, an .onnx path, 'package.module:factory',
or an nn.Module; the one place that knows these spellings."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

import torch

from tightfit.errors import ModelLoadError, OptionError
from tightfit.graph.ir import Graph


def load(model: "str | Path | torch.nn.Module | Graph", input_shape: Sequence[int] | None = None,
         nchw_shape: bool = False) -> Graph:
    """A zoo name, an .onnx path, 'package.module:factory', or an nn.Module (with input_shape).
    `input_shape` is in the model input's own layout (NHWC for a file that takes NHWC), or the
    graph's NCHW shape with `nchw_shape`."""
    from tightfit.frontend import zoo
    from tightfit.frontend.onnx_import import load_onnx
    from tightfit.frontend.torch_import import from_module

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
        return load_onnx(spec, input_shape, nchw_shape=nchw_shape)
    if ":" in spec:
        return _load_factory(spec, input_shape)
    raise ModelLoadError(f"{spec!r} is not a zoo model (see `tightfit zoo`), an .onnx file, or module:factory")


def _load_factory(spec: str, input_shape: Sequence[int] | None) -> Graph:
    from tightfit.frontend.torch_import import from_module

    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ModelLoadError(f"cannot import {spec!r}: {e}") from None
    except Exception as e:  # the module's own code failed as it was imported: the user's code, not ours
        raise ModelLoadError(f"importing {mod_name!r} for {spec!r} raised {_first_line(e)}") from None
    try:
        module = factory()
    except Exception as e:  # the user's factory failed
        raise ModelLoadError(f"factory {spec!r} raised {_first_line(e)}") from None
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"{spec!r} returned {type(module).__name__}, not a torch.nn.Module")
    if input_shape is None:
        raise OptionError(f"{spec} is a PyTorch module: give --input-shape, e.g. 1x3x224x224")
    return from_module(module, input_shape, attr)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def load_ref(spec: str, input_shape: Sequence[int], allow_code: bool = False, where: str = "the plan") -> Graph:
    """A model as a plan names it: a zoo model at its default input shape is loaded by name alone.
    A file carries data, not code: `module:factory` only with `allow_code` (see `named_in_file`)."""
    from tightfit.frontend import zoo

    named_in_file(spec, where, allow_code)
    default = next((e.input_shape for e in zoo.entries() if e.name == spec), None)
    return load(spec, None if default is not None and tuple(default) == tuple(input_shape) else input_shape, nchw_shape=True)


def names_code(spec: str) -> bool:
    """Whether loading `spec` would import a module and call it (not a zoo name, not a file)."""
    from tightfit.frontend import zoo

    return ":" in spec and spec not in zoo.names() and not spec.endswith(".onnx") and not Path(spec).exists()


def named_in_file(spec: object, where: str, allow_code: bool) -> None:
    """A model named by a file (a plan, an application) is a zoo name or a file path: a file
    that names `module:factory` would make us import and run code of the file's choosing, so it
    is refused unless the user asked for it (--allow-code, allow_code=True)."""
    if not isinstance(spec, str):
        raise ModelLoadError(f"{where} names a model by {type(spec).__name__}, not by a zoo name or file path")
    if names_code(spec) and not allow_code:
        raise ModelLoadError(f"{where} names model {spec!r} by module:factory; a file names models by zoo name or "
                             f"file path (pass --allow-code to import and run {spec.partition(':')[0]!r})")
