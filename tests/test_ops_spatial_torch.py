"""Issue 22's spatial and structural operators through the PyTorch path: PixelShuffle and
PixelUnshuffle, a U-Net-like module (ConvTranspose and skip concatenations), ShuffleNet's
chunk and channel shuffle; each imported from an nn.Module and matched against the module."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="nn.Modules need PyTorch (pip install 'tightfit[torch]')")

import tightfit  # noqa: E402
from tightfit.plan.check import check_plan  # noqa: E402
from tightfit.runtime.executor import ArenaExecutor  # noqa: E402
from tightfit.reference import run_reference  # noqa: E402
from tightfit.runtime.reference import random_input  # noqa: E402
from tightfit.verify import compare  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("module", [torch.nn.PixelShuffle(2), torch.nn.PixelUnshuffle(2)], ids=["shuffle", "unshuffle"])
def test_pytorch_pixel_shuffle_and_unshuffle(module):
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), module, torch.nn.ReLU()).eval()
    g = tightfit.load(net, (1, 3, 6, 4))
    assert {l.op for l in g.layers} & {"depth_to_space", "space_to_depth"}
    x = random_input(g)
    with torch.no_grad():
        assert compare(run_reference(g, x)[g.outputs[0]], net(torch.from_numpy(x))).ok


# --- PyTorch: a U-Net-like module, and ShuffleNet's shuffle and chunk ------------------------------

class TinyUNet(torch.nn.Module):
    """Two levels down (stride-2 convs), ConvTranspose up (one grouped, with a batch norm), skip
    concatenations, bilinear head."""

    def __init__(self) -> None:
        super().__init__()
        conv = lambda i, o, s=1: torch.nn.Sequential(torch.nn.Conv2d(i, o, 3, s, 1), torch.nn.BatchNorm2d(o), torch.nn.ReLU())
        self.enc0, self.enc1, self.enc2 = conv(3, 8), conv(8, 16, 2), conv(16, 32, 2)
        self.up1 = torch.nn.Sequential(torch.nn.ConvTranspose2d(32, 16, 2, stride=2, groups=2), torch.nn.BatchNorm2d(16))
        self.dec1 = conv(32, 16)
        self.up0 = torch.nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.dec0 = conv(16, 8)
        self.head = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e0 = self.enc0(x)
        e1 = self.enc1(e0)
        e2 = self.enc2(e1)
        d1 = self.dec1(torch.cat([self.up1(e2), e1], 1))
        d0 = self.dec0(torch.cat([self.up0(d1), e0], 1))
        return torch.nn.functional.interpolate(self.head(d0), scale_factor=2.0, mode="bilinear", align_corners=False)


def unet_graph():
    torch.manual_seed(0)
    module = TinyUNet().eval()
    for m in module.modules():  # non-trivial batch norm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return module, tightfit.load(module, (1, 3, 32, 32))


def test_unet_through_pytorch_plans_match():
    module, g = unet_graph()
    assert {"conv_transpose", "concat", "resize"} <= {l.op for l in g.layers}
    assert "batchnorm" not in {l.op for l in g.layers}  # folded into the convolutions, transposed ones too
    x = random_input(g)
    ref = run_reference(g, x)[g.outputs[0]]
    with torch.no_grad():
        assert compare(ref, module(torch.from_numpy(x))).ok
    from tightfit.techniques.parts.planner import plan_parts, phases_for_rows
    from tightfit.techniques.interface import PlannedModel
    from tightfit.techniques.reuse.planner import plan_reuse
    from tightfit.techniques.tiling import parse_tiling, plan_tiling

    model = PlannedModel(g, "unet")
    whole = plan_reuse(model)
    parts = plan_parts(model, *phases_for_rows(g, 1))
    tiled = plan_tiling(model, parse_tiling(f"0-{len(g.layers) - 1}:4x4", g))
    for p in (whole, parts, tiled):
        check_plan(p, [g])
        out = ArenaExecutor(p, [g], fill_nan=True).run([x])[0][g.outputs[0]]
        assert compare(out, ref).ok
    assert parts.arena_bytes < whole.arena_bytes and tiled.arena_bytes < whole.arena_bytes


def test_shufflenet_shuffle_and_chunk_import():
    """torchvision's ShuffleNetV2 unit: chunk(2) on channels (Split) and the view/transpose/view
    shuffle (one channel_shuffle layer)."""
    class Unit(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = x.chunk(2, dim=1)
            x = torch.cat((a, torch.relu(b)), dim=1)
            n, c, h, w = x.size()
            return x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, -1, h, w)

    g = tightfit.load(Unit(), (1, 8, 6, 5))
    ops = [l.op for l in g.layers]
    assert "channel_shuffle" in ops and ops.count("slice") == 2
    x = random_input(g)
    assert compare(run_reference(g, x)[g.outputs[0]], Unit()(torch.from_numpy(x))).ok


@pytest.mark.slow
def test_torchvision_shufflenet_v2_imports_and_matches():
    """torchvision's shufflenet_v2_x1_0 as it exports (chunk -> Slice, the view/transpose/view
    shuffle): before issue 22 its Slice was refused."""
    torchvision = pytest.importorskip("torchvision")
    module = torchvision.models.shufflenet_v2_x1_0(weights=None).eval()
    g = tightfit.load(module, (1, 3, 224, 224))
    assert {"slice", "channel_shuffle"} <= {l.op for l in g.layers}
    x = random_input(g)
    with torch.no_grad():
        assert compare(run_reference(g, x)[g.outputs[0]], module(torch.from_numpy(x))).ok
