"""The command line. A user error (TightfitError) is one line on stderr and exit status 2; any
other exception is an internal bug and keeps its traceback (exit 1)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from tightfit.errors import OptionError, TightfitError


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise OptionError(f"cannot read --input-shape {text!r}: write e.g. 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise OptionError(f"--input-shape {text!r} must be positive dims like 1x3x224x224")
    return dims


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line (OptionError: exit 2, no usage block), and a value that
    starts with '-' and a digit (`--budget -5kB`, `--seed -1`) is read as a value, to be judged by
    the option itself, not taken for an unknown option."""

    def error(self, message: str):
        import re

        hint = f" (see `{self.prog} --help`)" if "unrecognized arguments" in message or "required" in message else ""
        dash = re.match(r"argument (--[\w-]+): expected one argument", message)
        if dash:
            hint = f" (a value that starts with '-' is written {dash.group(1)}=VALUE, e.g. {dash.group(1)}=-O2)"
        raise OptionError(message + hint)

    def _parse_optional(self, arg_string):
        if arg_string[:1] == "-" and (arg_string[1:2].isdigit() or arg_string[1:2] == "."):
            return None
        return super()._parse_optional(arg_string)


def _number(kind: type, what: str, low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse type: a finite number of `kind` within [low, high] (low excluded with low_open)."""
    import math

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (value <= low if low_open else value < low) or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: {what}")
        return value

    return parse


COUNT = _number(int, "a whole number of at least 1", 1)
SECONDS = _number(float, "a number of seconds above 0", 0, low_open=True)
SEED = _number(int, f"a whole number from 0 to {2**32 - 1}", 0, 2**32 - 1)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo name (see `tightfit zoo`), path to .onnx, or package.module:factory")
    p.add_argument("--input-shape", help="NCHW input shape, e.g. 1x3x224x224 (needed for dynamic inputs)")
    _allow_code_arg(p)


def _allow_code_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-code", action="store_true",
                   help="let a plan or application file name a model by module:factory (imports and runs that code)")


def build_parser() -> argparse.ArgumentParser:
    from tightfit import __version__

    parser = Parser(prog="tightfit", description="Make CNN inference fit a memory budget.")
    parser.add_argument("--version", action="version", version=f"tightfit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("zoo", help="list the built-in models")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("inspect", help="per-layer memory accounting of a model")
    _model_args(p)
    p.add_argument("--dtype", default="fp32", help="fp32 (default), fp16, int8")
    p.add_argument("--workspace", default="torch", help="scratch model: torch (our kernels, default), darknet (MAFAT eq. 2.1), none")
    p.add_argument("--batch", type=COUNT, default=1)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="plan a model or an application (YAML/JSON) into one arena")
    _model_args(p)
    from tightfit.techniques.registry import TECHNIQUES

    p.add_argument("--method", default="reuse", help="a technique: " + ", ".join(f"{t.name} ({t.summary})" for t in TECHNIQUES.values())
                   + "; or naive (every tensor its own buffer); default reuse")
    p.add_argument("--rows", type=COUNT, help="with --method parts: output rows per phase of every splittable layer")
    p.add_argument("--phases", default="", help="with --method parts: phases per layer, ID=P,NAME=P,... or max")
    p.add_argument("--hold", default="", help="with --method parts: layers (ID or NAME,...) whose outputs are held whole, "
                   "computed before their readers start (cuts the stream of windows in two)")
    p.add_argument("--budget", help="with --method parts, tiling or vbs: the fastest plan (cost model) whose run memory fits, e.g. 2MB")
    p.add_argument("--tiling", help="with --method tiling: groups FIRST-LAST:NxM[:reuse|:recompute],... (layer ids), e.g. 0-7:5x5,8-15:2x2")
    p.add_argument("--unit", help="with --method vbs: memory granularity of the dynamic program (default 100kB; the paper's 2MB)")
    p.add_argument("--latency", type=SECONDS, help="with --method vbs: seconds that the samples of any pivot step may take at most")
    p.add_argument("--reprofile", action="store_true", help="measure the cost model's step times again")
    _search_args(p)
    p.add_argument("--planner", default="improve", help="offset planner: improve (default), greedy_by_size, greedy_by_conflicts, naive")
    p.add_argument("--order", default="imported", help="layer order: imported (default) or memory")
    p.add_argument("--layout", default="nhwc", choices=("nhwc", "nchw"), help="storage layout of 4-D buffers")
    p.add_argument("--batch", type=COUNT, default=1)
    p.add_argument("--out", help="write the plan here (JSON)")
    p.add_argument("--layout-map", action="store_true", help="print the arena layout")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("csdf", help="the model as a cyclo-static dataflow graph (Minakova & Stefanov Alg. 1)")
    _model_args(p)
    p.add_argument("--phases", default="", help="phases per layer: ID=P,NAME=P,... or 'max' (one row per phase everywhere)")
    p.add_argument("--source-rows", default="", help="rows the input source delivers per phase, e.g. 24,8")
    p.add_argument("--source-phases", type=COUNT, help="the input arrives in this many equal row bands")
    p.add_argument("--itemsize", type=COUNT, default=1, help="bytes per token (default 1, as the paper's examples)")
    p.add_argument("--format", default="dot", choices=("dot", "sdf3", "summary"))

    p = sub.add_parser("run", help="run a model (reference executor) or a plan.json (arena executor)")
    _model_args(p)
    p.add_argument("--verify", action="store_true", help="compare outputs with onnxruntime (model) or the reference executor (plan)")
    p.add_argument("--measure", action="store_true", help="measure peak memory in a fresh process")
    p.add_argument("--enforce", action="store_true", help="run a plan under RLIMIT_DATA = loaded baseline + limit")
    p.add_argument("--limit", help="with --enforce: the limit above the loaded baseline (default: analysed peak + margin)")
    p.add_argument("--input", help="run on this input, not a seeded random one: .npy, or raw NCHW float32 or int8 "
                   "(every CNN's input one after another, as the exported program reads it)")
    p.add_argument("--output", help="write the outputs here: .npy (one output), .npz (by name) or raw float32 "
                   "(every output one after another, as the exported program writes them)")
    p.add_argument("--threads", type=COUNT, default=1,
                   help="threads that share each convolution's output rows (default 1; the outputs are the same bits)")
    p.add_argument("--json", action="store_true")

    _fit_parser(sub)
    _export_parser(sub)
    return parser


def _fit_parser(sub) -> None:
    p = sub.add_parser("fit", help="search every technique for the plan that fits a budget; run, verify, measure, report")
    _model_args(p)
    p.add_argument("--budget", help="memory budget, e.g. 2MB (run memory; with --with-params also the parameters); "
                   "without it, --min-fps: the smallest plan whose measured fps meets it")
    p.add_argument("--with-params", action="store_true", help="the budget bounds parameters + run memory (as the papers count)")
    p.add_argument("--min-fps", help="minimum fps of every CNN, or one per CNN: 30 or 30,200 (checked as measured)")
    p.add_argument("--objective", choices=("speed", "memory"), default="speed",
                   help="with --min-fps: the fastest plan that fits (speed, the default) or the smallest whose measured "
                        "fps meet the minimum (memory); without it, the fastest")
    p.add_argument("--seed", type=SEED, default=0, help="search seed (the same seed gives the same front)")
    p.add_argument("--out", help="write plan.json, report.json, report.txt and memory.png into this folder")
    p.add_argument("--best-effort", action="store_true", help="if nothing meets the constraints, report the closest plan")
    p.add_argument("--thorough", action="store_true",
                   help="search large CNNs (DenseNet's hundreds of layers) as fully as small ones: minutes, not seconds")
    p.add_argument("--batch", type=COUNT, default=1, help="samples per request (every CNN)")
    p.add_argument("--export", help="also export the chosen plan as a C program into this folder (see `tightfit export`)")
    p.add_argument("--force", action="store_true", help="replace existing non-empty --out and --export folders (whole, in one step)")
    p.add_argument("--target", default="host", choices=("host", "aarch64-linux", "cortex-m7", "cortex-m4"),
                   help="with --export: aarch64-linux, the program for a 64-bit Arm Linux board (its Makefile cross-compiles "
                        "it); or a microcontroller: the budget is then what --ram leaves after the stack and the "
                        "program's data, and --export is a firmware project built for --ram and --flash")
    p.add_argument("--ram", help="with a cortex-m --target: the RAM of the device, e.g. 512KiB")
    p.add_argument("--flash", help="with a cortex-m --target: the flash of the device (weights and code), e.g. 2MiB")
    _search_args(p)
    p.add_argument("--json", action="store_true")


def _export_parser(sub) -> None:
    p = sub.add_parser("export", help="compile a plan.json into a self-contained C99 library and test program")
    p.add_argument("plan", help="a plan made by `tightfit plan --out` or `tightfit fit --out`")
    _allow_code_arg(p)
    p.add_argument("--out", required=True, help="folder to write, whole or not at all; an existing non-empty folder only with --force")
    p.add_argument("--force", action="store_true", help="replace an existing non-empty --out folder (whole, in one step)")
    p.add_argument("--name", help="C identifier prefix of the library (default: the model's name)")
    p.add_argument("--weights", default="auto", choices=("auto", "c", "file"),
                   help="weights as const C arrays (c), as weights.bin read once (file), or c up to 16 MB (auto)")
    p.add_argument("--check", action="store_true",
                   help="build with cc, run on the reference executor's seeded input, compare, measure the whole process")
    p.add_argument("--cc", help="C compiler for --check (default $CC or cc; aarch64-linux-gnu-gcc for --target aarch64-linux)")
    p.add_argument("--cflags", help="compiler flags for --check (default: -std=c99 -O3 -march=native -ffp-contract=fast; "
                                    "for aarch64-linux the same without -march=native)")
    p.add_argument("--runs", type=COUNT, default=5, help="with --check: runs timed (the median is printed)")
    p.add_argument("--sanitize", action="store_true", help="with --check: build with -fsanitize=address,undefined as well")
    p.add_argument("--keep-io", action="store_true",
                   help="with --check: keep the checked input (input.bin) and the reference output (reference.bin) in --out")
    p.add_argument("--target", default="host", choices=("host", "aarch64-linux", "cortex-m7", "cortex-m4"),
                   help="host (default); aarch64-linux: the same program cross-compiled for a 64-bit Arm Linux board "
                        "(aarch64-linux-gnu-gcc, NEON kernels; --cflags '... -DTF_SIMD=0' for the portable ones), with "
                        "--check run under qemu-aarch64; or a microcontroller: --out is then a firmware project (library, "
                        "startup code, linker script, test main, semihosting shim, Makefile with run-qemu), built with "
                        "arm-none-eabi-gcc and with --check run under qemu")
    p.add_argument("--ram", help="with a cortex-m target: the device's RAM, e.g. 512KiB: it holds the stack (8 KiB), "
                   "the program's data and the arena")
    p.add_argument("--flash", help="with a cortex-m target: the device's flash, e.g. 2MiB: it holds the code and the weights")
    p.add_argument("--json", action="store_true")


def _search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--time-limit", type=SECONDS, default=60.0,
                   help="seconds of search (default 60; profiling new step shapes not counted): then the best found")
    p.add_argument("--progress", action="store_true",
                   help="progress lines on stderr for every phase (shown anyway when stderr is a terminal)")


def _say(args: argparse.Namespace):
    """Progress lines on stderr when asked or on a terminal (else errors stay one line)."""
    if not (args.progress or sys.stderr.isatty()):
        return lambda line: None
    return lambda line: print(line, file=sys.stderr, flush=True)


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived: unwinds the command so that its `finally` blocks run."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_LOADING_LIBRARIES = False  # True while the libraries load: nothing started yet, nothing to clean up


def _load_libraries() -> None:
    """The compiled libraries every command needs (numpy, onnx, and the op registry with what
    its kernels load), imported while an interrupt simply ends the process: an exception raised
    into a C extension's import can come out as another (a TypeError, a traceback)."""
    global _LOADING_LIBRARIES
    _LOADING_LIBRARIES = True
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401

        import tightfit.ops  # noqa: F401
    finally:
        _LOADING_LIBRARIES = False


def _on_signal(signum: int, frame) -> None:
    """End every child first (they could outlive us or write on), then unwind; a second signal
    waits until the cleanup is done."""
    from tightfit import children

    for s in children.HANDLED_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if _LOADING_LIBRARIES:
        print(f"tightfit: interrupted ({signal.Signals(signum).name}); nothing partial was left", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    children.kill_all()
    raise Interrupted(signum)


def _stopped(signum: int) -> int:
    """After an interruption: no child, no temporary left; the conventional status 128 + signal."""
    from tightfit import atomic, children

    children.kill_all()
    atomic.remove_temporaries()
    print(f"tightfit: interrupted ({signal.Signals(signum).name}); nothing partial was left", file=sys.stderr)
    return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    from tightfit import children

    # Handlers first: building the parser imports the op registry (the techniques' options), a second or more.
    before = {s: signal.signal(s, _on_signal) for s in children.HANDLED_SIGNALS}
    try:
        _load_libraries()
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except TightfitError as e:
        print(f"tightfit: error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        return _stopped(e.signum)
    except KeyboardInterrupt:
        return _stopped(signal.SIGINT)
    except BrokenPipeError:  # e.g. `tightfit zoo | head`
        sys.stderr.close()
        return 0
    finally:  # a caller's own handlers again (main() called in a test, say)
        for s, handler in before.items():
            signal.signal(s, handler)


def cmd_zoo(args: argparse.Namespace) -> int:
    from tightfit.frontend import zoo

    entries = zoo.entries()
    if args.json:
        print(json.dumps([{"name": e.name, "input_shape": list(e.input_shape), "source": e.source, "about": e.about} for e in entries], indent=1))
        return 0
    width = max(len(e.name) for e in entries)
    for e in entries:
        print(f"{e.name:<{width}}  {'x'.join(map(str, e.input_shape)):<14}  {e.source:<11}  {e.about}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    import tightfit
    from tightfit.report import inspect_json, inspect_table

    graph = tightfit.load(args.model, _shape(args.input_shape) if args.input_shape else None)
    if args.batch < 1:
        raise OptionError("--batch must be at least 1")
    mem = tightfit.inspect(graph, args.dtype, args.workspace, args.batch)
    print(json.dumps(inspect_json(mem), indent=1) if args.json else inspect_table(mem))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    import time

    import tightfit
    from tightfit.plan.check import check_plan
    from tightfit.report import plan_report, plan_text

    if args.method != "parts" and (args.rows or args.phases):
        raise OptionError("--rows and --phases go with --method parts")
    if args.rows and args.phases:
        raise OptionError("give --rows or --phases, not both")
    phases = None
    if args.phases:
        phases = parse_phases(args.phases, tightfit.load(args.model, _shape(args.input_shape) if args.input_shape else None))
    budget = cost = None
    if args.budget is not None:
        from tightfit.runtime.cost import CostModel
        from tightfit.units import parse_size

        budget, cost = parse_size(args.budget), CostModel.default(args.reprofile)
    if args.method != "vbs" and (args.unit or args.latency is not None):
        raise OptionError("--unit and --latency go with --method vbs")
    unit = None
    if args.unit:
        from tightfit.units import parse_size

        unit = parse_size(args.unit)
    t0 = time.perf_counter()
    p, graphs = tightfit.api.plan(args.model, args.method, args.planner, args.order, args.layout, args.batch,
                                  _shape(args.input_shape) if args.input_shape else None, phases, args.rows,
                                  budget, cost, args.tiling, unit, args.latency,
                                  [int(h) if h.isdigit() else h for h in args.hold.split(",") if h],
                                  time_limit=args.time_limit if budget is not None else None, say=_say(args),
                                  allow_code=args.allow_code)
    seconds = time.perf_counter() - t0
    report = plan_report(p, graphs, check_plan(p, graphs), seconds)
    if args.method == "vbs":
        from tightfit.vbs_calibration import compare_methods

        report["vbs"] = compare_methods(p, graphs[0], cost, args.planner, args.layout)
    if args.out:
        tightfit.api.write_plan(p, args.out)
        report["written"] = args.out
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(plan_text(report))
        if "vbs" in report:
            from tightfit.report import vbs_text

            print(vbs_text(report["vbs"], graphs[0]))
        if args.layout_map:
            from tightfit.plan.lifetimes import lifetimes
            from tightfit.plan.offsets import format_layout

            life = lifetimes(p, graphs)
            print(format_layout(life.reqs, life.arena_offsets(p)))
    return 0


def parse_phases(text: str, graph) -> dict:
    from tightfit.analysis.csdf import max_phases

    if text.strip() == "max":
        return max_phases(graph)
    phases: dict = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = item.rpartition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise OptionError(f"cannot read --phases item {item!r}: write ID=P or NAME=P with P >= 1")
        phases[int(key) if key.isdigit() else key] = int(value)
    return phases


def cmd_csdf(args: argparse.Namespace) -> int:
    import tightfit
    from tightfit.analysis import csdf as C

    graph = tightfit.load(args.model, _shape(args.input_shape) if args.input_shape else None)
    if args.source_rows and args.source_phases:
        raise OptionError("give --source-rows or --source-phases, not both")
    try:
        rows = [int(r) for r in args.source_rows.split(",")] if args.source_rows else args.source_phases
    except ValueError:
        raise OptionError(f"cannot read --source-rows {args.source_rows!r}: write rows per phase, e.g. 24,8") from None
    if rows is not None and (min(rows) if isinstance(rows, list) else rows) < 1:
        raise OptionError("--source-rows and --source-phases must be positive")
    g = C.to_csdf(graph, parse_phases(args.phases, graph), rows, args.itemsize)
    C.check_balance(g)
    if args.format == "sdf3":
        print(C.to_sdf3_xml(g))
    elif args.format == "dot":
        print(C.to_dot(g))
    else:
        order = C.firing_order(g)
        sizes = C.buffer_sizes(g, order)
        print(f"{graph.name}: {len(g.actors)} actors, {len(g.channels)} channels, {len(order)} firings; balance holds")
        for name, size in sizes.items():
            print(f"  {name:<40} {size:>12} B")
        print(f"  {'total (no reuse)':<40} {sum(sizes.values()):>12} B")
        print("  order: " + C.describe_order(g, order))
        print(_parts_arena_line(args.model, graph, parse_phases(args.phases, graph), rows, args.itemsize))
    return 0


def _parts_arena_line(spec: str, graph, phases: dict, source_rows, item: int) -> str:
    """The arena of the parts plan of these phases, buffers shared by lifetime, at the same bytes
    per element as the summary above."""
    from tightfit.graph.ir import DTYPE_BYTES
    from tightfit.plan.check import check_plan
    from tightfit.techniques.parts.planner import plan_parts
    from tightfit.techniques.interface import PlannedModel

    dtype = next((d for d, n in DTYPE_BYTES.items() if n == item), None)
    if dtype is None:
        return f"  arena with reuse: not planned ({item}-byte elements; plans take {sorted(set(DTYPE_BYTES.values()))})"
    plan_ = plan_parts(PlannedModel(graph, spec), phases, source_rows, dtype=dtype)
    rep = check_plan(plan_, [graph])
    return (f"  arena with reuse (the parts plan of these phases, 64-byte aligned offsets): {rep.arena_bytes} B; "
            f"buffers without reuse {sum(b.nbytes for b in plan_.buffers)} B; lower bound {rep.lower_bound} B")


def cmd_run(args: argparse.Namespace) -> int:
    if args.model.endswith(".json"):
        return cmd_run_plan(args)
    if args.enforce:
        raise OptionError("--enforce runs a plan: give a plan.json made by `tightfit plan`")
    import tightfit
    from tightfit.report import run_report
    from tightfit.runtime.enforce import require_available
    from tightfit.runtime.reference import random_input

    shape = _shape(args.input_shape) if args.input_shape else None
    graph = tightfit.load(args.model, shape)
    need = tightfit.inspect(graph, batch=graph.shape(graph.inputs[0])[0])
    # onnxruntime (--verify) holds the model's weights and activations a second time.
    require_available((need.layer_peak_bytes + need.param_bytes) * (2 if args.verify else 1),
                      "running the model layer by layer" + (" and in onnxruntime (--verify)" if args.verify else ""))
    x = tightfit.api.read_inputs(args.input, [graph.shape(graph.inputs[0])])[0] if args.input else random_input(graph)
    result = tightfit.run(graph, x, threads=args.threads)
    report = run_report(graph, result)
    if args.output:
        report["written"] = {"file": args.output, "outputs": tightfit.api.write_outputs(args.output, list(result.outputs.items()))}
    if args.verify:
        from tightfit.verify import verify_with_onnxruntime

        report["verify"] = verify_with_onnxruntime(args.model, shape, graph, x, result.outputs).as_dict()
    if args.measure:
        from tightfit.runtime.measure import measure_subprocess

        m = measure_subprocess({"kind": "reference", "model": args.model, "input_shape": list(shape) if shape else None})
        report["measured"] = {"baseline_bytes": m.baseline_bytes, "run_bytes": m.run_bytes, "seconds": m.seconds,
                              "uncertainty_bytes": m.uncertainty_bytes}
        report["analysed_layer_peak_bytes"] = need.layer_peak_bytes
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        from tightfit.report import run_text

        print(run_text(report))
    return 1 if args.verify and not report["verify"]["ok"] else 0


def cmd_run_plan(args: argparse.Namespace) -> int:
    import tightfit
    from tightfit.plan.check import check_plan
    from tightfit.report import plan_run_text

    plan_, graphs = tightfit.api.load_plan(args.model, allow_code=args.allow_code)
    analysis = check_plan(plan_, graphs)
    report: dict = {"plan": args.model, "arena_bytes": analysis.arena_bytes, "scratch_peak_bytes": analysis.scratch_peak,
                    "analysed_peak_bytes": analysis.peak_bytes, "lower_bound_bytes": analysis.lower_bound}
    if args.enforce:
        from tightfit.runtime.enforce import MARGIN
        from tightfit.runtime.measure import measure_subprocess
        from tightfit.units import parse_size

        limit = parse_size(args.limit) if args.limit else analysis.peak_bytes + MARGIN
        m = measure_subprocess({"kind": "plan", "plan": args.model, "enforce_bytes": limit,
                                "allow_code": args.allow_code})
        report["enforced_limit_bytes"] = limit
        report["enforced_run_bytes"] = m.run_bytes
    elif args.limit:
        raise OptionError("--limit goes with --enforce")
    shapes = [(ref.batch,) + g.shape(g.inputs[0])[1:] for g, ref in zip(graphs, plan_.models)]
    xs = tightfit.api.read_inputs(args.input, shapes) if args.input else tightfit.api.plan_inputs(graphs, plan_)
    outs, seconds = tightfit.api.execute(plan_, graphs, xs, threads=args.threads)
    report["seconds"] = seconds
    report["outputs"] = {f"{m}:{k}": list(v.shape) for m, o in enumerate(outs) for k, v in o.items()}
    if args.output:
        named = [(k if len(outs) == 1 else f"cnn{m}_{k}", v) for m, o in enumerate(outs) for k, v in o.items()]
        report["written"] = {"file": args.output, "outputs": tightfit.api.write_outputs(args.output, named)}
    if args.verify:
        from tightfit.reference import run_reference
        from tightfit.verify import compare

        worst = None
        for g, x, o in zip(graphs, xs, outs):
            ref = run_reference(g, x)
            for k, v in o.items():
                c = compare(v, ref[k])
                worst = c if worst is None or (not c.ok) or (worst.ok and c.max_abs_diff > worst.max_abs_diff) else worst
        report["verify"] = worst.as_dict() if worst else {"ok": True}
    if args.measure:
        from tightfit.runtime.measure import measure_subprocess

        m = measure_subprocess({"kind": "plan", "plan": args.model, "allow_code": args.allow_code})
        report["measured"] = {"baseline_bytes": m.baseline_bytes, "run_bytes": m.run_bytes, "seconds": m.seconds,
                              "uncertainty_bytes": m.uncertainty_bytes}
    print(json.dumps(report, indent=1) if args.json else plan_run_text(report))
    return 1 if args.verify and not report["verify"]["ok"] else 0


def _fit_options(args: argparse.Namespace) -> int | None:
    """The run-memory budget: --budget, or with a cortex-m target what --ram leaves after the
    stack and the program's other data (its first guess: RAM_RESERVE)."""
    from tightfit import atomic
    from tightfit.units import parse_size

    for option, folder in (("--out", args.out), ("--export", args.export)):
        if folder:  # refused now, not after minutes of search
            atomic.check_output_folder(folder, args.force, option)
    if args.out and args.export and os.path.abspath(args.out) == os.path.abspath(args.export):
        raise OptionError("--out and --export name the same folder: give each its own")
    if not _is_mcu(args.target):
        if args.ram or args.flash:
            raise OptionError("--ram and --flash go with a cortex-m --target")
        if args.target != "host" and not args.export:
            raise OptionError(f"--target {args.target} goes with --export (the folder to write the program into)")
        return parse_size(args.budget) if args.budget is not None else None
    from tightfit.export import mcu

    if not (args.ram and args.flash and args.export):
        raise OptionError(f"--target {args.target} needs --ram, --flash and --export, e.g. --ram 512KiB --flash 2MiB --export fw")
    if args.budget is not None or args.with_params or args.min_fps:
        raise OptionError(f"with --target {args.target} the budget is what --ram leaves (the weights live in --flash): "
                          "leave out --budget, --with-params and --min-fps")
    left = parse_size(args.ram) - mcu.DEFAULT_STACK_BYTES - RAM_RESERVE
    if left <= 0:
        raise OptionError(f"--ram {args.ram} leaves nothing for the arena after the {mcu.DEFAULT_STACK_BYTES} B stack")
    return left


RAM_RESERVE = 256  # bytes of RAM first set aside for the test program's own .data/.bss (measured: ~112)
FIT_TRIES = 3      # a RAM overflow at link time lowers the arena budget by as much and fits again


def cmd_fit(args: argparse.Namespace) -> int:
    from tightfit import fit as F

    budget = _fit_options(args)
    app = F.load_fit_app(args.model, _shape(args.input_shape) if args.input_shape else None, args.batch,
                         allow_code=args.allow_code)
    if _is_mcu(args.target):
        from tightfit.units import human, parse_size

        weights = F.param_bytes(app)
        if weights >= parse_size(args.flash):  # known now: no search for a program that cannot fit
            raise OptionError(f"the weights alone ({weights} B, {human(weights)}) do not fit --flash {args.flash}")
    for attempt in range(FIT_TRIES):
        try:
            outcome = F.fit(app, budget, args.with_params, args.min_fps, args.seed, args.best_effort,
                            thorough=args.thorough, objective=args.objective, time_limit=args.time_limit, say=_say(args))
        except F.VerificationFailed as e:  # an internal bug: reported in one line, nothing written
            print(f"tightfit: internal error: {e}", file=sys.stderr)
            return 1
        from tightfit.export.errors import DoesNotFitError
        from tightfit.report import fit_report, fit_text, write_fit_outputs

        report = fit_report(outcome)
        if _is_mcu(args.target):
            report["target_budget"] = (f"budget: what --ram {args.ram} leaves after the {mcu_stack()} B stack and the "
                                       f"program's own data: {budget} B")
        try:
            if args.export:
                report["exported"] = _fit_export(args, outcome)
            break
        except DoesNotFitError as e:
            if not e.ram_overflow or e.flash_overflow or attempt == FIT_TRIES - 1:
                raise
            # The program's data took more than set aside: a plan smaller by as much as it overflowed.
            budget = min(budget, outcome.memory_bytes) - -(-e.ram_overflow // 64) * 64
            _say(args)(f"fit: the program's own data took {e.ram_overflow} B more RAM; fitting again to {budget} B")
    if args.out:
        write_fit_outputs(outcome, args.out, report, args.force)
        report["written"] = args.out
    print(json.dumps(report, indent=1, default=str) if args.json else "\n".join([fit_text(report), *_exported_lines(report)]))
    return 0


def _fit_export(args: argparse.Namespace, outcome) -> dict:
    """The chosen plan exported into --export: the host C program, or with a cortex-m target the
    firmware project, built (whole or not at all)."""
    from dataclasses import asdict

    from tightfit import atomic
    from tightfit.export import default_name, generate
    from tightfit.export.build import write_files

    weights = "c" if _is_mcu(args.target) else "auto"
    sources = generate(outcome.plan, outcome.app.graphs, default_name(outcome.plan), weights)
    with atomic.output_folder(args.export, args.force, "--export") as stage:
        if args.target == "host":
            write_files(sources, stage)
            return {"folder": args.export, "name": sources.name, "steps": sources.steps}
        if not _is_mcu(args.target):
            from tightfit.export import linux

            linux.write_files(sources, stage, args.target)
            return {"folder": args.export, "name": sources.name, "steps": sources.steps, "target": args.target}
        from tightfit.export import mcu
        from tightfit.units import parse_size

        project = mcu.write_project(stage, sources, args.target, parse_size(args.ram), parse_size(args.flash))
        built = mcu.build_project(stage, project)
        return {"folder": args.export, "name": sources.name, "steps": sources.steps, "target": args.target,
                "memory": built.memory_report(), "mcu": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(built).items()}}


def mcu_stack() -> int:
    from tightfit.export import mcu

    return mcu.DEFAULT_STACK_BYTES


def _exported_lines(report: dict) -> list[str]:
    e = report.get("exported")
    if not e:
        return []
    if "target" not in e:
        return [f"  exported to {e['folder']}/: build with make -C {e['folder']}"]
    if not _is_mcu(e["target"]):
        return [f"  exported to {e['folder']}/ for {e['target']}: build with make -C {e['folder']} (a cross compiler), "
                f"run here with make -C {e['folder']} run-qemu"]
    return [f"  {report['target_budget']}",
            f"  exported to {e['folder']}/ as a {e['target']} firmware project: make -C {e['folder']}, "
            f"make -C {e['folder']} run-qemu", f"  {e['memory']}"]


def _is_mcu(target: str) -> bool:
    return target.startswith("cortex-m")


def _export_options(args: argparse.Namespace) -> None:
    if not _is_mcu(args.target) and (args.ram or args.flash):
        raise OptionError("--ram and --flash go with a cortex-m target")
    if args.target == "aarch64-linux" and args.sanitize:
        raise OptionError("--sanitize goes with the host target (the sanitizers do not run under qemu-aarch64)")
    if _is_mcu(args.target) and not (args.ram and args.flash):
        raise OptionError(f"--target {args.target} needs --ram and --flash, e.g. --ram 512KiB --flash 2MiB")
    if _is_mcu(args.target) and args.weights == "file":
        raise OptionError(f"--target {args.target} keeps the weights in flash: --weights file goes with the host target")
    if args.runs < 1:
        raise OptionError("--runs must be at least 1")
    if args.keep_io and not args.check:
        raise OptionError("--keep-io goes with --check (it keeps the checked input and reference output)")
    if _is_mcu(args.target) and (args.sanitize or args.cc or args.cflags):
        raise OptionError("--sanitize, --cc and --cflags go with the host target")


def cmd_export(args: argparse.Namespace) -> int:
    import tightfit
    from tightfit import atomic

    _export_options(args)
    atomic.check_output_folder(args.out, args.force)  # before the plan is loaded: no work wasted
    plan_, graphs = tightfit.api.load_plan(args.plan, allow_code=args.allow_code)
    # Everything, --check's build and run included, happens in a staged folder that takes
    # --out's place only at the end: a failure or a signal leaves --out as it was.
    with atomic.output_folder(args.out, args.force) as stage:
        report, lines, ok = export_into(args, plan_, graphs, stage)
    print(json.dumps(report, indent=1, default=str) if args.json else "\n".join(lines))
    return 0 if ok else 1


def export_into(args: argparse.Namespace, plan_, graphs, stage: Path) -> tuple[dict, list[str], bool]:
    """Export (and with --check build, run and compare) into `stage`, which becomes --out."""
    from tightfit.export import default_name, generate
    from tightfit.export.build import write_files

    weights = "c" if _is_mcu(args.target) and args.weights == "auto" else args.weights
    sources = generate(plan_, graphs, args.name or default_name(plan_), weights)
    if _is_mcu(args.target):
        return _export_mcu(args, plan_, graphs, sources, stage)
    if args.target != "host":
        return _export_linux(args, plan_, graphs, sources, stage)
    write_files(sources, stage)
    report: dict = {"plan": args.plan, "folder": args.out, "name": sources.name, "steps": sources.steps,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "weights_file": sources.weights_in_file}
    lines = [f"exported {sources.steps} steps to {args.out}/ ({sources.name}.c, {sources.name}.h, tf_kernels.c, main.c, Makefile"
             + (", weights.bin" if sources.weights_in_file else "") + ")",
             f"build: make -C {args.out}   run: {args.out}/{sources.name} INPUT.bin OUTPUT.bin [RUNS]"
             f"   (make -C {args.out} debug: the same program under -fsanitize=address,undefined)"]
    if not args.check:
        return report, lines, True
    return _check_host(args, plan_, graphs, sources, stage, report, lines)


def _check_host(args, plan_, graphs, sources, stage: Path, report: dict, lines: list[str]) -> tuple[dict, list[str], bool]:
    import shlex

    import tightfit

    flags = shlex.split(args.cflags) if args.cflags else None
    result = tightfit.api.check_export(plan_, graphs, sources, stage, args.cc, flags, args.runs,
                                       keep_io=stage if args.keep_io else None)
    report["check"] = {k: v for k, v in result.__dict__.items() if k != "built"} | {"budget_bytes": result.budget_bytes}
    lines += result.lines()
    if args.keep_io:
        lines.append(f"kept: {args.out}/input.bin (the checked input) and {args.out}/reference.bin (the reference output), "
                     f"float32 NCHW: {args.out}/{sources.name} {args.out}/input.bin out.bin, then compare out.bin with reference.bin")
    ok = result.ok
    if args.sanitize:
        clean = tightfit.api.check_export(plan_, graphs, sources, stage, args.cc, flags, 1, sanitize=True)
        report["sanitized"] = {"ok": clean.ok}
        lines.append("under -fsanitize=address,undefined: " + ("no reports, outputs match" if clean.ok else "outputs DIFFER"))
        ok = ok and clean.ok
    return report, lines, ok


def _export_linux(args, plan_, graphs, sources, stage: Path) -> tuple[dict, list[str], bool]:
    """The host program for a Linux board (--target aarch64-linux), with --check cross-built and
    run under qemu."""
    import shlex

    import tightfit
    from tightfit.export import linux

    linux.write_files(sources, stage, args.target)
    target = linux.linux_target(args.target)
    report: dict = {"plan": args.plan, "folder": args.out, "name": sources.name, "steps": sources.steps, "target": args.target,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "weights_file": sources.weights_in_file}
    lines = [f"exported {sources.steps} steps to {args.out}/ for {args.target} ({sources.name}.c, {sources.name}.h, "
             f"tf_kernels.c, main.c, Makefile" + (", weights.bin" if sources.weights_in_file else "") + ")",
             f"build: make -C {args.out} (NEON kernels; make -C {args.out} portable: the portable ones) with {target.cc}"
             f"   run here: make -C {args.out} run-qemu   on the board: ./{sources.name} INPUT.bin OUTPUT.bin [RUNS]"]
    if not args.check:
        return report, lines, True
    flags = shlex.split(args.cflags) if args.cflags else None
    got = tightfit.api.check_export_linux(plan_, graphs, sources, stage, args.target, flags, args.cc,
                                          keep_io=stage if args.keep_io else None)
    report["check"] = {k: v for k, v in got.__dict__.items() if k != "built"}
    lines += got.lines()
    return report, lines, got.ok


def _export_mcu(args, plan_, graphs, sources, stage: Path) -> tuple[dict, list[str], bool]:
    from dataclasses import asdict

    import tightfit
    from tightfit.export import mcu
    from tightfit.units import parse_size

    project = mcu.write_project(stage, sources, args.target, parse_size(args.ram), parse_size(args.flash))
    built = mcu.build_project(stage, project)
    report: dict = {"plan": args.plan, "folder": args.out, "name": sources.name, "steps": sources.steps,
                    "arena_bytes": sources.arena_bytes, "weight_bytes": sources.weight_bytes,
                    "mcu": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(built).items()}}
    report["mcu"]["elf"] = str(Path(args.out) / built.elf.name)
    lines = [f"exported {sources.steps} steps to {args.out}/ as a {args.target} firmware project: the library "
             f"({sources.name}.c, {sources.name}.h, tf_kernels.c/.h), {', '.join(project.support)}",
             f"build: make -C {args.out}   run under qemu: make -C {args.out} run-qemu "
             f"(reads {args.out}/input.bin, writes {args.out}/output.bin: float32 NCHW)",
             built.memory_report()]
    if not args.check:
        return report, lines, True
    if built.qemu_problem:
        report["mcu_check"] = {"ran": False, "why": built.qemu_problem}
        lines.append(f"--check not run: {built.qemu_problem}")
        return report, lines, True
    got = tightfit.api.check_export_mcu(plan_, graphs, built, keep_io=stage if args.keep_io else None)
    report["mcu_check"] = asdict(got)
    lines.append(got.summary())
    return report, lines, got.ok


COMMANDS = {"zoo": cmd_zoo, "inspect": cmd_inspect, "plan": cmd_plan, "csdf": cmd_csdf, "run": cmd_run, "fit": cmd_fit,
            "export": cmd_export}

if __name__ == "__main__":
    sys.exit(main())
