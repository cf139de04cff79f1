"""Loading a model by what the user names: a zoo name, an .onnx path, 'package.module:factory',
or an nn.Module; the one place that knows these spellings."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from tightfit.errors import InputShapeError, ModelLoadError, OptionError
from tightfit.graph.ir import Graph

if TYPE_CHECKING:
    import torch


def load(model: "str | Path | torch.nn.Module | Graph",
         input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None" = None, nchw_shape: bool = False) -> Graph:
    """A zoo name, an .onnx path, 'package.module:factory', or an nn.Module (with input_shape).
    `input_shape` is in the model input's own layout (NHWC for a file that takes NHWC), or the
    graph's NCHW shape with `nchw_shape`; an ONNX file of several inputs takes {input name: shape}.
    Only the PyTorch spellings need torch (the extra)."""
    from tightfit.frontend import torch_import, zoo

    if isinstance(model, Graph):
        return model
    if torch_import.is_module(model):
        if input_shape is None:
            raise OptionError("a PyTorch module needs an input shape, e.g. (1, 3, 224, 224)")
        return torch_import.from_module(model, input_shape, type(model).__name__)
    spec = str(model)
    if spec in zoo.names():
        name, shape = _one_input(spec, input_shape)
        return _named_right(zoo.load(spec, shape), name)
    if spec.endswith(".tflite"):
        name, shape = _one_input(spec, input_shape)
        return _named_right(_load_tflite(spec, shape, nchw_shape), name)
    if spec.endswith(".onnx") or Path(spec).exists():
        from tightfit.frontend.onnx_import import load_onnx

        return load_onnx(spec, input_shape, nchw_shape=nchw_shape)
    if ":" in spec:
        module = torch_import.load_factory(spec)
        if input_shape is None:
            raise OptionError(f"{spec} is a PyTorch module: give --input-shape, e.g. 1x3x224x224")
        return torch_import.from_module(module, input_shape, spec.partition(":")[2])
    raise ModelLoadError(f"{spec!r} is not a zoo model (see `tightfit zoo`), an .onnx file, or module:factory")


def _one_input(spec: str, input_shape: "Sequence[int] | Mapping[str, Sequence[int]] | None"
               ) -> "tuple[str | None, Sequence[int] | None]":
    """A zoo model or a .tflite here takes one input: its shape alone, or by its name."""
    if not isinstance(input_shape, Mapping):
        return None, input_shape
    if len(input_shape) != 1:
        raise InputShapeError(f"{spec} takes one input; give --input-shape SHAPE")
    return next(iter(input_shape.items()))


def _named_right(graph: Graph, name: str | None) -> Graph:
    """A shape given by name must name the model's input (the ONNX importer checks its own)."""
    if name is not None and name not in graph.inputs:
        raise InputShapeError(f"--input-shape names {name!r}, which is not an input of {graph.name} "
                              f"(its input: {', '.join(graph.inputs)})")
    return graph


def _load_tflite(spec: str, input_shape: "Sequence[int] | None", nchw_shape: bool) -> Graph:
    try:
        from tightfit.frontend.tflite_import import load_tflite
    except ImportError as e:  # the flatbuffer schema package is a dependency; a broken install is one line
        raise ModelLoadError(f"reading {spec} needs the `tflite` package (pip install tflite): {e}") from None
    return load_tflite(spec, input_shape, nchw_shape=nchw_shape)


def load_ref(spec: str, input_shape: "Sequence[int] | Mapping[str, Sequence[int]]", allow_code: bool = False,
             where: str = "the plan") -> Graph:
    """A model as a plan names it: a zoo model at its default input shape is loaded by name alone.
    A file carries data, not code: `module:factory` only with `allow_code` (see `named_in_file`)."""
    from tightfit.frontend import zoo

    named_in_file(spec, where, allow_code)
    default = next((e.input_shape for e in zoo.entries() if e.name == spec), None)
    if isinstance(input_shape, Mapping):  # a model of several inputs: each one's shape by name
        return load(spec, input_shape, nchw_shape=True)
    return load(spec, None if default is not None and tuple(default) == tuple(input_shape) else input_shape, nchw_shape=True)


def names_code(spec: str) -> bool:
    """Whether loading `spec` would import a module and call it (not a zoo name, not a file)."""
    from tightfit.frontend import zoo

    return (":" in spec and spec not in zoo.names() and not spec.endswith((".onnx", ".tflite"))
            and not Path(spec).exists())


def named_in_file(spec: object, where: str, allow_code: bool) -> None:
    """A model named by a file (a plan, an application) is a zoo name or a file path: a file
    that names `module:factory` would make us import and run code of the file's choosing, so it
    is refused unless the user asked for it (--allow-code, allow_code=True)."""
    if not isinstance(spec, str):
        raise ModelLoadError(f"{where} names a model by {type(spec).__name__}, not by a zoo name or file path")
    if names_code(spec) and not allow_code:
        raise ModelLoadError(f"{where} names model {spec!r} by module:factory; a file names models by zoo name or "
                             f"file path (pass --allow-code to import and run {spec.partition(':')[0]!r})")
