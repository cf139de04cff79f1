"""The corpus of issue 22: the CNNs people deploy, built here without downloads (random weights
from a fixed seed) and exported to ONNX as exporters emit them, so every importer path and
planner can be checked on them (tests/test_corpus.py, bench/coverage.py).

Every torchvision classification CNN, the three torchvision segmentation CNNs, and four CNNs
written from published layer tables: a YOLOv5n detector (v6.0 layer table: stride-2 6x6 stem,
C3 blocks, SPPF, a PANet neck with nearest upsampling, three 1x1 detection heads; `yolov5n_focus`
is the same with the v5.0 Focus stem of Slice/Concat), a U-Net (Ronneberger et al.: double 3x3
convs, 2x2 max pools, 2x2 stride-2 transposed convs, skip concats), a DB text detector (Liao et
al.: a MobileNetV3-style backbone whose hard-swish is written `x * relu6(x + 3) / 6` as
PaddleOCR writes it, an FPN neck, the binarization head of 3x3 conv and two 2x2 stride-2
transposed convs with a sigmoid), and a CRNN recogniser trunk (Shi et al. Table 1: seven convs,
max pools of 2x2 then (2, 1) stride, a 2x2 last conv) with a 1x1 class head, at 32x320. Issue 38
adds a model of two inputs and two outputs: a stereo matcher after DispNetC / StereoNet (one
feature tower shared by both views, a cost volume of the two maps and their difference, a conv
decoder, disparity and confidence heads) at 96x192, exported with inputs "left" and "right".

Input sizes are those a user runs: classification at 224 (inception_v3 at 299), segmentation at
520 (torchvision's evaluation size), the detector and text detector at 640x640, U-Net at 256x256,
the recogniser at 32x320.

Exports: TorchScript-based `torch.onnx.export(dynamo=False)` (the dynamo exporter of torch 2.14
writes a different graph; the TorchScript one is what most published ONNX files came from),
with its default constant folding, at opset 17 with a static shape and at opset 11 with a
dynamic batch dimension (`dynamic_axes`, as people export for serving). Files are cached under
the zoo cache (`cache_dir()/corpus`).

Needs the torch extra: importing this module without PyTorch is a TorchMissingError."""
from __future__ import annotations

import functools
import hashlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tightfit.cache import cache_dir
from tightfit.frontend.hybrids import EfficientFormer, MobileViT
from tightfit.frontend.torch_import import require_torch

torch = require_torch("the corpus", torchvision=True)
nn = torch.nn
F = torch.nn.functional

OPSETS = (17, 11)


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    input_shape: tuple[int, int, int, int]
    source: str  # "torchvision" or "table"
    about: str


# --- YOLOv5n (ultralytics yolov5 v6.0 yolov5n.yaml: depth 0.33, width 0.25) --------------------

class ConvBnSiLU(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1, p: int | None = None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2 = ConvBnSiLU(c, c, 1), ConvBnSiLU(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3(nn.Module):
    def __init__(self, cin: int, cout: int, n: int, shortcut: bool = True) -> None:
        super().__init__()
        c = cout // 2
        self.cv1, self.cv2, self.cv3 = ConvBnSiLU(cin, c), ConvBnSiLU(cin, c), ConvBnSiLU(2 * c, cout)
        self.m = nn.Sequential(*(Bottleneck(c, shortcut) for _ in range(n)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 5) -> None:
        super().__init__()
        c = cin // 2
        self.cv1, self.cv2 = ConvBnSiLU(cin, c), ConvBnSiLU(4 * c, cout)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Focus(nn.Module):
    """YOLOv5 v5.0's stem: space-to-depth by four strided slices, then a 3x3 conv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv = ConvBnSiLU(4 * cin, cout, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat((x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]), 1))


class YOLOv5n(nn.Module):
    """Three outputs: the raw P3/8, P4/16 and P5/32 head maps, 3 anchors x (5 + 80 classes)."""

    def __init__(self, focus: bool = False, classes: int = 80) -> None:
        super().__init__()
        self.stem = Focus(3, 16) if focus else ConvBnSiLU(3, 16, 6, 2, 2)
        self.b1 = nn.Sequential(ConvBnSiLU(16, 32, 3, 2), C3(32, 32, 1))
        self.b2 = nn.Sequential(ConvBnSiLU(32, 64, 3, 2), C3(64, 64, 2))  # P3
        self.b3 = nn.Sequential(ConvBnSiLU(64, 128, 3, 2), C3(128, 128, 3))  # P4
        self.b4 = nn.Sequential(ConvBnSiLU(128, 256, 3, 2), C3(256, 256, 1), SPPF(256, 256))  # P5
        self.h10 = ConvBnSiLU(256, 128)
        self.h13 = C3(256, 128, 1, False)
        self.h14 = ConvBnSiLU(128, 64)
        self.h17 = C3(128, 64, 1, False)
        self.h18 = ConvBnSiLU(64, 64, 3, 2)
        self.h20 = C3(128, 128, 1, False)
        self.h21 = ConvBnSiLU(128, 128, 3, 2)
        self.h23 = C3(256, 256, 1, False)
        out = 3 * (5 + classes)
        self.detect = nn.ModuleList(nn.Conv2d(c, out, 1) for c in (64, 128, 256))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        p3 = self.b2(self.b1(self.stem(x)))
        p4 = self.b3(p3)
        x10 = self.h10(self.b4(p4))
        x14 = self.h14(self.h13(torch.cat((F.interpolate(x10, scale_factor=2.0, mode="nearest"), p4), 1)))
        small = self.h17(torch.cat((F.interpolate(x14, scale_factor=2.0, mode="nearest"), p3), 1))
        medium = self.h20(torch.cat((self.h18(small), x14), 1))
        large = self.h23(torch.cat((self.h21(medium), x10), 1))
        return tuple(d(t) for d, t in zip(self.detect, (small, medium, large)))  # type: ignore[return-value]


# --- U-Net (Ronneberger et al. 2015, padded convs as in common implementations) --------------

def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, classes: int = 2, base: int = 64) -> None:
        super().__init__()
        widths = [base * 2 ** i for i in range(5)]  # 64 ... 1024
        self.inc = _double_conv(3, widths[0])
        self.downs = nn.ModuleList(_double_conv(a, b) for a, b in zip(widths, widths[1:]))
        self.ups = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, 2) for a, b in zip(widths, widths[1:]))
        self.up_convs = nn.ModuleList(_double_conv(2 * a, a) for a in widths[:-1])
        self.outc = nn.Conv2d(widths[0], classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        x = skips.pop()
        for up, conv in zip(reversed(self.ups), reversed(self.up_convs)):
            x = conv(torch.cat((skips.pop(), up(x)), 1))
        return self.outc(x)


# --- DB text detector (Liao et al. 2020, PaddleOCR's MobileNetV3 DB) --------------------------

class HardSwishDiv(nn.Module):
    """x * relu6(x + 3) / 6, as PaddleOCR writes hard-swish (exports as Add, Clip, Mul, Div)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * F.relu6(x + 3.0) / 6.0


def _conv_bn(cin: int, cout: int, k: int, s: int = 1, groups: int = 1, act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, HardSwishDiv()) if act else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, mid: int, cout: int, k: int, s: int) -> None:
        super().__init__()
        self.block = nn.Sequential(_conv_bn(cin, mid, 1), _conv_bn(mid, mid, k, s, groups=mid), _conv_bn(mid, cout, 1, act=False))
        self.residual = s == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class DBNet(nn.Module):
    """MobileNetV3-style backbone (strides 4, 8, 16, 32), FPN neck to 1/4, DB probability head."""

    def __init__(self, neck: int = 96) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 2)
        # (in, expanded, out, kernel, stride) per block; each stage ends at the stride its output feeds
        spec = [[(16, 64, 24, 3, 2), (24, 72, 24, 3, 1)],
                [(24, 72, 40, 5, 2), (40, 120, 40, 5, 1)],
                [(40, 240, 80, 3, 2), (80, 200, 80, 3, 1), (80, 480, 112, 3, 1)],
                [(112, 672, 160, 5, 2), (160, 960, 160, 5, 1)]]
        self.stages = nn.ModuleList(nn.Sequential(*(InvertedResidual(*b) for b in stage)) for stage in spec)
        widths = [stage[-1][2] for stage in spec]
        self.lateral = nn.ModuleList(nn.Conv2d(c, neck, 1, bias=False) for c in widths)
        self.smooth = nn.ModuleList(nn.Conv2d(neck, neck // 4, 3, 1, 1, bias=False) for _ in widths)
        c = neck
        self.head = nn.Sequential(nn.Conv2d(c, c // 4, 3, 1, 1, bias=False), nn.BatchNorm2d(c // 4), nn.ReLU(),
                                  nn.ConvTranspose2d(c // 4, c // 4, 2, 2), nn.BatchNorm2d(c // 4), nn.ReLU(),
                                  nn.ConvTranspose2d(c // 4, 1, 2, 2), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
            feats.append(x)
        lat = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(lat) - 2, -1, -1):
            lat[i] = lat[i] + F.interpolate(lat[i + 1], scale_factor=2.0, mode="nearest")
        outs = [F.interpolate(s(t), scale_factor=float(2 ** i), mode="nearest") if i else s(t)
                for i, (s, t) in enumerate(zip(self.smooth, lat))]
        return self.head(torch.cat(outs, 1))


# --- CRNN recogniser trunk (Shi et al. 2015, Table 1) ----------------------------------------

class CRNNTrunk(nn.Module):
    """The convolutional part of CRNN on a 3x32x320 text line, then a 1x1 conv to the classes
    (the per-column scores a CTC decoder reads; the recurrent layers are not a CNN's)."""

    def __init__(self, classes: int = 37) -> None:
        super().__init__()

        def conv(cin: int, cout: int, bn: bool = False, k: int = 3, p: int = 1) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, k, 1, p, bias=not bn)] + ([nn.BatchNorm2d(cout)] if bn else []) + [nn.ReLU()]

        self.features = nn.Sequential(
            *conv(3, 64), nn.MaxPool2d(2, 2), *conv(64, 128), nn.MaxPool2d(2, 2),
            *conv(128, 256, True), *conv(256, 256), nn.MaxPool2d((2, 2), (2, 1), (0, 1)),
            *conv(256, 512, True), *conv(512, 512), nn.MaxPool2d((2, 2), (2, 1), (0, 1)),
            *conv(512, 512, True, k=2, p=0))
        self.classifier = nn.Conv2d(512, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


# --- SVTR-style recogniser (issue 38: a CRNN trunk, attention over all tokens, a CTC head) ------

class SVTRBlock(nn.Module):
    """A global mixing block of SVTR (Du et al. 2022, as PaddleOCR writes it): pre-norm multi-head
    self-attention over all tokens (one qkv Linear, reshape to (B, T, 3, heads, d) and permute
    (2, 0, 3, 1, 4)), then a pre-norm MLP with GELU; LayerNorm epsilon 1e-6."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2, self.act = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim), nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(-1)
        x = x + self.proj((attn @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class SVTR(nn.Module):
    """SVTR-style recogniser on a 3x32x320 text line: a CRNN-like trunk (3x3 convs with batch norm,
    max pools 2x2, 2x2 and (2, 1)) to a 128 x 4 x 80 map, its 320 pixels as tokens through two
    global mixing blocks, back to the map, a 1x1 conv, the height averaged away, and the CTC head
    (a Linear per column to 37 classes: the logits a CTC decoder reads)."""

    def __init__(self, classes: int = 37, dim: int = 128) -> None:
        super().__init__()

        def conv(cin: int, cout: int, k: int = 3) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, k, 1, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.trunk = nn.Sequential(*conv(3, 32), nn.MaxPool2d(2, 2), *conv(32, 64), nn.MaxPool2d(2, 2),
                                   *conv(64, dim), *conv(dim, dim), nn.MaxPool2d((2, 1), (2, 1)))
        self.blocks = nn.Sequential(SVTRBlock(dim, 4), SVTRBlock(dim, 4))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.neck = nn.Sequential(*conv(dim, dim, 1), nn.AvgPool2d((4, 1)))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.trunk(x)
        b, c, h, w = x.shape
        x = self.norm(self.blocks(x.flatten(2).transpose(1, 2)))
        x = self.neck(x.transpose(1, 2).reshape(b, c, h, w))
        return self.head(x.squeeze(2).permute(0, 2, 1))


# --- a stereo pair (two inputs, two outputs; issue 38) ---------------------------------------------

class StereoNet(nn.Module):
    """A stereo matcher in the shape of DispNetC / StereoNet (Mayer et al. 2016; Khamis et al. 2018):
    one feature tower whose weights both views share (3x3 convs, two stride 2, to 1/4 resolution),
    a cost volume of the two feature maps side by side and their difference, a 3x3 conv decoder
    and two 2x2 stride-2 transposed convs back to full resolution, ending in two heads: the
    disparity (ReLU) and its confidence (sigmoid)."""

    input_names = ("left", "right")
    output_names = ("disparity", "confidence")

    def __init__(self, c: int = 32) -> None:
        super().__init__()

        def cbr(cin: int, cout: int, s: int = 1) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.tower = nn.Sequential(cbr(3, c // 2, 2), cbr(c // 2, c), cbr(c, c, 2), cbr(c, c))
        self.decode = nn.Sequential(cbr(3 * c, 2 * c), cbr(2 * c, c))
        self.up = nn.Sequential(nn.ConvTranspose2d(c, c // 2, 2, 2), nn.ReLU(), nn.ConvTranspose2d(c // 2, c // 4, 2, 2),
                                nn.ReLU())
        self.disparity = nn.Conv2d(c // 4, 1, 3, 1, 1)
        self.confidence = nn.Conv2d(c // 4, 1, 3, 1, 1)

    def forward(self, left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fl, fr = self.tower(left), self.tower(right)
        x = self.up(self.decode(torch.cat((fl, fr, fl - fr), 1)))
        return F.relu(self.disparity(x)), torch.sigmoid(self.confidence(x))


# --- the corpus ----------------------------------------------------------------------------------

def _tv(name: str, **kw) -> Callable[[], nn.Module]:
    from tightfit.frontend.torch_import import torchvision_factory

    return torchvision_factory(name, **kw)


def _seg(name: str, **kw) -> Callable[[], nn.Module]:
    from tightfit.frontend.torch_import import torchvision_factory

    make_model = torchvision_factory(name, "segmentation", weights_backbone=None, **kw)

    def make() -> nn.Module:
        return _OutOnly(make_model())

    return make


class _OutOnly(nn.Module):
    """torchvision's segmentation models return {"out": ...}; the exported graph has that one output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


_MAKERS: dict[str, tuple[Callable[[], nn.Module], tuple[int, int, int, int], str, str]] = {
    **{n: (_tv(n, **kw), (1, 3, 224, 224), "torchvision", about) for n, kw, about in [
        ("alexnet", {}, "AlexNet"), ("convnext_tiny", {}, "ConvNeXt-T"), ("densenet121", {}, "DenseNet-121"),
        ("efficientnet_b0", {}, "EfficientNet-B0"), ("efficientnet_v2_s", {}, "EfficientNetV2-S"),
        ("googlenet", {"aux_logits": False, "init_weights": False, "transform_input": False}, "GoogLeNet"),
        ("mnasnet1_0", {}, "MNASNet 1.0"), ("mobilenet_v2", {}, "MobileNetV2"),
        ("mobilenet_v3_large", {}, "MobileNetV3-Large"), ("mobilenet_v3_small", {}, "MobileNetV3-Small"),
        ("regnet_x_400mf", {}, "RegNetX-400MF"), ("regnet_y_400mf", {}, "RegNetY-400MF"),
        ("resnet18", {}, "ResNet-18"), ("resnet50", {}, "ResNet-50"), ("resnext50_32x4d", {}, "ResNeXt-50 32x4d"),
        ("shufflenet_v2_x1_0", {}, "ShuffleNetV2 1.0"), ("squeezenet1_1", {}, "SqueezeNet 1.1"),
        ("vgg11_bn", {"init_weights": False}, "VGG-11 with batch norm"), ("wide_resnet50_2", {}, "Wide ResNet-50-2")]},
    "inception_v3": (_tv("inception_v3", aux_logits=False, init_weights=False, transform_input=False), (1, 3, 299, 299),
                     "torchvision", "Inception v3"),
    "fcn_resnet50": (_seg("fcn_resnet50", aux_loss=False), (1, 3, 520, 520), "torchvision", "FCN ResNet-50 segmentation"),
    "deeplabv3_mobilenet_v3_large": (_seg("deeplabv3_mobilenet_v3_large", aux_loss=False), (1, 3, 520, 520),
                                     "torchvision", "DeepLabV3 MobileNetV3-Large segmentation"),
    "lraspp_mobilenet_v3_large": (_seg("lraspp_mobilenet_v3_large"), (1, 3, 520, 520), "torchvision",
                                  "LR-ASPP MobileNetV3-Large segmentation"),
    "yolov5n": (YOLOv5n, (1, 3, 640, 640), "table", "YOLOv5n v6.0 (6x6 stride-2 stem, three heads)"),
    "yolov5n_focus": (functools.partial(YOLOv5n, focus=True), (1, 3, 640, 640), "table",
                      "YOLOv5n with the v5.0 Focus stem (Slice/Concat)"),
    "unet": (UNet, (1, 3, 256, 256), "table", "U-Net (64-1024 channels, ConvTranspose up)"),
    "dbnet": (DBNet, (1, 3, 640, 640), "table", "DB text detector (MobileNetV3 backbone, x/6 hard-swish, FPN)"),
    "crnn": (CRNNTrunk, (1, 3, 32, 320), "table", "CRNN recogniser trunk with a 1x1 class head"),
    # issue 38: convolutions with attention blocks
    "svtr": (SVTR, (1, 3, 32, 320), "table", "SVTR-style recogniser: CRNN trunk, 2 attention blocks, CTC head"),
    "mobilevit_xxs": (MobileViT, (1, 3, 256, 256), "table", "MobileViT-XXS: MobileNetV2 blocks, unfold / attention / fold"),
    "mobilevit_tiny": (functools.partial(MobileViT, classes=10, width=0.5), (1, 3, 64, 64), "table",
                       "MobileViT-XXS at half width, 10 classes, 64x64 (the default run's hybrid)"),
    "efficientformer_l1": (EfficientFormer, (1, 3, 224, 224), "table",
                           "EfficientFormer-L1: 4-D conv stages, then a 3-D attention stage"),
    "stereonet": (StereoNet, (1, 3, 96, 192), "table", "stereo pair (two inputs: shared-weight towers, cost volume, "
                  "disparity and confidence heads)"),
}

# Small, quick members for the default test run.
FAST = ("squeezenet1_1", "crnn", "mobilenet_v3_small")


def entries() -> list[CorpusEntry]:
    return [CorpusEntry(n, shape, src, about) for n, (_, shape, src, about) in _MAKERS.items()]


def names() -> list[str]:
    return list(_MAKERS)


def entry(name: str) -> CorpusEntry:
    if name not in _MAKERS:
        from tightfit.errors import ModelLoadError

        raise ModelLoadError(f"no corpus model {name!r}; known: {', '.join(_MAKERS)}")
    return next(e for e in entries() if e.name == name)


def module(name: str) -> nn.Module:
    """The corpus model with its seeded random weights, in eval mode."""
    from tightfit.frontend.torch_import import randomize_module
    from tightfit.frontend.zoo import SEED

    make, shape, _, _ = _MAKERS[entry(name).name]
    torch.manual_seed(SEED)  # layers randomize_module leaves alone (ConvTranspose, LayerNorm, ...) draw from here
    return randomize_module(_vary_constants(make(), SEED), SEED, calibrate_shape=shape)


def _vary_constants(model: nn.Module, seed: int) -> nn.Module:
    """Parameters a fresh module holds as one repeated value (LayerNorm's ones and zeros,
    ConvNeXt's layer scale) drawn around it: a trained model never has two equal weight tensors,
    and the exporter stores equal ones once, so a file of fresh ConvNeXt weights held 18,624
    fewer than torch counts."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and p.dtype.is_floating_point and bool((p == p.flatten()[0]).all()):
                v = float(p.flatten()[0])
                drawn = torch.rand(p.shape, generator=g)
                p.copy_(v * (0.8 + 0.4 * drawn) if v else 0.1 * (drawn - 0.5))
    return model


def export(name: str, opset: int) -> bytes:
    """ONNX bytes as the TorchScript exporter emits them by default (constant folding on). Opset
    17: the static input shape; older opsets: a dynamic batch dimension named 'batch'."""
    e = entry(name)
    buf = io.BytesIO()
    m = module(name)
    outputs = ["output"] if name not in ("yolov5n", "yolov5n_focus") else ["p3", "p4", "p5"]
    outputs = list(getattr(m, "output_names", outputs))
    inputs = list(getattr(m, "input_names", ("images",)))  # a model of several inputs: each of the entry's shape
    dynamic = None if opset >= 17 else {**{i: {0: "batch"} for i in inputs}, **{o: {0: "batch"} for o in outputs}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, tuple(torch.zeros(*e.input_shape) for _ in inputs), buf, dynamo=False, opset_version=opset,
                          input_names=inputs, output_names=outputs, dynamic_axes=dynamic)
    return buf.getvalue()


def onnx_path(name: str, opset: int = 17) -> Path:
    """The exported file in the cache (made on first use). Without a disk cache (TIGHTFIT_CACHE=0)
    it goes to a temporary folder of this process."""
    base = cache_dir()
    if base is None:
        import tempfile

        base = Path(tempfile.gettempdir()) / f"tightfit-corpus-{_code_version()}"
    path = base / "corpus" / f"{name}-opset{opset}-{_code_version()}.onnx"
    if not path.is_file():
        from tightfit.cache import write_cache

        if not write_cache(path, export(name, opset)):
            raise OSError(f"could not write {path}")
    return path


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """Exported bytes depend on the libraries, the seed and the sources that draw the weights."""
    import onnx

    from tightfit.frontend import torch_import, zoo

    h = hashlib.sha256()
    for part in (*torch_import.versions(), onnx.__version__, str(zoo.SEED)):
        h.update(part.encode() + b"\0")
    for mod_file in (__file__, torch_import.__file__, zoo.__file__):
        h.update(Path(mod_file).read_bytes())
    return h.hexdigest()[:12]


def parameter_count(name: str) -> int:
    """What torch counts: parameters and the batch norms' running statistics (the ONNX file
    stores both as weights)."""
    m = module(name)
    buffers = sum(b.numel() for n, b in m.named_buffers() if b.dtype.is_floating_point)
    return sum(p.numel() for p in m.parameters()) + buffers
