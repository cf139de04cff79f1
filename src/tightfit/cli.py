"""The command line: it only parses. argparse -> the command's options object (tightfit.options)
-> the command's pipeline (tightfit.pipeline) -> print its report (--json) or text. A user error
(TightfitError) is one line on stderr and exit status 2; any other exception is an internal bug
and keeps its traceback (exit 1).

`import tightfit.cli` loads no compiled library: the signal handlers are installed first, then
the libraries load (_load_libraries) and the pipeline is imported (main), so that an interrupt
while they load is a clean exit, not a traceback. That, not a cycle, is why main imports it."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import sys
from typing import Callable, Sequence

from tightfit import __version__, atomic, children
from tightfit.errors import OptionError, TightfitError, VerificationFailed
from tightfit.options import CsdfOptions, ExportOptions, FitOptions, InspectOptions, PlanOptions, RunOptions, is_plan_file
from tightfit.units import parse_size


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
    p.add_argument("--input-shape", help="NCHW input shape, e.g. 1x3x224x224 (needed for dynamic inputs); a model of "
                   "several inputs: NAME=SHAPE,NAME=SHAPE")
    _allow_code_arg(p)


def _allow_code_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-code", action="store_true",
                   help="let a plan or application file name a model by module:factory (imports and runs that code)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tightfit", description="Make CNN inference fit a memory budget.")
    parser.add_argument("--version", action="version", version=f"tightfit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("zoo", help="list the built-in models")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("inspect", help="per-layer memory accounting of a model")
    _model_args(p)
    p.add_argument("--dtype", default="fp32", help="fp32 (default), fp16, int8")
    p.add_argument("--workspace", default="none", help="scratch model: none (our C kernels need no scratch, default), darknet (MAFAT eq. 2.1's im2col)")
    p.add_argument("--batch", type=COUNT, default=1)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("plan", help="plan a model or an application (YAML/JSON) into one arena")
    _model_args(p)
    from tightfit.techniques.registry import TECHNIQUES  # the techniques' names: after the handlers (see main)

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
    p.add_argument("--inplace", action="store_true", help="lay layers' outputs over their own inputs' bytes where the "
                   "kernel's walk allows (in-place depthwise and int8 convolutions, elementwise ops) and the arena shrinks")
    p.add_argument("--stream-outputs", action="store_true", help="--method parts: hand the model's outputs over by rows "
                   "as they are computed (the arena never holds them whole; the caller takes the rows)")
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
    p.add_argument("--inplace", action="store_true", help="place every candidate plan with layers' outputs over their own "
                   "inputs' bytes where the kernel's walk allows (as `plan --inplace`): plans the search finds over the "
                   "budget may fit so")
    p.add_argument("--thorough", action="store_true",
                   help="search large CNNs (DenseNet's hundreds of layers) as fully as small ones: minutes, not seconds")
    p.add_argument("--batch", type=COUNT, default=1, help="samples per request (every CNN)")
    p.add_argument("--threads", type=COUNT, default=1,
                   help="threads the plans that fit are timed with and the chosen one is verified and measured with "
                        "(default 1; its fps are reported at this count)")
    p.add_argument("--export", help="also export the chosen plan as a C program into this folder (see `tightfit export`)")
    p.add_argument("--force", action="store_true", help="replace existing non-empty --out and --export folders (whole, in one step)")
    p.add_argument("--stream-outputs", action="store_true", help="plans by parts may hand the outputs over by rows as "
                   "they are computed (the arena never holds them whole; the caller takes the rows)")
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
                   help="seconds of search, profiling new step shapes included (default 60): then the best found")
    p.add_argument("--progress", action="store_true",
                   help="progress lines on stderr for every phase (shown anyway when stderr is a terminal)")


def _say(args: argparse.Namespace) -> Callable[[str], None]:
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
    for s in children.HANDLED_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    if _LOADING_LIBRARIES:
        print(f"tightfit: interrupted ({signal.Signals(signum).name}); nothing partial was left", file=sys.stderr, flush=True)
        os._exit(128 + signum)
    children.kill_all()
    raise Interrupted(signum)


def _stopped(signum: int) -> int:
    """After an interruption: no child, no temporary left; the conventional status 128 + signal."""
    children.kill_all()
    atomic.remove_temporaries()
    print(f"tightfit: interrupted ({signal.Signals(signum).name}); nothing partial was left", file=sys.stderr)
    return 128 + signum


def main(argv: Sequence[str] | None = None) -> int:
    # Handlers first: building the parser imports the op registry (the techniques' options), a second or more.
    before = {s: signal.signal(s, _on_signal) for s in children.HANDLED_SIGNALS}
    try:
        _load_libraries()
        args = build_parser().parse_args(argv)
        from tightfit import pipeline  # the compiled libraries' users: after the handlers

        return _print(args, pipeline)
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


def _print(args: argparse.Namespace, pipeline) -> int:
    """The command's options -> its pipeline -> its report (--json) or text on stdout."""
    options, command = COMMANDS[args.command]
    try:
        result = getattr(pipeline, command)(options(args)) if options else getattr(pipeline, command)()
    except VerificationFailed as e:  # an internal bug: reported in one line, nothing written
        print(f"tightfit: internal error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result.report, indent=1, default=str) if getattr(args, "json", False) else result.text)
    return result.status


def _input_shape(args: argparse.Namespace) -> "tuple[int, ...] | dict[str, tuple[int, ...]] | None":
    """One shape (`1x3x224x224`), or each input's by name (`left=1x3x96x192,right=1x3x96x192`)."""
    if not args.input_shape:
        return None
    if "=" not in args.input_shape:
        return _shape(args.input_shape)
    shapes: dict[str, tuple[int, ...]] = {}
    for item in args.input_shape.split(","):
        name, eq, text = item.partition("=")
        if not eq or not name.strip() or not text:
            raise OptionError(f"cannot read --input-shape {args.input_shape!r}: write NAME=SHAPE,NAME=SHAPE, "
                              "e.g. left=1x3x96x192,right=1x3x96x192")
        if name.strip() in shapes:
            raise OptionError(f"--input-shape names input {name.strip()!r} twice")
        shapes[name.strip()] = _shape(text)
    return shapes


def _size(text: str | None) -> int | None:
    return parse_size(text) if text is not None else None


def inspect_options(args: argparse.Namespace) -> InspectOptions:
    return InspectOptions(args.model, _input_shape(args), args.dtype, args.workspace, args.batch)


def plan_options(args: argparse.Namespace) -> PlanOptions:
    return PlanOptions(args.model, args.method, args.planner, args.order, args.layout, args.batch, _input_shape(args),
                       phases=args.phases, rows=args.rows, budget=_size(args.budget), tiling=args.tiling,
                       unit_bytes=parse_size(args.unit) if args.unit else None, latency=args.latency,
                       held=tuple(int(h) if h.isdigit() else h for h in args.hold.split(",") if h),
                       time_limit=args.time_limit if args.budget is not None else None, allow_code=args.allow_code,
                       reprofile=args.reprofile, out=args.out, layout_map=args.layout_map, inplace=args.inplace,
                       stream_outputs=args.stream_outputs, say=_say(args))


def csdf_options(args: argparse.Namespace) -> CsdfOptions:
    return CsdfOptions(args.model, _input_shape(args), args.phases, args.source_rows, args.source_phases, args.itemsize,
                       args.format)


def run_options(args: argparse.Namespace) -> RunOptions:
    shape = None if is_plan_file(args.model) else _input_shape(args)  # a plan names its models' shapes
    return RunOptions(args.model, shape, args.verify, args.measure, args.enforce, args.limit, args.input, args.output,
                      args.allow_code, args.threads)


def fit_options(args: argparse.Namespace) -> FitOptions:
    return FitOptions(args.model, _size(args.budget), args.with_params, args.min_fps, args.objective, args.seed,
                      args.best_effort, args.thorough, args.time_limit, _input_shape(args), args.batch, args.allow_code,
                      args.out, args.export, args.force, args.target, args.ram, args.flash, args.threads, say=_say(args),
                      inplace=args.inplace, stream_outputs=args.stream_outputs)


def export_options(args: argparse.Namespace) -> ExportOptions:
    try:
        cflags = tuple(shlex.split(args.cflags)) if args.cflags else None
    except ValueError as e:
        raise OptionError(f"cannot read --cflags {args.cflags!r}: {e}") from None
    return ExportOptions(args.plan, args.out, args.force, args.name, args.weights, args.check, args.cc, cflags, args.runs,
                         args.sanitize, args.keep_io, args.target, args.ram, args.flash, args.allow_code)


# command -> (its options from the parsed arguments, its pipeline in tightfit.pipeline)
COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], object] | None, str]] = {
    "zoo": (None, "zoo_list"), "inspect": (inspect_options, "inspect"), "plan": (plan_options, "plan"),
    "csdf": (csdf_options, "csdf"), "run": (run_options, "run"), "fit": (fit_options, "fit"),
    "export": (export_options, "export")}

if __name__ == "__main__":
    sys.exit(main())
