"""Our own C depthwise kernel (ops/native.py): equal to torch's convolution and clamp on the
views the executor hands it; taken by small depthwise steps only; off when asked."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tightfit
from tightfit.ops import conv, get_op, native
from tightfit.ops.base import Region

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: convolutions run on oneDNN alone")


def _nhwc(n: int, c: int, h: int, w: int) -> torch.Tensor:
    return torch.randn(n, h, w, c).permute(0, 3, 1, 2)


@pytest.mark.parametrize("c,h,w,kernel,stride,pad,clamp", [
    (96, 19, 19, (3, 3), (2, 2), (0, 0), (0.0, 6.0)),
    (144, 10, 10, (3, 3), (1, 1), (1, 1), (0.0, math.inf)),
    (32, 3, 114, (3, 3), (1, 1), (0, 1), conv.NO_CLAMP),
    (24, 9, 7, (5, 5), (2, 1), (2, 2), (-0.5, 0.5)),
    (7, 4, 4, (3, 3), (2, 2), (1, 1), (0.0, 6.0)),
    (16, 1, 5, (1, 3), (1, 1), (0, 1), conv.NO_CLAMP),
])
def test_depthwise_equals_torch(c, h, w, kernel, stride, pad, clamp):
    """Batch of two, input a window of a wider channels-last buffer (row and sample strides not
    the view's own), output a view into a larger buffer: equal to F.conv2d then clamp, and
    nothing outside the output view written."""
    big = _nhwc(2, c, h + 3, w + 5)
    x = big[:, :, 1 : 1 + h, 2 : 2 + w]
    wt, b = torch.randn(c, 1, *kernel), torch.randn(c)
    expected = F.conv2d(x, wt, b, stride, pad, 1, c).clamp(*clamp)
    oh, ow = expected.shape[2:]
    out = torch.full((2, oh + 2, ow + 1, c), float("nan")).permute(0, 3, 1, 2)
    y = out[:, :, 1 : 1 + oh, : ow]
    taps = wt.reshape(c, -1).t().contiguous()
    native.depthwise_call(x, y, taps, b, kernel, stride, pad, clamp)()
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert out[:, :, 0].isnan().all() and out[:, :, 1 + oh :].isnan().all() and out[:, :, :, ow:].isnan().all()


def test_nan_passes_the_clamp_as_in_torch():
    x = _nhwc(1, 8, 3, 3)
    x[0, 2, 1, 1] = float("nan")
    y = torch.empty(1, 1, 1, 8).permute(0, 3, 1, 2)
    wt, b = torch.randn(8, 1, 3, 3), torch.zeros(8)
    native.depthwise_call(x, y, wt.reshape(8, -1).t().contiguous(), b, (3, 3), (1, 1), (0, 0), (0.0, 6.0))()
    expected = F.conv2d(x, wt, b, groups=8).clamp(0.0, 6.0)
    assert y[0, 2].isnan().all() and torch.equal(y.isnan(), expected.isnan())
    assert torch.allclose(y.nan_to_num(), expected.nan_to_num(), atol=1e-5)


def test_small_depthwise_bands_take_our_kernel(monkeypatch):
    """A one-row band of a mobilenet_v2 depthwise layer binds our kernel with its ReLU6 fused (no
    activation call after it); the whole layer, above DEPTHWISE_MACS, stays oneDNN's. Both equal
    the convolution and its activation."""
    bound, activated = [], []
    monkeypatch.setattr(native, "depthwise_call", lambda *a: bound.append(_depthwise_call(*a)) or bound[-1])
    monkeypatch.setattr(conv, "apply_activations", lambda t, act: activated.append(act) or _apply(t, act))
    g = tightfit.load("mobilenet_v2")
    layer = next(l for l in g.layers if l.op == "conv" and l.attrs["groups"] > 1
                 and g.shape(l.output)[2] * g.shape(l.output)[3] * g.shape(l.output)[1] * 9 > conv.DEPTHWISE_MACS)
    assert conv.clamp_bounds(layer.attrs["act"]) == (0.0, 6.0)
    op = get_op(layer.op)
    (_, c, h, w), (_, _, oh, ow) = g.shape(layer.inputs[0]), g.shape(layer.output)
    params = op.prepare_params(layer, [g.params[p] for p in layer.params])
    x = _nhwc(1, c, h, w)
    y = torch.full((1, oh, ow, c), float("nan")).permute(0, 3, 1, 2)
    expected = F.conv2d(x, params[0], params[1], layer.attrs["stride"], layer.attrs["pads"][:2], 1, c).clamp(0.0, 6.0)
    for band, ours in ((Region(0, 1, oh // 2, oh // 2 + 1, 0, ow), True), (Region(0, 1, 0, oh, 0, ow), False)):
        bound.clear(), activated.clear()
        (win,) = op.input_windows(layer, band, [(1, c, h, w)])
        xv, yv = x[:, :, win.region.h0 : win.region.h1], y[:, :, band.h0 : band.h1]
        op.compute(layer, [xv], [win], yv, band, params)
        assert (len(bound) == 1 and bound[0] is not None) == ours
        assert any(activated) != ours  # the clamp fused into our kernel, applied after oneDNN's
        assert torch.allclose(yv, expected[:, :, band.h0 : band.h1], rtol=1e-4, atol=1e-5)


_depthwise_call, _apply = native.depthwise_call, conv.apply_activations


def test_off_when_asked(monkeypatch):
    monkeypatch.setenv("TIGHTFIT_NATIVE", "0")
    x, y = _nhwc(1, 4, 3, 3), torch.empty(1, 1, 1, 4).permute(0, 3, 1, 2)
    assert native.depthwise_call(x, y, torch.ones(9, 4), torch.zeros(4), (3, 3), (1, 1), (0, 0), conv.NO_CLAMP) is None
