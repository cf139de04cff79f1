"""Hybrid CNN + attention models of the corpus (issue 38), written after their published layer
tables with random weights (tightfit.frontend.corpus lists and exports them).

- MobileViT-XXS (Mehta & Rastegari 2022, Table 4 and ml-cvnets' `mobilevit_xxs` config):
  MobileNetV2 blocks (expansion 2, SiLU), then three MobileViT blocks of widths 64, 80, 96 with
  2, 4 and 3 transformer layers (4 heads, FFN twice the width, SiLU) on 2x2 patches, at 256x256.
  The unfold and fold are cvnets' own reshapes: (B*C*nh, ph, nw, pw) -> transpose -> (B, C, N, P)
  -> transpose -> (B*P, N, C), the patch pixels joined to the batch, and back.
- EfficientFormer-L1 (Li et al. 2022, Table 6: widths 48, 96, 224, 448, depths 3, 2, 6, 4, the
  last block a 3-D one): a stem of two stride-2 3x3 convs, 4-D stages of pooling token mixers
  (avg-pool minus identity) and 1x1-conv MLPs, stride-2 3x3 downsampling, then the map flattened
  to tokens for a multi-head attention block with learned attention biases (8 heads, key dim 32,
  value ratio 4), a final layer norm, the tokens averaged and the classification and distillation
  heads averaged, at 224x224.

`width` scales every channel count (a reduced variant for quick tests); the layer structure
stays the table's.
"""
from __future__ import annotations

import itertools

from tightfit.frontend.torch_import import require_torch

torch = require_torch("the corpus", torchvision=True)
nn = torch.nn


def _c(c: int, width: float, step: int = 8) -> int:
    return max(step, int(round(c * width / step)) * step)


def _conv_bn(cin: int, cout: int, k: int, s: int = 1, groups: int = 1, act: type | None = nn.SiLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, s, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)


# --- MobileViT-XXS --------------------------------------------------------------------------------

class MV2(nn.Module):
    """MobileNetV2's inverted residual with SiLU, as MobileViT uses it."""

    def __init__(self, cin: int, cout: int, s: int, expand: int = 2) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(_conv_bn(cin, mid, 1), _conv_bn(mid, mid, 3, s, groups=mid), _conv_bn(mid, cout, 1, act=None))
        self.residual = s == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y


class TokenAttention(nn.Module):
    """Multi-head self-attention over the last-but-one axis of (B, N, C) tokens, one qkv Linear
    (as cvnets' MultiHeadAttention writes it)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).transpose(1, 3).contiguous()
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (b, heads, n, d)
        attn = torch.matmul(q * self.scale, k.transpose(-1, -2)).softmax(-1)
        return self.proj(torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c))


class TransformerLayer(nn.Module):
    def __init__(self, dim: int, ffn: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = TokenAttention(dim, heads)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.SiLU(), nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class MobileViTBlock(nn.Module):
    """Local 3x3 and 1x1 convs, unfold into 2x2 patches, transformer layers over the patches of
    each patch pixel, fold back, 1x1 conv, and a 3x3 conv fusing it with the block's input."""

    def __init__(self, c: int, dim: int, ffn: int, depth: int, heads: int = 4, patch: int = 2) -> None:
        super().__init__()
        self.patch = patch
        self.local = nn.Sequential(_conv_bn(c, c, 3), nn.Conv2d(c, dim, 1, bias=False))
        self.transformer = nn.Sequential(*(TransformerLayer(dim, ffn, heads) for _ in range(depth)), nn.LayerNorm(dim))
        self.project = _conv_bn(dim, c, 1)
        self.fusion = _conv_bn(2 * c, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        b, c, h, w = y.shape
        p, nh, nw = self.patch, h // self.patch, w // self.patch
        y = y.reshape(b * c * nh, p, nw, p).transpose(1, 2).reshape(b, c, nh * nw, p * p)
        y = self.transformer(y.transpose(1, 3).reshape(b * p * p, nh * nw, c))
        y = y.contiguous().view(b, p * p, nh * nw, c).transpose(1, 3)
        y = y.reshape(b * c * nh, nw, p, p).transpose(1, 2).reshape(b, c, h, w)
        return self.fusion(torch.cat((x, self.project(y)), 1))


class MobileViT(nn.Module):
    """MobileViT-XXS: (kind, out, stride, blocks or (dim, depth)) per layer as cvnets' config."""

    def __init__(self, classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        c = lambda n: _c(n, width)  # noqa: E731
        self.stem = _conv_bn(3, c(16), 3, 2)
        layers: list[nn.Module] = [MV2(c(16), c(16), 1)]
        layers += [MV2(c(16), c(24), 2), MV2(c(24), c(24), 1), MV2(c(24), c(24), 1)]
        cin = c(24)
        for out, dim, depth in ((48, 64, 2), (64, 80, 4), (80, 96, 3)):
            layers += [MV2(cin, c(out), 2), MobileViTBlock(c(out), c(dim), 2 * c(dim), depth)]
            cin = c(out)
        self.layers = nn.Sequential(*layers)
        self.head = _conv_bn(cin, 4 * cin, 1)
        self.classifier = nn.Linear(4 * cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.layers(self.stem(x)))
        return self.classifier(x.mean((2, 3)))


# --- EfficientFormer-L1 --------------------------------------------------------------------------

class Meta4D(nn.Module):
    """x + (avgpool(x) - x), then x + mlp(x) with 1x1 convs, batch norms and GELU."""

    def __init__(self, c: int, ratio: int = 4) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.mlp = nn.Sequential(_conv_bn(c, ratio * c, 1, act=nn.GELU), _conv_bn(ratio * c, c, 1, act=None))
        self.scale1, self.scale2 = nn.Parameter(torch.full((c, 1, 1), 1e-5)), nn.Parameter(torch.full((c, 1, 1), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.scale1 * (self.pool(x) - x)
        return x + self.scale2 * self.mlp(x)


class BiasedAttention(nn.Module):
    """EfficientFormer's attention: q, k of key_dim and v of ratio * key_dim per head from one
    Linear, a learned bias per head and relative offset added to the scores."""

    def __init__(self, dim: int, resolution: int, key_dim: int = 32, heads: int = 8, ratio: int = 4) -> None:
        super().__init__()
        self.heads, self.key_dim, self.d, self.scale = heads, key_dim, ratio * key_dim, key_dim ** -0.5
        self.qkv = nn.Linear(dim, heads * (2 * key_dim + self.d))
        self.proj = nn.Linear(heads * self.d, dim)
        points = list(itertools.product(range(resolution), range(resolution)))
        offsets: dict[tuple[int, int], int] = {}
        idxs = []
        for p1 in points:
            for p2 in points:
                off = (abs(p1[0] - p2[0]), abs(p1[1] - p2[1]))
                idxs.append(offsets.setdefault(off, len(offsets)))
        self.biases = nn.Parameter(torch.zeros(heads, len(offsets)))
        self.register_buffer("bias_idxs", torch.LongTensor(idxs).view(len(points), len(points)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, self.heads, -1).permute(0, 2, 1, 3).split([self.key_dim, self.key_dim, self.d], 3)
        attn = (q @ k.transpose(-2, -1)) * self.scale + self.biases[:, self.bias_idxs]
        return self.proj((attn.softmax(-1) @ v).transpose(1, 2).reshape(b, n, self.heads * self.d))


class Meta3D(nn.Module):
    def __init__(self, dim: int, resolution: int, ratio: int = 4) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = BiasedAttention(dim, resolution)
        self.mlp = nn.Sequential(nn.Linear(dim, ratio * dim), nn.GELU(), nn.Linear(ratio * dim, dim))
        self.scale1, self.scale2 = nn.Parameter(torch.full((dim,), 1e-5)), nn.Parameter(torch.full((dim,), 1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.scale1 * self.attn(self.norm1(x))
        return x + self.scale2 * self.mlp(self.norm2(x))


class EfficientFormer(nn.Module):
    """EfficientFormer-L1 at `size` x `size`: four 4-D stages, the last one's final block a 3-D
    attention block over the (size/32)^2 tokens."""

    def __init__(self, classes: int = 1000, width: float = 1.0, size: int = 224,
                 depths: tuple[int, ...] = (3, 2, 6, 4)) -> None:
        super().__init__()
        widths = [_c(w, width) for w in (48, 96, 224, 448)]
        self.stem = nn.Sequential(_conv_bn(3, widths[0] // 2, 3, 2, act=nn.ReLU), _conv_bn(widths[0] // 2, widths[0], 3, 2, act=nn.ReLU))
        stages: list[nn.Module] = []
        for i, (w, d) in enumerate(zip(widths, depths)):
            if i:
                stages.append(_conv_bn(widths[i - 1], w, 3, 2, act=None))
            stages += [Meta4D(w) for _ in range(d - (i == len(widths) - 1))]
        self.stages = nn.Sequential(*stages)
        self.block3d = Meta3D(widths[-1], size // 32)
        self.norm = nn.LayerNorm(widths[-1])
        self.head, self.dist_head = nn.Linear(widths[-1], classes), nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        x = self.norm(self.block3d(x.flatten(2).transpose(1, 2))).mean(1)
        return (self.head(x) + self.dist_head(x)) / 2
