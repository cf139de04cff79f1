"""The two-CNN adaptive application of Minakova's thesis Sec. 6.4, run as a demo.

    python examples/adaptive_demo.py [--budget 3MB] [--frames 40] [--min-fps 5,50]

`fit` plans examples/adaptive.yaml (a large and a small CNN) into one arena within the budget,
runs and verifies the chosen plan; then a stream of frames is classified, each frame routed to
the large CNN when it is complex (much variation between neighbouring pixels) and to the small
one otherwise, both CNNs running from the same arena. Prints the routing, every CNN's fps on
the stream, and checks the first frame of each CNN against the reference executor.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from tightfit import api
from tightfit.reference import run_reference
from tightfit.report import fit_report, fit_text
from tightfit.runtime.executor import ArenaExecutor
from tightfit.stages import run_cnn
from tightfit.units import parse_size
from tightfit.verify import compare

HERE = Path(__file__).parent


def frames(shape, n: int, seed: int = 0):
    """Seeded frames, about half smooth (blurred noise) and half textured (white noise)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(shape, generator=g)
        if torch.rand((), generator=g) < 0.5:
            x = torch.nn.functional.avg_pool2d(x, 9, stride=1, padding=4) * 3
        yield x


def complexity(x) -> float:
    return float(abs(x[..., 1:, :] - x[..., :-1, :]).mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="3MB")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--min-fps", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    app = api.load_fit_app(str(HERE / "adaptive.yaml"))
    outcome = api.fit(app, parse_size(args.budget), min_fps=args.min_fps, say=lambda line: print(line, file=sys.stderr))
    print(fit_text(fit_report(outcome)).split("  why it fits")[0])
    ex = ArenaExecutor(outcome.plan, app.graphs)
    shape = app.graphs[0].shape(app.graphs[0].inputs[0])
    spent, routed, checked = [0.0, 0.0], [0, 0], set()
    for x in frames(shape, args.frames):
        x = x.numpy()
        m = 0 if complexity(x) > 0.5 else 1
        t0 = time.perf_counter()
        outs = run_cnn(ex, m, x)
        spent[m] += time.perf_counter() - t0
        routed[m] += 1
        if m not in checked:
            ref = run_reference(app.graphs[m], x)
            assert all(compare(v, ref[k]).ok for k, v in outs.items()), "routed output differs from the reference"
            checked.add(m)
    print(f"stream of {args.frames} frames, one arena of {outcome.analysis.arena_bytes / 1e6:.3f} MB "
          f"(+ {outcome.analysis.scratch_peak / 1e6:.3f} MB kernel temporaries):")
    for m, name in enumerate(app.names):
        fps = routed[m] / spent[m] if spent[m] else float("nan")
        print(f"  {name:<6} {app.models[m].spec:<18} {routed[m]:>3} frames, {fps:7.1f} fps (verified against the reference)")
    print(f"  whole stream: {args.frames / sum(spent):.1f} fps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
