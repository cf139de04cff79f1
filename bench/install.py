"""The install without PyTorch, and what the main job costs in it (issue 39, point 3).

In a fresh virtual environment (python3.11 -m venv in a temporary folder) the project is
installed as the README installs it, without the torch extra (`pip install -e REPO`, or
`REPO[EXTRAS]` with --extras), and then:

  1. the install's time: venv creation + pip install, wall clock (target <= 60 s);
  2. its size on disk: `du` of the venv (target <= 600 MB, 10^6 bytes);
  3. that torch is not in it;
  4. the peak resident memory of `tightfit fit minakova5 --budget 5kB` run from it, with an
     empty cache (a fresh machine: the zoo model built, the steps profiled), as /usr/bin/time -v
     reports it: the largest process of the command's tree (target <= 250 MB);
  5. the peak of `tightfit run PLAN` on mobilenet_v2's reuse plan (its ONNX file written by this
     interpreter, which needs torch for it; planned in the venv) beside the peak of a Python
     process of the same venv that runs the same file once in onnxruntime (target <= 1.5x);
  6. the wall time of `tightfit fit MOBILENET_V2.onnx --budget 1.2MB --time-limit 30` from an empty
     profile (the cache of step times this venv has not filled yet): within the limit + 20%.

pip's download cache is this machine's: a first download from the registry adds network time.
With --also PYTHON the same fit is measured with another interpreter in the same run (e.g. the
development venv, which has torch), for a before/after.

    python bench/install.py [--extras test] [--also .venv/bin/python] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import add_write_docs, docs_section, header, loaded, verdict

REPO = Path(__file__).resolve().parents[1]
MAIN_JOB = ["fit", "minakova5", "--budget", "5kB"]
TARGET_SECONDS, TARGET_MB, TARGET_PEAK_MB = 60.0, 600.0, 250.0
TARGET_RUN_RATIO = 1.5  # tightfit run's peak over onnxruntime's, the same model
FIT_LIMIT, LIMIT_SLACK = 30.0, 1.2  # fit's --time-limit from an empty profile, and the wall time allowed over it
ORT_RUN = ("import sys, numpy as np, onnxruntime as ort\n"
           "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
           "i = s.get_inputs()[0]\n"
           "s.run(None, {i.name: np.random.default_rng(0).standard_normal(i.shape, dtype=np.float32)})\n")


def _env(cache: Path) -> dict[str, str]:
    """The environment of what runs in the venv: no PYTHONPATH (the venv's own install, not a
    checkout's src), a cache of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TIGHTFIT_CACHE"] = str(cache)
    return env


def install(venv: Path, extras: str, env: dict[str, str]) -> tuple[float, str]:
    """(seconds, '' or the failure's last line) of the README's install into `venv`."""
    spec = f"{REPO}[{extras}]" if extras else str(REPO)
    t0 = time.perf_counter()
    for cmd in ([shutil.which("python3.11") or sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "pip"), "install", "-q", "-e", spec]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            return time.perf_counter() - t0, _last_line(done.stderr or done.stdout)
    return time.perf_counter() - t0, ""


def disk_bytes(folder: Path) -> int:
    """What `du -s` counts: the blocks of every file, each hard-linked file once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def has_torch(python: Path, env: dict[str, str]) -> bool:
    return subprocess.run([str(python), "-c", "import torch"], env=env, capture_output=True).returncode == 0


def peak_of(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float | None, float, str]:
    """(peak resident MB (10^6 bytes) or None, wall seconds, '' or the failure's last line) of
    `cmd` under /usr/bin/time -v."""
    t0 = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *cmd], env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    peak = int(found.group(1)) * 1024 / 1e6 if found else None
    if done.returncode != 0:
        lines = [l for l in done.stderr.splitlines() if l.strip() and not l.startswith("\t")]
        return peak, seconds, _last_line("\n".join(l for l in lines if "Command exited" not in l))
    return peak, seconds, ""


def _last_line(text: str) -> str:
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return lines[-1][:200] if lines else "failed, nothing printed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extras", default="", help="extras to install with the project (e.g. test); never torch here")
    ap.add_argument("--also", help="another Python (e.g. the development venv's) to run the same fit with, for comparison")
    ap.add_argument("--keep", help="make the venv here and keep it (default: a temporary folder, removed)")
    add_write_docs(ap)
    args = ap.parse_args()
    if "torch" in args.extras.split(","):
        ap.error("this benchmark measures the install without the torch extra")
    shown = "python bench/install.py" + (f" --extras {args.extras}" if args.extras else "") + (" --also PYTHON" if args.also else "")
    with docs_section("install", args.write_docs, shown):
        header("Install without torch, and `tightfit fit minakova5 --budget 5kB` in it (issue 39, point 3)",
               profile_id="empty (a fresh cache per run)")
        work = Path(tempfile.mkdtemp(prefix="tightfit-install-"))
        venv = Path(args.keep) if args.keep else work / "venv"
        try:
            rows = measure(venv, args.extras, work, args.also and str(Path(args.also).absolute()))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"\n{'figure':<58} {'measured':>9} {'target':>10}  verdict")
        for figure, value, target, ok, note in rows:
            print(f"{figure:<58} {value:>9} {target:>10}  {ok}{note}")
    return 0


def measure(venv: Path, extras: str, work: Path, also: str | None) -> list[tuple[str, str, str, str, str]]:
    """Rows of (figure, measured, target, verdict, note)."""
    env = _env(work / "cache")
    seconds, failed = install(venv, extras, env)
    spec = f"pip install -e .[{extras}]" if extras else "pip install -e ."
    rows = [(f"install time ({spec}, fresh venv)", f"{seconds:.1f} s", f"<= {TARGET_SECONDS:.0f} s",
             verdict([(not failed, f"install failed: {failed}"), (seconds <= TARGET_SECONDS, "over the target")]), loaded())]
    if failed:
        return rows
    size = disk_bytes(venv) / 1e6
    rows.append(("install size (du of the venv)", f"{size:.0f} MB", f"<= {TARGET_MB:.0f} MB",
                 verdict([(size <= TARGET_MB, "over the target")]), ""))
    torch_in = has_torch(venv / "bin" / "python", env)
    rows.append(("torch in the install", "yes" if torch_in else "no", "no", verdict([(not torch_in, "torch installed")]), ""))
    runs = [("fit minakova5 --budget 5kB, peak RSS, fresh venv", [str(venv / "bin" / "tightfit"), *MAIN_JOB], env)]
    if also:
        also_env = {**_env(work / "cache-also"), "PYTHONPATH": str(REPO / "src")}
        runs.append((f"  the same, {'with' if has_torch(Path(also), also_env) else 'without'} torch: --also",
                     [also, "-m", "tightfit.cli", *MAIN_JOB], also_env))
    for figure, cmd, run_env in runs:
        out = work / f"out-{len(rows)}"
        peak, wall, failed = peak_of([*cmd, "--out", str(out)], run_env, work)
        shown = "-" if peak is None or failed else f"{peak:.0f} MB"
        checks = [(not failed, f"did not run: {failed}"), (peak is not None and peak <= TARGET_PEAK_MB, "over the target")]
        rows.append((f"{figure}, {wall:.0f} s", shown, f"<= {TARGET_PEAK_MB:.0f} MB", verdict(checks), loaded()))
    return rows + run_beside_onnxruntime(venv, env, work)


def run_beside_onnxruntime(venv: Path, env: dict[str, str], work: Path) -> list[tuple[str, str, str, str, str]]:
    """Rows: the peaks of `tightfit run PLAN` (mobilenet_v2's reuse plan) and of onnxruntime
    running the same file, both from the venv, and their ratio."""
    try:
        from tightfit.frontend import zoo

        model = work / "mobilenet_v2.onnx"
        model.write_bytes(zoo.onnx_model("mobilenet_v2"))
    except Exception as e:  # noqa: BLE001 - the row says why (this interpreter has no torch)
        return [("tightfit run PLAN, mobilenet_v2", "-", f"<= {TARGET_RUN_RATIO}x ort", f"not measured: {e}".splitlines()[0], "")]
    plan = work / "mv2-plan.json"
    planned = subprocess.run([str(venv / "bin" / "tightfit"), "plan", str(model), "--out", str(plan)],
                             env=env, cwd=work, capture_output=True, text=True)
    if planned.returncode != 0:
        return [("tightfit plan, mobilenet_v2", "-", "", f"did not run: {_last_line(planned.stderr)}", "")]
    ours, ours_wall, ours_failed = peak_of([str(venv / "bin" / "tightfit"), "run", str(plan)], env, work)
    ort, ort_wall, ort_failed = peak_of([str(venv / "bin" / "python"), "-c", ORT_RUN, str(model)], env, work)
    ratio = ours / ort if ours and ort and not (ours_failed or ort_failed) else None
    checks = [(not ours_failed, f"tightfit run failed: {ours_failed}"), (not ort_failed, f"onnxruntime failed: {ort_failed}"),
              (ratio is not None and ratio <= TARGET_RUN_RATIO, "over the target")]
    return [(f"tightfit run PLAN (mobilenet_v2 reuse), peak RSS, {ours_wall:.0f} s", "-" if ours is None else f"{ours:.0f} MB", "", "", ""),
            (f"onnxruntime, the same file, one run, peak RSS, {ort_wall:.0f} s", "-" if ort is None else f"{ort:.0f} MB", "", "", ""),
            ("  ratio", "-" if ratio is None else f"{ratio:.2f}x", f"<= {TARGET_RUN_RATIO}x", verdict(checks), loaded()),
            fit_within_its_limit(venv, env, work, model)]


def fit_within_its_limit(venv: Path, env: dict[str, str], work: Path, model: Path) -> tuple[str, str, str, str, str]:
    """The row: fit's wall time from an empty profile (a cache of its own) against its --time-limit."""
    fresh = {**env, "TIGHTFIT_CACHE": str(work / "cache-fit")}
    t0 = time.perf_counter()
    done = subprocess.run([str(venv / "bin" / "tightfit"), "fit", str(model), "--budget", "1.2MB", "--time-limit", f"{FIT_LIMIT:g}"],
                          env=fresh, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    checks = [(done.returncode == 0, f"did not run: {_last_line(done.stderr)}"), (wall <= LIMIT_SLACK * FIT_LIMIT, "over the target")]
    return (f"fit mobilenet_v2 --budget 1.2MB --time-limit {FIT_LIMIT:g}, empty profile, wall", f"{wall:.1f} s",
            f"<= {LIMIT_SLACK * FIT_LIMIT:.0f} s", verdict(checks), loaded())


if __name__ == "__main__":
    sys.exit(main())
