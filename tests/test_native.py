"""Our own C convolution kernels (ops/native.py): equal to torch's convolution and clamp on the
views the executor hands them; taken by small steps only; off when asked."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tightfit
from tightfit.ops import conv, get_op, native
from tightfit.ops.base import InputWindow, Region

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: convolutions run on oneDNN alone")
_conv_call, _apply = native.conv_call, conv.apply_activations  # the originals, wrapped by a test to count calls


def _nhwc(n: int, c: int, h: int, w: int) -> torch.Tensor:
    return torch.randn(n, h, w, c).permute(0, 3, 1, 2)


@pytest.mark.parametrize("cin,c,groups,h,w,kernel,stride,pad,clamp", [
    (96, 96, 96, 19, 19, (3, 3), (2, 2), (0, 0), (0.0, 6.0)),
    (144, 144, 144, 10, 10, (3, 3), (1, 1), (1, 1), (0.0, math.inf)),
    (32, 32, 32, 3, 114, (3, 3), (1, 1), (0, 1), conv.NO_CLAMP),
    (24, 24, 24, 9, 7, (5, 5), (2, 1), (2, 2), (-0.5, 0.5)),
    (7, 7, 7, 4, 4, (3, 3), (2, 2), (1, 1), (0.0, 6.0)),
    (16, 16, 16, 1, 5, (1, 3), (1, 1), (0, 1), conv.NO_CLAMP),
    (3, 32, 1, 7, 17, (3, 3), (2, 2), (1, 1), (0.0, 6.0)),  # dense: a whole block of 16 and one more
    (5, 37, 1, 6, 5, (3, 2), (1, 2), (1, 0), conv.NO_CLAMP),  # dense: a remainder of 5 output channels
    (2, 8, 1, 4, 4, (5, 5), (1, 1), (2, 2), (0.0, math.inf)),  # dense: fewer output channels than a block
    (8, 40, 1, 3, 4, (1, 1), (1, 1), (1, 2), (0.0, 6.0)),  # dense 1x1: border pixels read only padding
    (16, 96, 1, 4, 9, (1, 1), (1, 1), (0, 0), conv.NO_CLAMP),  # dense 1x1: three panels, blocks of pixels across rows
])
def test_kernels_equal_torch(cin, c, groups, h, w, kernel, stride, pad, clamp):
    """Batch of two, input a window of a wider channels-last buffer (row and sample strides not
    the view's own), output a view into a larger buffer: equal to F.conv2d then clamp, and
    nothing outside the output view written."""
    big = _nhwc(2, cin, h + 3, w + 5)
    x = big[:, :, 1 : 1 + h, 2 : 2 + w]
    wt, b = torch.randn(c, cin // groups, *kernel), torch.randn(c)
    expected = F.conv2d(x, wt, b, stride, pad, 1, groups).clamp(*clamp)
    oh, ow = expected.shape[2:]
    out = torch.full((2, oh + 2, ow + 1, c), float("nan")).permute(0, 3, 1, 2)
    y = out[:, :, 1 : 1 + oh, : ow]
    packs = conv.PackedWeights(wt, {})
    w, bias = packs.panels(b)[0] if groups == 1 else (packs.as_taps(), b)
    native.conv_call("dense" if groups == 1 else "depthwise", x, y, w, bias, kernel, stride, pad, clamp)()
    assert torch.allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert out[:, :, 0].isnan().all() and out[:, :, 1 + oh :].isnan().all() and out[:, :, :, ow:].isnan().all()


def test_nan_passes_the_clamp_as_in_torch():
    x = _nhwc(1, 8, 3, 3)
    x[0, 2, 1, 1] = float("nan")
    y = torch.empty(1, 1, 1, 8).permute(0, 3, 1, 2)
    wt, b = torch.randn(8, 1, 3, 3), torch.zeros(8)
    native.conv_call("depthwise", x, y, conv.PackedWeights(wt, {}).as_taps(), b, (3, 3), (1, 1), (0, 0), (0.0, 6.0))()
    expected = F.conv2d(x, wt, b, groups=8).clamp(0.0, 6.0)
    assert y[0, 2].isnan().all() and torch.equal(y.isnan(), expected.isnan())
    assert torch.allclose(y.nan_to_num(), expected.nan_to_num(), atol=1e-5)


@pytest.fixture
def threads():
    """Sets torch's thread count for the test (our dense kernel takes whole layers on one thread)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("kind,n_threads,whole_ours", [("depthwise", 2, False), ("dense", 2, False), ("depthwise", 1, True), ("dense", 1, True)])
def test_small_bands_take_our_kernels(monkeypatch, threads, kind, n_threads, whole_ours):
    """A one-row band of mobilenet_v2's first depthwise layer, or of its first (3x3, groups 1)
    layer, binds our kernel with its ReLU6 fused (no activation call after it). The whole layer,
    above DEPTHWISE_MACS or DENSE_MACS, stays oneDNN's on two threads (oneDNN splits a layer over
    them) and takes ours on one. All equal the convolution and its activation."""
    threads(n_threads)
    bound, activated = [], []
    monkeypatch.setattr(native, "conv_call", lambda *a: bound.append(_conv_call(*a)) or bound[-1])
    monkeypatch.setattr(conv, "apply_activations", lambda t, act: activated.append(act) or _apply(t, act))
    g = tightfit.load("mobilenet_v2")
    layer = next(l for l in g.layers if l.op == "conv" and (l.attrs["groups"] > 1) == (kind == "depthwise"))
    assert layer.attrs["kernel"] == (3, 3) and conv.clamp_bounds(layer.attrs["act"]) == (0.0, 6.0)
    op = get_op(layer.op)
    (_, cin, h, w), (_, c, oh, ow) = g.shape(layer.inputs[0]), g.shape(layer.output)
    assert oh * ow * c * 9 * (cin if kind == "dense" else 1) > max(conv.DEPTHWISE_MACS, conv.DENSE_MACS)
    params = op.prepare_params(layer, [g.params[p] for p in layer.params])
    x = _nhwc(1, cin, h, w)
    y = torch.full((1, oh, ow, c), float("nan")).permute(0, 3, 1, 2)
    groups = layer.attrs["groups"]
    expected = F.conv2d(x, params[0], params[1], layer.attrs["stride"], layer.attrs["pads"][:2], 1, groups).clamp(0.0, 6.0)
    for band, ours in ((Region(0, 1, oh // 2, oh // 2 + 1, 0, ow), True), (Region(0, 1, 0, oh, 0, ow), whole_ours)):
        bound.clear(), activated.clear()
        (win,) = op.input_windows(layer, band, [(1, cin, h, w)])
        xv, yv = x[:, :, win.region.h0 : win.region.h1], y[:, :, band.h0 : band.h1]
        op.compute(layer, [xv], [win], yv, band, params)
        assert (len(bound) == 1 and bound[0] is not None) == ours
        assert any(activated) != ours  # the clamp fused into our kernel, applied after oneDNN's
        assert torch.allclose(yv, expected[:, :, band.h0 : band.h1], rtol=1e-4, atol=1e-5)


def test_border_tile_one_call_without_a_padded_copy(monkeypatch):
    """A tile at the top-left corner of a strided 3x3 layer (padding above and left, real rows
    below and right: oneDNN needs a zero-padded copy) is one call of our kernel per group, no copy
    made; equal to the convolution. Dense, grouped (a call per group, on channel slices of the
    views; with 6 channels per group, one call over the block-diagonal weight) and depthwise."""
    monkeypatch.setattr(conv, "pad_copy", lambda *a: pytest.fail("padded copy made"))
    for c, groups, calls in ((48, 1, 1), (48, 3, 3), (24, 4, 1), (48, 48, 1)):
        layer = types.SimpleNamespace(attrs={"kernel": (3, 3), "stride": (2, 2), "dilation": (1, 1), "groups": groups,
                                             "pads": (1, 1, 1, 1), "out_channels": c, "act": (("relu",),)})
        op = conv.Conv()
        x = _nhwc(1, c, 16, 16)
        wt, b = torch.randn(c, c // groups, 3, 3), torch.randn(c)
        params = [wt, b, conv.PackedWeights(wt, layer.attrs)]
        expected = F.conv2d(x, wt, b, 2, 1, 1, groups).relu()
        tile = Region(0, 1, 0, 3, 0, 4)
        (win,) = op.input_windows(layer, tile, [(1, c, 16, 16)])
        assert win.pad == (1, 0, 1, 0)
        y = torch.full((1, 3, 4, c), float("nan")).permute(0, 3, 1, 2)
        run = op.bind(layer, [x[:, :, win.region.h0 : win.region.h1, win.region.w0 : win.region.w1]], [win], y, tile, params)
        assert isinstance(run, native.NativeCalls) and len(run.calls) == calls
        run()
        assert torch.allclose(y, expected[:, :, :3, :4], rtol=1e-4, atol=1e-5)


def test_grouped_with_few_channels_per_group_runs_block_diagonal_while_small():
    """Fewer than GROUP_CHANNELS_MIN channels per group: one dense call over the block-diagonal
    weight, whose `groups` times the multiply-adds must stay within the dense size rules."""
    a = {"kernel": (1, 1), "dilation": (1, 1), "groups": 4, "out_channels": 32}
    assert conv.block_diagonal(a, 32) and not conv.block_diagonal(dict(a, out_channels=64), 64)
    assert conv.native_applies(a, 32, 1000) == "dense"
    assert conv.native_applies(a, 32, conv.DENSE_MACS // 2, any_threads=True) is None  # 4x: past DENSE_MACS
    assert conv.native_applies(dict(a, out_channels=64), 64, conv.DENSE_MACS // 2, any_threads=True) == "dense"


def test_channel_shuffle_equals_torch():
    """The shuffle between strided channels-last views equals the reshape-transpose-reshape;
    nothing outside the output written; channels that are not unit-stride stay on torch."""
    x = _nhwc(2, 24, 9, 11)[:, :, 1:6, 2:9]
    out = torch.full((2, 7, 10, 24), float("nan")).permute(0, 3, 1, 2)
    y = out[:, :, 1:6, 3:10]
    native.shuffle_call(y, x, 4)()
    assert torch.equal(y, x.reshape(2, 4, 6, 5, 7).transpose(1, 2).reshape(2, 24, 5, 7))
    assert out[:, :, 0].isnan().all() and out[:, :, :, :3].isnan().all()
    assert native.shuffle_call(y, torch.randn(2, 24, 5, 7), 4) is None and native.shuffle_call(y, x, 5) is None


def test_copy_and_add_equal_torch():
    """copy and add (with a clamp) between strided channels-last views, in place too; nothing
    outside the output written; several calls merged run in order; the output's channels must
    be unit-stride, the source's need not."""
    big = _nhwc(2, 40, 9, 11)
    x, w = big[:, :, 1:6, 2:9], _nhwc(2, 40, 5, 7)
    out = torch.full((2, 7, 10, 40), float("nan")).permute(0, 3, 1, 2)
    y = out[:, :, 1:6, 3:10]
    native.copy_call(y, x)()
    assert torch.equal(y, x) and out[:, :, 0].isnan().all() and out[:, :, :, :3].isnan().all()
    expected = (x + w).clamp(0.0, 6.0)
    summed = native.add_call(y, y, w, (0.0, 6.0))  # y = clamp(y + w), in place
    twice = native.NativeCalls.merged([summed, native.add_call(y, y, w, (-math.inf, math.inf))])
    summed()
    assert torch.allclose(y, expected)
    twice()  # clamp(y + w) then + w
    assert torch.allclose(y, (expected + w).clamp(0.0, 6.0) + w)
    nchw = torch.randn(2, 40, 5, 7)  # an NCHW source (a model input) is copied too
    native.copy_call(y, nchw)()
    assert torch.equal(y, nchw)
    assert native.copy_call(y, x[:, :, :, :3]) is None and native.copy_call(nchw, x) is None


def test_off_when_asked(monkeypatch):
    """TIGHTFIT_NATIVE=0: no native call; a small band then runs on oneDNN, the same outputs."""
    x, y = _nhwc(1, 4, 3, 3), torch.empty(1, 1, 1, 4).permute(0, 3, 1, 2)
    taps, b = torch.randn(9, 4), torch.randn(4)
    native.conv_call("depthwise", x, y, taps, b, (3, 3), (1, 1), (0, 0), (0.0, 6.0))()
    ours = y.clone()
    monkeypatch.setenv("TIGHTFIT_NATIVE", "0")
    assert native.conv_call("depthwise", x, y, taps, b, (3, 3), (1, 1), (0, 0), conv.NO_CLAMP) is None
    layer = types.SimpleNamespace(attrs={"kernel": (3, 3), "stride": (1, 1), "dilation": (1, 1), "groups": 4,
                                         "act": (("clip", 0.0, 6.0),)})
    w = taps.t().reshape(4, 1, 3, 3).contiguous()
    window = InputWindow(Region(0, 1, 0, 3, 0, 3), (0, 0, 0, 0))
    y.fill_(float("nan"))
    conv.Conv().bind(layer, [x], [window], y, Region(0, 1, 0, 1, 0, 1), [w, b, conv.PackedWeights(w, layer.attrs)])()
    assert torch.allclose(y, ours, atol=1e-5)


def test_built_without_a_disk_cache(monkeypatch, tmp_path):
    """TIGHTFIT_CACHE=off: the library is built for the process and its file removed."""
    monkeypatch.setenv("TIGHTFIT_CACHE", "off")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    native._library.cache_clear()
    try:
        import tempfile
        tempfile.tempdir = None
        assert native._library() is not None and not any(tmp_path.iterdir())
    finally:
        native._library.cache_clear()
        tempfile.tempdir = None


@pytest.mark.parametrize("shift", [(2, 0), (-2, 0), (0, 3), (0, -1), (1, -2), (-1, 1)])
def test_move_within_a_buffer(shift):
    """A region moved within one buffer over itself (a window of rows or columns shifted, as
    parts plans do): equal to a copy through a temporary; nothing else written."""
    buf = _nhwc(2, 20, 9, 8)
    dh, dw = shift
    h, w = 9 - abs(dh), 8 - abs(dw)
    src = buf[:, :, max(dh, 0) : max(dh, 0) + h, max(dw, 0) : max(dw, 0) + w]
    dst = buf[:, :, max(-dh, 0) : max(-dh, 0) + h, max(-dw, 0) : max(-dw, 0) + w]
    expected = buf.clone()
    expected[:, :, max(-dh, 0) : max(-dh, 0) + h, max(-dw, 0) : max(-dw, 0) + w] = src.clone()
    native.move_call(dst, src)()
    assert torch.equal(buf, expected)


@pytest.mark.parametrize("op_name,kernel,stride,pads,ceil_mode,count_include_pad,act", [
    ("maxpool", (3, 3), (2, 2), (0, 0, 0, 0), True, False, ()),  # ceil-mode overhang
    ("maxpool", (3, 3), (2, 2), (1, 1, 1, 1), False, False, (("relu",),)),
    ("maxpool", (2, 3), (1, 2), (0, 1, 1, 0), False, False, (("clip", -0.5, 0.5),)),
    ("avgpool", (3, 3), (2, 2), (1, 1, 1, 1), False, False, ()),
    ("avgpool", (3, 3), (1, 1), (1, 1, 1, 1), False, True, (("relu",),)),
    ("avgpool", (3, 3), (2, 2), (0, 0, 1, 1), True, True, ()),  # asymmetric padding, overhang
])
def test_pools_equal_torch(op_name, kernel, stride, pads, ceil_mode, count_include_pad, act):
    """Max and average pooling of regions (whole, border tiles, a band) between channels-last
    views: our kernel, equal to the torch path (the same step on NCHW views); nothing outside
    the output written."""
    c, h, w = 20, 11, 13
    attrs = {"kernel": kernel, "stride": stride, "dilation": (1, 1), "pads": pads, "ceil_mode": ceil_mode,
             "count_include_pad": count_include_pad, "act": act, "in_hw": (h, w)}
    layer = types.SimpleNamespace(attrs=attrs)
    op = get_op(op_name)
    _, _, oh, ow = op.output_shape(layer, [(2, c, h, w)])
    x = _nhwc(2, c, h, w)
    x[1, 3, 4, 5] = -math.inf  # an input of -inf stays the max's floor
    for region in (Region(0, 2, 0, oh, 0, ow), Region(0, 1, 0, 2, 0, 3), Region(1, 2, oh - 2, oh, ow - 3, ow),
                   Region(0, 2, 1, 3, 0, ow)):
        (win,) = op.input_windows(layer, region, [(2, c, h, w)])
        r = win.region
        view = lambda t: t[r.n0 : r.n1, :, r.h0 : r.h1, r.w0 : r.w1]  # noqa: E731
        expected = torch.empty(region.n, c, region.h, region.w)
        op.bind(layer, [view(x.contiguous())], [win], expected, region, [])()
        out = torch.full((region.n, region.h + 1, region.w + 2, c), float("nan")).permute(0, 3, 1, 2)
        y = out[:, :, 1:, 2:]
        run = op.bind(layer, [view(x)], [win], y, region, [])
        assert isinstance(run, native.NativeCalls)
        run()
        assert torch.allclose(y, expected, rtol=1e-6, atol=1e-6)
        assert out[:, :, 0].isnan().all() and out[:, :, :, :2].isnan().all()


def test_concat_copies_each_input_clamped():
    """A concatenation along channels into a channels-last view: one copy of each input, the
    ReLU fused; equal to torch's."""
    layer = types.SimpleNamespace(attrs={"act": (("relu",),)})
    xs = [_nhwc(1, 24, 5, 6), torch.randn(1, 8, 5, 6), _nhwc(1, 40, 5, 6)]  # an NCHW input too
    y = torch.empty(1, 5, 6, 72).permute(0, 3, 1, 2)
    op = get_op("concat")
    run = op.bind(layer, xs, [None] * 3, y, Region(0, 1, 0, 5, 0, 6), [])
    assert isinstance(run, native.NativeCalls) and len(run.calls) == 3
    run()
    assert torch.equal(y, torch.cat(xs, 1).relu())


def test_batchnorm_scale_shift_equals_torch_in_place_too():
    """An inference batch normalization with its ReLU on channels-last views (40 channels: two
    blocks of 16 and a tail), into another view and in place: our kernel, equal to torch's."""
    c = 40
    layer = types.SimpleNamespace(attrs={"epsilon": 1e-5, "act": (("relu",),)})
    op = get_op("batchnorm")
    params = op.prepare_params(layer, [np.random.rand(c) + 0.5, np.random.randn(c), np.random.randn(c), np.random.rand(c) + 0.1])
    x = _nhwc(2, c, 6, 7)[:, :, 1:5]
    expected = torch.empty(2, c, 4, 7)
    op.bind(layer, [x.contiguous()], [None], expected, None, params)()
    y = torch.empty(2, 4, 7, c).permute(0, 3, 1, 2)
    run = op.bind(layer, [x], [None], y, None, params)
    assert isinstance(run, native.NativeCalls)
    run()
    assert torch.allclose(y, expected, rtol=1e-6, atol=1e-6)
    op.bind(layer, [x], [None], x, None, params)()  # in place
    assert torch.allclose(x, expected, rtol=1e-6, atol=1e-6)
