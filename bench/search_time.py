"""Issue 20, acceptance 3: `fit` and `plan --budget` on every zoo model at 1/2 and 1/8 of its reuse
arena finish within `--time-limit` plus the profiling they print, with progress shown.

Each command runs as the CLI in a fresh process with `--progress`; its stderr is parsed for the
line the profiling stage prints ("search S s of L s allowed; profiling N new step shapes M s,
finding them F s ..."). Columns: wall seconds of the whole command (loading, profiling, search,
verifying, fit's timing and measuring), the last search pass's seconds, profiling (measuring
new step shapes) and finding (the search passes before the last, which found them), the rest
(wall less those: loading, placing, checking, fit's verifying and measuring), the progress lines
printed, the exit status (2: nothing fits, one line) and the verdict: the search within the limit
(overrun by one candidate at most: 10% allowed) and progress shown.

    PYTHONPATH=src python bench/search_time.py [--models a,b] [--commands fit,parts,tiling]
                                              [--fractions 2,8] [--time-limit 60]
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import header, loaded, verdict  # noqa: E402

SEARCH_LINE = re.compile(r"search ([\d.]+) s(?: of [\d.]+ s allowed)?; profiling (\d+) new step shapes ([\d.]+) s"
                         r"(?:, finding them ([\d.]+) s)?")
SLACK = 1.10  # a search checks its deadline between candidates: it may overrun by one


def reuse_run_bytes(model: str) -> int:
    import tightfit
    from tightfit.techniques.interface import run_memory

    plan, _ = tightfit.api.plan(model)
    return run_memory(plan)


def command(kind: str, model: str, budget: int, limit: float) -> list[str]:
    base = [sys.executable, "-m", "tightfit.cli"]
    if kind == "fit":
        return base + ["fit", model, "--budget", f"{budget}B", "--time-limit", f"{limit:g}", "--progress"]
    return base + ["plan", model, "--method", kind, "--budget", f"{budget}B", "--time-limit", f"{limit:g}", "--progress"]


def run(kind: str, model: str, budget: int, limit: float) -> dict:
    t0 = time.perf_counter()
    done = subprocess.run(command(kind, model, budget, limit), capture_output=True, text=True,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
    wall = time.perf_counter() - t0
    lines = done.stderr.splitlines()
    search = profiling = finding = 0.0
    shapes, found = 0, False
    for line in lines:
        m = SEARCH_LINE.search(line)
        if m:
            found = True
            search += float(m.group(1))
            shapes += int(m.group(2))
            profiling += float(m.group(3))
            finding += float(m.group(4) or 0)
    progress = sum(1 for l in lines if ":" in l and not l.startswith("tightfit:"))
    last = lines[-1] if lines else ""
    said = verdict([(found, f"no search line printed (last: {last[:80]})"),
                    (search <= limit * SLACK, f"search {search:.1f} s > {limit:g} s + {SLACK - 1:.0%}"),
                    (progress > 1, f"{progress} progress lines"),
                    (done.returncode in (0, 2), f"exit {done.returncode}: {last[:80]}")])
    return dict(wall=wall, search=search, profiling=profiling, finding=finding, shapes=shapes, progress=progress,
                status=done.returncode, ok=said == "yes", said=said, last=last)


def main() -> None:
    from tightfit.frontend.zoo import names
    from tightfit.units import human

    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(names()))
    ap.add_argument("--commands", default="fit,parts,tiling")
    ap.add_argument("--fractions", default="2,8")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    header(f"search time: fit and plan --budget within --time-limit {args.time_limit:g} s (issue 20, acceptance 3)")
    print(f"{'model':22} {'command':7} {'budget':>14} {'wall s':>7} {'search':>7} {'profile':>7} {'finding':>7} "
          f"{'rest':>6} {'shapes':>6} {'lines':>5} {'rc':>2}  within", flush=True)
    failed = 0
    for model in args.models.split(","):
        reuse = reuse_run_bytes(model)
        for frac in (int(f) for f in args.fractions.split(",")):
            budget = reuse // frac
            for kind in args.commands.split(","):
                r = run(kind, model, budget, args.time_limit)
                rest = r["wall"] - r["search"] - r["profiling"] - r["finding"]
                failed += not r["ok"]
                print(f"{model:22} {kind:7} {'1/' + str(frac):>4} {human(budget):>9} {r['wall']:7.1f} "
                      f"{r['search']:7.1f} {r['profiling']:7.1f} {r['finding']:7.1f} {rest:6.1f} {r['shapes']:6d} "
                      f"{r['progress']:5d} {r['status']:2d}  {r['said']}{loaded()}",
                      flush=True)
    print(f"{failed} runs not within the limit" if failed else "every run within the limit")


if __name__ == "__main__":
    main()
