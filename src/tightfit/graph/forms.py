"""A graph's inputs and outputs in the model file's own layout.

Inside, every 4-D tensor is NCHW (the ops' and planners' one form). A file that takes or gives
channels-last maps (a .tflite; an ONNX file starting with a Transpose from NHWC) says so in the
graph's `input_forms` / `output_forms`, and every boundary a user sees gives and takes the file's
layout: `run --input/--output`, `--verify`'s comparisons, the exported C program and its check.
These functions are the one place that turns the graph's NCHW arrays into the file's and back."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tightfit.graph.ir import Graph

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def input_form(graph: Graph, name: str) -> str:
    """"nhwc", "reshape" (the file's CHW or flat input, the same elements in the same order) or "nchw"."""
    return next((form for t, form, _ in graph.input_forms if t == name), "nchw")


def output_form(graph: Graph, name: str) -> str:
    """"nhwc" for a 4-D output the file gives channels-last, else "nchw"."""
    return next((form for t, form, _ in graph.output_forms if t == name), "nchw")


def nhwc_input(graph: Graph, name: str) -> bool:
    return input_form(graph, name) == "nhwc"


def nhwc_output(graph: Graph, name: str) -> bool:
    return output_form(graph, name) == "nhwc"


def nhwc_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """An NCHW shape as the channels-last one."""
    n, c, h, w = shape
    return (n, h, w, c)


def file_input(graph: Graph, name: str, x: np.ndarray) -> np.ndarray:
    """The graph's NCHW input array as the file takes it (channels-last where it does; the CHW or
    flat shape of a "reshape" input is the same bytes, so its NCHW array is left as it is)."""
    x = np.asarray(x)
    return np.ascontiguousarray(x.transpose(TO_NHWC)) if nhwc_input(graph, name) and x.ndim == 4 else x


def graph_input(graph: Graph, name: str, x: np.ndarray) -> np.ndarray:
    """An input in the file's layout as the graph's NCHW array."""
    x = np.asarray(x)
    return np.ascontiguousarray(x.transpose(TO_NCHW)) if nhwc_input(graph, name) and x.ndim == 4 else x


def file_output(graph: Graph, name: str, y: np.ndarray) -> np.ndarray:
    """The graph's NCHW output array as the file gives it."""
    y = np.asarray(y)
    return np.ascontiguousarray(y.transpose(TO_NHWC)) if nhwc_output(graph, name) and y.ndim == 4 else y


def file_outputs(graph: Graph, outputs: "dict[str, np.ndarray]") -> dict[str, np.ndarray]:
    """Every output by name, each as the file gives it."""
    return {k: file_output(graph, k, v) for k, v in outputs.items()}


def file_shape(graph: Graph, name: str, shape: Sequence[int]) -> tuple[int, ...]:
    """An input's or output's NCHW `shape` (any batch) as the file holds it."""
    nhwc = nhwc_input(graph, name) if name in graph.inputs else nhwc_output(graph, name)
    return nhwc_shape(shape) if nhwc and len(shape) == 4 else tuple(shape)
