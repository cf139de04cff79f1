/* tightfit: semihosting calls (ARM "Semihosting for AArch32 and AArch64", v2),
 * the stack report, the SysTick cycle count and the fault handler of the microcontroller
 * test program. */
#include <stdint.h>
#include <string.h>

#include "tf_semihost.h"

enum {
    SYS_OPEN = 0x01, SYS_CLOSE = 0x02, SYS_WRITE0 = 0x04, SYS_WRITE = 0x05,
    SYS_READ = 0x06, SYS_SEEK = 0x0A, SYS_EXIT_EXTENDED = 0x20,
};
enum { OPEN_READ_BINARY = 1, OPEN_WRITE_BINARY = 5 };
#define ADP_STOPPED_APPLICATION_EXIT 0x20026u
#define TF_STACK_PAINT 0x5A5AA5A5u  /* as in startup_cortex_m.S */

extern uint32_t __stack_bottom[];
extern uint32_t __stack_top[];

static int semihost(int op, const void *args)
{
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = args;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static int open_file(const char *path, int mode)
{
    const uintptr_t args[3] = {(uintptr_t)path, (uintptr_t)mode, strlen(path)};
    int fd = semihost(SYS_OPEN, args);
    if (fd < 0) {
        tf_print(path);
        tf_print(mode == OPEN_READ_BINARY ? ": cannot open\n" : ": cannot create\n");
    }
    return fd;
}

int tf_open_read(const char *path)
{
    return open_file(path, OPEN_READ_BINARY);
}

int tf_open_write(const char *path)
{
    return open_file(path, OPEN_WRITE_BINARY);
}

int tf_read_at(int fd, size_t offset, void *dst, size_t n)
{
    const uintptr_t seek_args[2] = {(uintptr_t)fd, offset};
    if (semihost(SYS_SEEK, seek_args) != 0) {
        tf_print("tightfit-mcu: seek failed\n");
        return -1;
    }
    const uintptr_t args[3] = {(uintptr_t)fd, (uintptr_t)dst, n};
    if (semihost(SYS_READ, args) != 0) {  /* the call returns the bytes NOT read */
        tf_print("tightfit-mcu: the input file is shorter than the model's input\n");
        return -1;
    }
    return 0;
}

int tf_write(int fd, const void *src, size_t n)
{
    const uintptr_t args[3] = {(uintptr_t)fd, (uintptr_t)src, n};
    if (semihost(SYS_WRITE, args) != 0) {  /* the bytes NOT written */
        tf_print("tightfit-mcu: write failed\n");
        return -1;
    }
    return 0;
}

int tf_close(int fd)
{
    const uintptr_t args[1] = {(uintptr_t)fd};
    return semihost(SYS_CLOSE, args);
}

int tf_read_file(const char *path, void *dst, size_t n)
{
    int fd = tf_open_read(path);
    if (fd < 0) {
        return -1;
    }
    int status = tf_read_at(fd, 0, dst, n);
    tf_close(fd);
    return status;
}

int tf_write_file(const char *path, const void *src, size_t n)
{
    int fd = tf_open_write(path);
    if (fd < 0) {
        return -1;
    }
    int status = tf_write(fd, src, n);
    return tf_close(fd) != 0 ? -1 : status;
}

void tf_print(const char *text)
{
    semihost(SYS_WRITE0, text);
}

void tf_exit(int status)
{
    /* SYS_EXIT_EXTENDED carries the status; AArch32's plain SYS_EXIT cannot. */
    const uintptr_t args[2] = {ADP_STOPPED_APPLICATION_EXIT, (uintptr_t)status};
    semihost(SYS_EXIT_EXTENDED, args);
    for (;;) {
    }
}

static void print_decimal(uint64_t value)
{
    char text[21];
    char *p = text + sizeof text - 1;
    *p = '\0';
    do {
        *--p = (char)('0' + (uint32_t)(value % 10u));
        value /= 10u;
    } while (value != 0u);
    tf_print(p);
}

/* The lowest word still painted: everything above it was written by the run. */
static uint32_t stack_bytes_used(void)
{
    const uint32_t *word = __stack_bottom;
    while (word < __stack_top && *word == TF_STACK_PAINT) {
        ++word;
    }
    return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)word);
}

void tf_finish(int status)
{
    uint32_t reserved = (uint32_t)((uintptr_t)__stack_top - (uintptr_t)__stack_bottom);
    uint32_t used = stack_bytes_used();
    tf_print("tightfit-mcu: stack used ");
    print_decimal(used);
    tf_print(" of ");
    print_decimal(reserved);
    tf_print(" bytes\n");
    if (used >= reserved) {
        tf_print("tightfit-mcu: the stack overflowed its ");
        print_decimal(reserved);
        tf_print(" bytes\n");
        tf_exit(4);
    }
    tf_exit(status);
}

void tf_fault_handler(void)
{
    uint32_t ipsr;
    __asm__ volatile("mrs %0, ipsr" : "=r"(ipsr));
    tf_print("tightfit-mcu: fault (exception ");
    print_decimal(ipsr & 0x1FFu);
    tf_print(")");
    if (__stack_bottom[0] != TF_STACK_PAINT) {
        /* The deepest word of the stack was written: the likely cause. */
        tf_print(" after the stack overflowed its ");
        print_decimal((uint32_t)((uintptr_t)__stack_top - (uintptr_t)__stack_bottom));
        tf_print(" bytes");
    }
    tf_print("\n");
    tf_exit(3);
}

/* SysTick (ARMv7-M's system timer, in every Cortex-M) counts the core clock down from RELOAD;
 * its interrupt counts the wraps, so a count far beyond its 24 bits stays exact. */
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define SCB_ICSR (*(volatile uint32_t *)0xE000ED04u)
#define SYST_RELOAD 0x00FFFFFFu
#define SYST_ENABLE_TICKINT_CORECLK 0x7u
#define ICSR_PENDSTSET (1u << 26)
#define ICSR_PENDSTCLR (1u << 25)

static volatile uint32_t systick_wraps;
static uint32_t systick_start;

void tf_systick_handler(void)
{
    ++systick_wraps;
}

void tf_count_start(void)
{
    SYST_CSR = 0u;
    SYST_RVR = SYST_RELOAD;
    SYST_CVR = 0u;  /* any write clears it */
    SYST_CSR = SYST_ENABLE_TICKINT_CORECLK;
    /* The counter loads RELOAD on its first tick, which may raise the interrupt: wait for the
     * load, then forget any wrap it caused, so the count starts from a value that was read. */
    while (SYST_CVR == 0u) {
    }
    SCB_ICSR = ICSR_PENDSTCLR;
    systick_wraps = 0u;
    systick_start = SYST_CVR;
}

void tf_count_stop(const char *what)
{
    /* Read while it runs (qemu's value of a stopped SysTick is not the last count), then stop. */
    uint32_t wraps_before = systick_wraps;
    uint32_t value = SYST_CVR;
    SYST_CSR = 0u;
    uint64_t wraps = systick_wraps;
    if (SCB_ICSR & ICSR_PENDSTSET) {
        /* A wrap whose interrupt was not taken: it came before the read if the value just
         * reloaded (high), after it if the value is low; the read-to-stop gap is a few cycles. */
        wraps += value > SYST_RELOAD / 2u ? 1u : 0u;
        SCB_ICSR = ICSR_PENDSTCLR;
    } else if (wraps != wraps_before && value < SYST_RELOAD / 2u) {
        --wraps;  /* the interrupt came between the read and the stop */
    }
    /* It counts down: each wrap adds RELOAD + 1 cycles, and value may exceed the start. */
    uint64_t cycles = wraps * ((uint64_t)SYST_RELOAD + 1u) + systick_start - value;
    tf_print("tightfit-mcu: ");
    tf_print(what);
    tf_print(" took ");
    print_decimal(cycles);
    tf_print(" core clock cycles\n");
}
