"""Microcontroller target of the export: a small library of the exported interface, linked for
Cortex-M7 and Cortex-M4 with a named RAM/flash size and run under qemu's MPS2 boards."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tightfit.errors import TightfitError
from tightfit.api import check_export_mcu
from tightfit.export import export, mcu
from tightfit.export.errors import DoesNotFitError, ExportError

_MISSING = mcu.toolchain_available()
needs_toolchain = pytest.mark.skipif(_MISSING is not None, reason=f"microcontroller toolchain: {_MISSING}")

SHAPE = (2, 2, 2, 70)  # NCHW; rows longer than the program's 64-float chunks
ELEMS = int(np.prod(SHAPE))
WEIGHT = ((np.arange(ELEMS) % 17 - 8) / 8).astype(np.float32)
KIB = 1024

_HEADER = """#ifndef FAKE_H
#define FAKE_H
#include "tf_kernels.h"
#define FAKE_ARENA_BYTES {arena}u
#define FAKE_INPUT_ELEMS {elems} /* a comment, as the generator writes one */
#define FAKE_OUTPUT_ELEMS {elems}
#define FAKE_INPUT_ITEM 4 /* float32 input */
{extra}int fake_run(void *arena, const float *input);
void fake_read_output(const void *arena, float *dst);
#endif
"""
# What the generator adds for a plan whose input arrives by rows (issue 21).
_ROWS_HEADER = """#define FAKE_INPUT_C {c}
#define FAKE_INPUT_H {h}
#define FAKE_INPUT_W {w}
int fake_run_rows(void *arena, tf_input_fn fill, void *ctx);
void fake_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst);
"""
_KERNELS_H = """#ifndef TF_KERNELS_H
#define TF_KERNELS_H
#include <stdint.h>
typedef int (*tf_input_fn)(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                           float *dst, long sn, long sc, long sh, long sw);
void tf_add_exp(float *x, const float *w, int32_t n);
#endif
"""
_KERNELS_C = """#include <math.h>
#include "tf_kernels.h"
void tf_add_exp(float *x, const float *w, int32_t n)
{
    for (int32_t i = 0; i < n; ++i) {
        x[i] = x[i] + expf(w[i]);
    }
}
"""
_MODEL_C = """#include <math.h>
#include <string.h>
#include "fake.h"
static const float fake_weight[FAKE_INPUT_ELEMS] = {{{weights}}};
int fake_run(void *arena, const float *input)
{{
{body}
}}
void fake_read_output(const void *arena, float *dst)
{{
    memcpy(dst, arena, sizeof(float) * FAKE_OUTPUT_ELEMS);
}}
"""
# output = input + exp(weight): a flash constant, a libm call on the FPU, the arena in .bss.
_ADD_EXP = """    float *x = (float *)arena;
    memcpy(x, input, sizeof(float) * FAKE_INPUT_ELEMS);
    tf_add_exp(x, fake_weight, FAKE_INPUT_ELEMS);
    return 0;"""
# The same by rows: the input is asked for in three parts (a band of rows; the rest, in two
# column ranges) into a channels-last buffer (strided), the NCHW output follows it.
_ROWS_C = """
int fake_run_rows(void *arena, tf_input_fn fill, void *ctx)
{
    enum { N = FAKE_INPUT_ELEMS / (FAKE_INPUT_C * FAKE_INPUT_H * FAKE_INPUT_W), C = FAKE_INPUT_C,
           H = FAKE_INPUT_H, W = FAKE_INPUT_W };
    float *nhwc = (float *)arena;
    float *out = nhwc + FAKE_INPUT_ELEMS;
    const long sn = H * W * C, sh = W * C;
    if (fill(ctx, 0, N, 0, 1, 0, W, nhwc, sn, 1, sh, C) != 0) return 1;
    if (fill(ctx, 0, N, 1, H, 0, 5, nhwc + sh, sn, 1, sh, C) != 0) return 1;
    if (fill(ctx, 0, N, 1, H, 5, W, nhwc + sh + 5 * C, sn, 1, sh, C) != 0) return 1;
    for (long i = 0; i < FAKE_INPUT_ELEMS; ++i) {
        long w = i % W, h = i / W % H, c = i / (W * H) % C, n = i / (W * H * C);
        out[i] = nhwc[n * sn + h * sh + w * C + c] + expf(fake_weight[i]);
    }
    return 0;
}
void fake_read(const void *arena, int cnn, int k, long frame, long first, long count, float *dst)
{
    (void)cnn; (void)k; (void)frame;
    memcpy(dst, (const float *)arena + FAKE_INPUT_ELEMS + first, sizeof(float) * (size_t)count);
}
"""


def write_fake_library(
    folder: Path, arena_bytes: int = ELEMS * 4, body: str = _ADD_EXP, by_rows: bool = False, extra_header: str = "",
) -> Path:
    """The exported library's interface (`<name>.h/.c`, `tf_kernels.h/.c`) around a toy model;
    by_rows: also `fake_run_rows` and `fake_read`, as the generator writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = ", ".join(f"{w:.6f}f" for w in WEIGHT)
    extra = extra_header + (_ROWS_HEADER.format(c=SHAPE[1], h=SHAPE[2], w=SHAPE[3]) if by_rows else "")
    (folder / "fake.h").write_text(_HEADER.format(arena=arena_bytes, elems=ELEMS, extra=extra))
    (folder / "fake.c").write_text(_MODEL_C.format(weights=weights, body=body) + (_ROWS_C if by_rows else ""))
    (folder / "tf_kernels.h").write_text(_KERNELS_H)
    (folder / "tf_kernels.c").write_text(_KERNELS_C)
    return folder


def some_input() -> np.ndarray:
    return np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)


@needs_toolchain
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m4"])
def test_fake_library_runs_on_the_emulated_board(tmp_path, target):
    library = write_fake_library(tmp_path / "lib")
    build = mcu.build_mcu(library, "fake", target, 64 * KIB, 256 * KIB, tmp_path / f"fake-{target}.elf")
    x = some_input()
    run = mcu.run_qemu_measured(build, x, timeout_s=30)
    np.testing.assert_allclose(run.output, x.ravel() + np.exp(WEIGHT), rtol=2e-6, atol=2e-6)
    assert build.arena == ELEMS * 4 and build.io_buffer == ELEMS * 4
    assert build.bss >= build.arena + build.io_buffer
    assert build.rodata >= WEIGHT.nbytes  # the weights went to flash
    assert build.stack == mcu.DEFAULT_STACK_BYTES and build.heap == 0
    assert build.ram_used >= build.data + build.bss + build.stack and build.ram_used <= 64 * KIB
    assert build.flash_used >= build.text + build.rodata and build.flash_used <= 256 * KIB
    assert 0 < run.stack_used < run.stack_reserved == build.stack
    assert build.elf.is_file() and build.elf.with_suffix(".ld").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no build folder left behind


@needs_toolchain
@pytest.mark.parametrize("target", ["cortex-m7", "cortex-m4"])
def test_a_library_that_takes_its_input_by_rows_streams_it_from_the_host(tmp_path, target):
    library = write_fake_library(tmp_path / "lib", arena_bytes=2 * ELEMS * 4, by_rows=True)
    build = mcu.build_mcu(library, "fake", target, 64 * KIB, 256 * KIB, tmp_path / "fake.elf")
    x = some_input()
    np.testing.assert_allclose(mcu.run_qemu(build, x, timeout_s=30), x.ravel() + np.exp(WEIGHT), rtol=2e-6, atol=2e-6)
    assert build.input_streamed and build.io_buffer == 0  # RAM: the arena, the stack, a few bytes
    assert build.ram_used - build.arena - build.stack < 256, build.memory_report()
    assert "input streamed by rows" in build.memory_report()


# A run of exactly 2 * k instructions (subs, bne), for the counter's test.
_LOOP = """    register unsigned n __asm__("r3") = {k}u;
    __asm__ volatile("1: subs %0, %0, #1\\n bne 1b" : "+r"(n));
    (void)input;
    return 0;"""


@needs_toolchain
def test_the_program_counts_the_instructions_of_its_inference(tmp_path):
    counts = {}
    for k in (1000, 10_000_000):  # the larger runs past SysTick's 24 bits: wraps are counted
        library = write_fake_library(tmp_path / str(k), body=_LOOP.replace("{k}", str(k)))
        build = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / f"{k}.elf")
        counts[k] = mcu.run_qemu_measured(build, some_input(), timeout_s=30).instructions
    # One SysTick cycle is 40 instructions (25 MHz at 1 ns an instruction); the call adds a few.
    for k, n in counts.items():
        assert 2 * k - 40 <= n <= 2 * k + 200, (k, n)


@needs_toolchain
def test_a_plan_that_recomputes_executes_more_instructions(tmp_path):
    import tightfit
    from tightfit.api import plan_inputs

    counts = {}
    for kw in ({"method": "reuse"}, {"method": "parts", "rows": 1}):
        plan, graphs = tightfit.api.plan("minakova5", **kw)
        sources = export(plan, graphs, tmp_path / kw["method"], weights="c")
        build = mcu.build_mcu(tmp_path / kw["method"], sources.name, "cortex-m7", 512 * KIB, 2 * 2**20,
                              tmp_path / f"{kw['method']}.elf")
        counts[kw["method"]] = mcu.run_qemu_measured(build, np.asarray(plan_inputs(graphs, plan, 0)[0]), 60).instructions
    # Parts of one row recompute the rows their windows share, so they cannot cost less.
    assert 0 < counts["reuse"] < counts["parts"], counts


def test_weights_in_a_file_are_refused(tmp_path):
    library = write_fake_library(tmp_path / "lib", extra_header="#define FAKE_WEIGHTS_FILE 1 /* weights.bin */\n")
    with pytest.raises(ExportError, match="a microcontroller needs them in flash"):
        mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")


@needs_toolchain
def test_the_same_library_links_to_the_same_bytes(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    first = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "a" / "fake.elf")
    second = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "b" / "fake.elf")
    assert first.elf.read_bytes() == second.elf.read_bytes()


@needs_toolchain
@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_the_written_makefile_builds_the_same_program_and_runs_it(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    built = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")
    mcu.write_mcu_sources(library, "fake", mcu.Device("cortex-m7", 64 * KIB, 256 * KIB))
    subprocess.run(["make", "-s", "-f", "Makefile.cortex-m7"], cwd=library, check=True, capture_output=True)
    assert (library / "fake_cortex-m7.elf").read_bytes() == built.elf.read_bytes()
    x = some_input()
    x.tofile(library / "input.bin")
    subprocess.run(["make", "-s", "-f", "Makefile.cortex-m7", "run"], cwd=library, check=True, capture_output=True, timeout=30)
    np.testing.assert_array_equal(np.fromfile(library / "output.bin", np.float32), mcu.run_qemu(built, x))


@needs_toolchain
def test_an_arena_larger_than_the_ram_fails_at_link_time_with_one_line(tmp_path):
    library = write_fake_library(tmp_path / "lib", arena_bytes=600_000)
    with pytest.raises(DoesNotFitError) as failure:
        mcu.build_mcu(library, "fake", "cortex-m7", 512 * KIB, 2 * 2**20, tmp_path / "fake.elf")
    message = str(failure.value)
    assert "\n" not in message and isinstance(failure.value, TightfitError)
    found = re.fullmatch(
        r"cortex-m7: RAM overflowed by (\d+) bytes \(arena 600000 B \+ I/O buffer (\d+) B \+ stack 8192 B "
        r"\+ heap 0 B \+ other \.data/\.bss (\d+) B = (\d+) B > --ram 512 KiB = 524288 B\)",
        message,
    )
    assert found, message
    overflow, io_buffer, other, total = map(int, found.groups())
    assert io_buffer == ELEMS * 4
    assert total == 600_000 + io_buffer + 8192 + other
    assert overflow == total - 512 * KIB  # the linker's own figure agrees with the breakdown
    assert not (tmp_path / "fake.elf").exists()


@needs_toolchain
def test_weights_larger_than_the_flash_fail_at_link_time(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    with pytest.raises(DoesNotFitError, match=r"^cortex-m4: FLASH overflowed by \d+ bytes \(constants/weights \d+ B"):
        mcu.build_mcu(library, "fake", "cortex-m4", 64 * KIB, 2 * KIB, tmp_path / "fake.elf")


def test_sizes_beyond_the_memory_map_are_refused(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    with pytest.raises(ExportError, match=r"--ram 1024 MiB = 1073741824 B is not within the 512 MiB = 536870912 B SRAM region"):
        mcu.build_mcu(library, "fake", "cortex-m7", 2**30, 2**20, tmp_path / "fake.elf")
    with pytest.raises(ExportError, match="unknown microcontroller target 'cortex-m0'"):
        mcu.build_mcu(library, "fake", "cortex-m0", 64 * KIB, 2**20, tmp_path / "fake.elf")


@pytest.mark.parametrize("target, ram, flash, origins", [
    ("cortex-m7", 64 * KIB, 2**20, (0x00000000, 0x20000000, False)),
    ("cortex-m7", 64 * KIB, 8 * 2**20, (0x60000000, 0x20000000, True)),   # flash in the PSRAM, vectors at 0
    ("cortex-m7", 8 * 2**20, 2**20, (0x00000000, 0x60000000, False)),     # RAM in the PSRAM
    ("cortex-m4", 8 * 2**20, 2**20, (0x00000000, 0x21000000, False)),
])
def test_the_board_memory_map_that_holds_the_users_sizes(target, ram, flash, origins):
    layout = mcu.choose_layout(mcu.mcu_target(target), ram, flash)
    assert (layout.flash_origin, layout.ram_origin, layout.boot) == origins and layout.why_not is None


@needs_toolchain
@pytest.mark.parametrize("ram, flash", [(64 * KIB, 8 * 2**20), (6 * 2**20, 2**20)])
def test_a_program_beyond_the_boards_first_memories_runs_in_its_psram(tmp_path, ram, flash):
    library = write_fake_library(tmp_path / "lib")
    built = mcu.build_mcu(library, "fake", "cortex-m7", ram, flash, tmp_path / "fake.elf")
    assert built.qemu_problem is None and built.flash_bytes == flash and built.ram_bytes == ram
    x = some_input()
    np.testing.assert_allclose(mcu.run_qemu(built, x, timeout_s=30), x.ravel() + np.exp(WEIGHT), rtol=2e-6, atol=2e-6)


@needs_toolchain
def test_sizes_no_board_map_holds_build_and_say_why_qemu_cannot_run(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    built = mcu.build_mcu(library, "fake", "cortex-m7", 8 * 2**20, 8 * 2**20, tmp_path / "fake.elf")
    assert built.elf.is_file() and "cannot hold --flash 8 MiB" in built.qemu_problem
    with pytest.raises(ExportError, match="cannot run under qemu: qemu's mps2-an500 has 4 MiB"):
        mcu.run_qemu(built, some_input())


@needs_toolchain
def test_a_failing_run_is_one_line_with_the_status(tmp_path):
    library = write_fake_library(tmp_path / "lib", body="    (void)arena; (void)input; return 1;")
    build = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")
    with pytest.raises(ExportError, match=r"^cortex-m7: the program on qemu mps2-an500 exited with status 11: .*fake_run failed$"):
        mcu.run_qemu(build, some_input(), timeout_s=30)


@needs_toolchain
def test_a_stack_overflow_is_reported(tmp_path):
    body = """    volatile float deep[1024];
    for (int i = 0; i < 1024; ++i) deep[i] = input[i % FAKE_INPUT_ELEMS];
    memcpy(arena, (const void *)deep, sizeof(float) * FAKE_INPUT_ELEMS);
    return 0;"""
    library = write_fake_library(tmp_path / "lib", body=body)
    build = mcu.build_mcu(library, "fake", "cortex-m4", 64 * KIB, 256 * KIB, tmp_path / "fake.elf", stack_bytes=1024)
    with pytest.raises(ExportError, match=r"^cortex-m4: .* exited with status 4: tightfit-mcu: the stack overflowed its 1024 bytes$"):
        mcu.run_qemu(build, some_input(), timeout_s=30)


@needs_toolchain
def test_a_hang_is_killed_after_the_timeout(tmp_path):
    body = "    (void)arena; (void)input; for (;;) { __asm__ volatile(\"nop\"); }"
    library = write_fake_library(tmp_path / "lib", body=body)
    build = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")
    with pytest.raises(ExportError, match=r"^cortex-m7: the program on qemu mps2-an500 did not finish within 1 s"):
        mcu.run_qemu(build, some_input(), timeout_s=1)


@needs_toolchain
def test_an_input_of_the_wrong_size_is_refused(tmp_path):
    library = write_fake_library(tmp_path / "lib")
    build = mcu.build_mcu(library, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")
    with pytest.raises(ExportError, match=f"the input has 5 values, the model takes {ELEMS}"):
        mcu.run_qemu(build, np.zeros(5, np.float32))


def test_a_folder_without_the_library_is_refused(tmp_path):
    with pytest.raises(ExportError, match="missing tf_kernels.c, fake.c, fake.h"):
        mcu.build_mcu(tmp_path, "fake", "cortex-m7", 64 * KIB, 256 * KIB, tmp_path / "fake.elf")


@needs_toolchain
@pytest.mark.parametrize("kw", [{"method": "reuse"}, {"method": "parts", "rows": 1}], ids=["reuse", "parts"])
def test_minakova5_links_within_512k_ram_and_matches_the_reference_on_cortex_m7(tmp_path, kw):
    import tightfit
    from tightfit.api import plan_inputs
    from tightfit.reference import run_reference
    from tightfit.verify import compare

    plan, graphs = tightfit.api.plan("minakova5", **kw)
    sources = export(plan, graphs, tmp_path / "out", weights="c")
    build = mcu.build_mcu(tmp_path / "out", sources.name, "cortex-m7", 512 * KIB, 2 * 2**20, tmp_path / "minakova5.elf")
    x = plan_inputs(graphs, plan, 0)[0]
    reference = np.asarray(run_reference(graphs[0], x)[graphs[0].outputs[0]])
    result = compare(mcu.run_qemu(build, np.asarray(x), timeout_s=60).reshape(reference.shape), reference)
    assert result.ok, result
    assert build.arena == plan.arena_bytes and build.input_streamed


@needs_toolchain
def test_a_minakova5_plan_larger_than_the_ram_fails_at_link_time(tmp_path):
    import tightfit

    plan, graphs = tightfit.api.plan("minakova5", method="reuse")
    sources = export(plan, graphs, tmp_path / "out", weights="c")
    ram = plan.arena_bytes  # the arena alone fills it: the stack cannot fit
    with pytest.raises(DoesNotFitError, match=rf"^cortex-m7: RAM overflowed by \d+ bytes \(arena {plan.arena_bytes} B "):
        mcu.build_mcu(tmp_path / "out", sources.name, "cortex-m7", ram, 2 * 2**20, tmp_path / "minakova5.elf")


@needs_toolchain
@pytest.mark.slow
def test_mobilenet_v1_025_fitted_to_128k_runs_on_cortex_m7(tmp_path):
    """Issue 21's microcontroller case at a RAM that layer-by-layer reuse (216 KiB) exceeds: fit
    finds a smaller plan, which links within 128 KiB and 2 MiB and matches the reference."""
    from tightfit import api

    app = api.load_fit_app("mobilenet_v1_025", (1, 3, 96, 96))
    outcome = api.fit(app, 100 * KIB)
    sources = export(outcome.plan, app.graphs, tmp_path / "out")
    built = mcu.build_mcu(tmp_path / "out", sources.name, "cortex-m7", 128 * KIB, 2 * 2**20, tmp_path / "m.elf")
    assert built.arena == outcome.plan.arena_bytes <= 100 * KIB
    assert check_export_mcu(outcome.plan, app.graphs, built).ok
