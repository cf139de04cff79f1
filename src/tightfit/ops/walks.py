"""How each kernel walks its output and its inputs: the one table of which overlaps of a step's
output with its own inputs (issue 40 point 4: in-place and overlapping buffers) the kernels
make safe. The plan checker (plan/check.py) proves a step's overlap by one of the walks its
layer's kernel has; the overlay planner (plan/overlay.py) places outputs over inputs by the
"rows" walk.

A walk is a promise about the order of a kernel's reads and writes, on one thread:
- "same": every output element is written after the same element of each input is read (the
  output exactly over an input: the same coordinates, the same bytes).
- "elements": positions (n, h, w) of the output in increasing order for any one channel, each
  position's input elements read before the output's element of that channel is written.
  Proven for an input of the output's channels and element size lying whole positions before
  (or exactly at) the output's: output position p then lands on input positions <= p.
- "rows": output rows in increasing order (per sample), and every read of the input window of
  output row r done before anything is written to a row after r. Then output row r may lie on
  input rows that no row >= r reads; the positions and channels within a row may go in any
  order (a row's writes may also come before its own reads: the checker assumes they do).

Kernels (kernels/tf_kernels.c) and their walks:
- fp32 depthwise conv (v_depthwise: row by row, 16 channels at a time along the row;
  conv_depthwise: pixel by pixel, the bias written first): "rows".
- fp32 dense conv (v_dense): passes over panels of output channels, each over every pixel, so
  a later pass reads input rows above rows already written: none. Grouped conv: none.
- int8 conv of any groups (qconv: where its output shares bytes with its input, row by row, every
  block of output channels of a row before the next row's, each pixel's window read before its
  output is written; otherwise in the order fastest for the cache): "rows".
- fp32 elementwise and batch norm / bare activations (eltwise, affine: position by position in
  row order, channels inside) of 4-D tensors: "same", "elements", "rows"; of other ranks (their
  dims merged into the kernel's views otherwise): "same".
- int8 add (qadd: channel by channel, each over every position): "same", "elements"; not
  "rows" (a later channel reads rows below rows an earlier channel wrote).
- int8 activation (qcopy: a copy, then a clamp over the output): "same".
- attention's softmax and layer norm (statistics first, then each element): "same".
Threads split a fp32 conv step's output rows between them; `shared_step` in tf_kernels.c runs a
step whose input and output views share bytes on one thread, so these walks hold.
"""
from __future__ import annotations

from tightfit.graph.ir import Graph, Layer
from tightfit.ops.quant import quantized
from tightfit.ops.registry import get_op

SAME, ELEMENTS, ROWS = "same", "elements", "rows"
NONE: frozenset[str] = frozenset()
_ELEMENTWISE = frozenset({SAME, ELEMENTS, ROWS})


def kernel_walks(graph: Graph, layer: Layer) -> frozenset[str]:
    """The walks the kernel running `layer` keeps (see the module's table)."""
    q = quantized(layer)
    if layer.op == "conv":
        groups = layer.attrs["groups"]
        depthwise = 1 < groups == layer.attrs["out_channels"] == graph.shape(layer.inputs[0])[1]
        return frozenset({ROWS}) if q or depthwise else NONE
    if layer.op == "add" and q:
        return frozenset({SAME, ELEMENTS})
    if not get_op(layer.op).inplace_ok:
        return NONE
    if q or len(graph.shape(layer.output)) != 4:  # (a rank-5 operand's dims are merged into other views)
        return frozenset({SAME})
    if layer.op in ("add", "mul", "eltwise", "activation", "batchnorm"):
        return _ELEMENTWISE
    return frozenset({SAME})
