/* main.c: tightfit's test program for an exported model (not part of the library).
 * usage: model [-p] [-t THREADS] INPUT.bin OUTPUT.bin [RUNS [WEIGHTS.bin]]
 * INPUT.bin holds every CNN's inputs (a CNN of several: each in its input order), one after another, each in its
 * model file's layout (NCHW, or NHWC where model_input_nhwc says: a .tflite's image), each
 * in its own type (float32; int8 for an int8 input: model_input_item says the bytes a value); OUTPUT.bin gets every output
 * of every CNN likewise. The input is read by rows as the plan's steps ask for them, so it is never
 * whole in memory; the arena is this program's only large buffer (and the weights, when they come
 * from a file: by default weights.bin beside the program). An output the plan streams
 * (model_output_streamed) is written into OUTPUT.bin by rows as the steps hand them over, so it is
 * never whole in memory either; the others are read from the arena after the last run. With -p the input is read whole first
 * (timings then count no file reads). With -t, the steps run on THREADS threads (a convolution's
 * output rows shared among them; the outputs are the same bits). Prints the median seconds of a run, the process's peak
 * resident set (VmHWM), the kernels' vector width (tf_simd: 0 for the portable path) and, as cpu_seconds, the
 * median over the runs after the first of each run's own time: the shorter of its wall time and the process's
 * CPU time, each less what the clock reads around nothing (on a shared machine, the time other processes
 * held the core counts in neither; the Python executor's runs are timed so).
 * Every mistake is one line on stderr and a non-zero status: 2 for what was given (a missing,
 * short, long or unreadable file, a bad run count), 3 when a run fails, 4 when memory cannot be had
 * (with what the program needs beside the address-space and data limits set, where the platform
 * has getrlimit). The arena is allocated here, not static: a limit too low for it is then said in
 * a line, where a static arena too large for the limit kills the process as it loads. */
#if defined(__linux__)
#define _DEFAULT_SOURCE 1 /* madvise and MADV_HUGEPAGE */
#endif
#define _POSIX_C_SOURCE 200112L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <sys/resource.h>
#define TF_HAS_RLIMIT 1
#endif

#include "model.h"

#define MAX_RUNS 1000000L
#define MAX_THREADS 64L /* tf_run uses at most tf_threads() */

/* One input's place in the file: its first byte, shape (N, C, H, W), bytes a value (item: 4 float32,
 * 1 int8) and layout (nhwc 1: the file holds it channels-last). */
typedef struct { FILE *f; long base; const long *shape; int item; int nhwc; } file_source;

/* Rows [h0, h1), columns [w0, w1) of a channels-last input: each row's columns are one run of
 * (w1 - w0) * C values in the file, spread over the channels' strides of dst. */
static int file_rows_nhwc(const file_source *s, long n0, long n1, long h0, long h1, long w0, long w1,
                          void *dst, long sn, long sc, long sh, long sw) {
    const long c_ = s->shape[1], h_ = s->shape[2], w_ = s->shape[3], item = s->item;
    unsigned char chunk[256 * sizeof(float)];
    for (long n = n0; n < n1; n++)
    for (long h = h0; h < h1; h++) {
        if (fseek(s->f, s->base + ((n * h_ + h) * w_ + w0) * c_ * item, SEEK_SET)) return 1;
        for (long i = 0; i < (w1 - w0) * c_; i += 256) {
            const long k = (w1 - w0) * c_ - i < 256 ? (w1 - w0) * c_ - i : 256;
            if (fread(chunk, (size_t)item, (size_t)k, s->f) != (size_t)k) return 1;
            for (long j = 0; j < k; j++) {
                const long w = (i + j) / c_, c = (i + j) % c_;
                unsigned char *out = (unsigned char *)dst + ((n - n0) * sn + c * sc + (h - h0) * sh + w * sw) * item;
                memcpy(out, chunk + j * item, (size_t)item);
            }
        }
    }
    return 0;
}

static int file_rows(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                     void *dst, long sn, long sc, long sh, long sw) {
    const file_source *s = (const file_source *)ctx;
    if (s->nhwc) return file_rows_nhwc(s, n0, n1, h0, h1, w0, w1, dst, sn, sc, sh, sw);
    const long c_ = s->shape[1], h_ = s->shape[2], w_ = s->shape[3], item = s->item;
    unsigned char chunk[256 * sizeof(float)];
    for (long n = n0; n < n1; n++)
    for (long c = 0; c < c_; c++)
    for (long h = h0; h < h1; h++) {
        if (fseek(s->f, s->base + (((n * c_ + c) * h_ + h) * w_ + w0) * item, SEEK_SET)) return 1;
        for (long w = w0; w < w1; w += 256) {
            const long k = w1 - w < 256 ? w1 - w : 256;
            if (fread(chunk, (size_t)item, (size_t)k, s->f) != (size_t)k) return 1;
            unsigned char *out = (unsigned char *)dst + ((n - n0) * sn + c * sc + (h - h0) * sh + (w - w0) * sw) * item;
            for (long i = 0; i < k; i++) memcpy(out + i * sw * item, chunk + i * item, (size_t)item);
        }
    }
    return 0;
}

/* One streamed output's place in OUTPUT.bin: its first byte, shape (N, C, H, W) and bytes a value in
 * the arena (4 float32, 1 int8: written as floats, as model_read gives them). */
typedef struct { FILE *f; long base; const long *shape; int item; } file_sink;

static int file_emit(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                     const void *src, long sn, long sc, long sh, long sw) {
    const file_sink *s = (const file_sink *)ctx;
    const long c_ = s->shape[1], h_ = s->shape[2], w_ = s->shape[3];
    float chunk[256];
    for (long n = n0; n < n1; n++)
    for (long c = 0; c < c_; c++)
    for (long h = h0; h < h1; h++) {
        if (fseek(s->f, s->base + (((n * c_ + c) * h_ + h) * w_ + w0) * (long)sizeof(float), SEEK_SET)) return 1;
        const long row = (n - n0) * sn + c * sc + (h - h0) * sh;
        for (long w = w0; w < w1; w += 256) {
            const long k = w1 - w < 256 ? w1 - w : 256;
            for (long i = 0; i < k; i++) {
                const long at = row + (w - w0 + i) * sw;
                chunk[i] = s->item == 1 ? (float)((const int8_t *)src)[at] : ((const float *)src)[at];
            }
            if (fwrite(chunk, sizeof(float), (size_t)k, s->f) != (size_t)k) return 1;
        }
    }
    return 0;
}

/* The process's peak resident set (VmHWM, Linux), in KiB; -1 where unknown. Parsed with strtol:
 * sscanf would link a static glibc's scanf and strtod machinery (72 KiB more resident code). */
static long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0) {
            kib = strtol(line + 6, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return kib;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Every CNN's inputs, each in its own type, one after another: the bytes INPUT.bin must hold. */
static long input_bytes(void) {
    long bytes = 0;
    for (int m = 0; m < MODEL_CNNS; m++)
    for (int k = 0; k < model_inputs(m); k++) {
        const long *s = model_input_shape_of(m, k);
        bytes += s[0] * s[1] * s[2] * s[3] * (long)model_input_item(m, k);
    }
    return bytes;
}

/* What INPUT.bin's values are: float32, int8, or both (inputs of either type). */
static const char *input_kind(void) {
    int items = 0;
    for (int m = 0; m < MODEL_CNNS; m++)
        for (int k = 0; k < model_inputs(m); k++) items |= model_input_item(m, k);
    return items == 1 ? "int8" : items == 4 ? "float32" : "int8 and float32";
}

/* 0 when `path` is a regular file of exactly `want` bytes (of `kind` values); else says why in one line. */
static int check_file(const char *what, const char *path, long want, const char *kind) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "cannot read %s %s: %s\n", what, path, strerror(errno));
        return 2;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "%s %s is not a file%s\n", what, path, S_ISDIR(st.st_mode) ? " (a folder)" : "");
        return 2;
    }
    if ((long)st.st_size != want) {
        fprintf(stderr, "%s %s: expected %ld bytes (%s), got %ld\n", what, path, want, kind, (long)st.st_size);
        return 2;
    }
    return 0;
}

/* A count (`what`): a whole number from 1 to `most`, or 0 (said in one line). */
static long parse_count(const char *what, const char *text, long most) {
    char *end = NULL;
    errno = 0;
    const long count = strtol(text, &end, 10);
    if (errno || end == text || *end || count < 1 || count > most) {
        fprintf(stderr, "bad %s '%s': give a whole number from 1 to %ld\n", what, text, most);
        return 0;
    }
    return count;
}

#ifdef TF_HAS_RLIMIT
static void say_limit(int resource, const char *name, const char *shell) {
    struct rlimit r;
    if (getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
        fprintf(stderr, "; %s (%s) is %llu bytes", name, shell, (unsigned long long)r.rlim_cur);
}

/* 0 when a limit set on the process is below `need` bytes (it cannot run); 1 otherwise. */
static int limit_allows(int resource, size_t need) {
    struct rlimit r;
    return getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY || (size_t)r.rlim_cur >= need;
}
#endif

/* What the process must be able to map besides its code, libc and stack; one line on failure. */
static int memory_allows(size_t data_need, size_t image_bytes) {
#ifdef TF_HAS_RLIMIT
    if (limit_allows(RLIMIT_DATA, data_need) && limit_allows(RLIMIT_AS, data_need + image_bytes)) return 1;
#else
    (void)data_need;
    (void)image_bytes;
    return 1;
#endif
#ifdef TF_HAS_RLIMIT
    fprintf(stderr, "not enough memory allowed: this program needs %zu bytes of data (arena %lu",
            data_need, (unsigned long)MODEL_ARENA_BYTES);
#ifdef MODEL_WEIGHTS_FILE
    fprintf(stderr, " + weights %lu", (unsigned long)MODEL_WEIGHT_BYTES);
#endif
    fprintf(stderr, " + the rest) and %zu of address space besides its code, libc and stack", data_need + image_bytes);
    say_limit(RLIMIT_DATA, "RLIMIT_DATA", "ulimit -d");
    say_limit(RLIMIT_AS, "RLIMIT_AS", "ulimit -v");
    fputc('\n', stderr);
    return 0;
#endif
}

/* Blocks at least this large ask Linux for transparent huge pages (where its setting is "madvise"),
 * as numpy does for the Python executor's arena and weights: a plan by row bands reads every
 * layer's weights once a band, and with 4 KiB pages each pass misses the TLB on every page
 * (resnet18 by one-row bands: 2% slower than with huge pages). */
#define HUGE_BLOCK_BYTES ((size_t)4 << 20)
#define PAGE_BYTES ((size_t)4096)

static void *allocate(const char *what, size_t bytes) {
    void *block = NULL;
    if (posix_memalign(&block, 64, bytes + 4) == 0) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        /* the block's whole pages (madvise takes a page-aligned start); a refusal costs only speed */
        const size_t start = ((size_t)block + PAGE_BYTES - 1) & ~(PAGE_BYTES - 1), end = (size_t)block + bytes;
        if (bytes >= HUGE_BLOCK_BYTES) (void)madvise((void *)start, end - start, MADV_HUGEPAGE);
#endif
    } else {
        fprintf(stderr, "cannot allocate %s (%zu bytes)", what, bytes);
#ifdef TF_HAS_RLIMIT
        say_limit(RLIMIT_DATA, "RLIMIT_DATA", "ulimit -d");
        say_limit(RLIMIT_AS, "RLIMIT_AS", "ulimit -v");
#endif
        fputc('\n', stderr);
        return NULL;
    }
    return block;
}

typedef struct {
    const char *input, *output, *weights;
    long runs, threads;
    int preload;
} options;

static int parse(int argc, char **argv, options *o, char *weights_path, size_t path_size) {
    int first = 1;
    o->preload = 0;
    o->threads = 1;
    for (; first < argc && argv[first][0] == '-' && argv[first][1]; first++) {
        if (strcmp(argv[first], "-p") == 0) {
            o->preload = 1;
        } else if (strcmp(argv[first], "-t") == 0 && first + 1 < argc) {
            o->threads = parse_count("thread count", argv[++first], MAX_THREADS);
            if (o->threads < 1) return 2;
        } else {
            break;
        }
    }
    if (argc - first < 2 || argc - first > 4) {
        fprintf(stderr, "usage: %s [-p] [-t THREADS] INPUT.bin OUTPUT.bin [RUNS [WEIGHTS.bin]]\n", argv[0]);
        return 2;
    }
    o->input = argv[first];
    o->output = argv[first + 1];
    o->runs = argc - first > 2 ? parse_count("run count", argv[first + 2], MAX_RUNS) : 1;
    if (o->runs < 1) return 2;
    /* The weights: the 4th argument, else weights.bin in the program's own folder. */
    const char *slash = strrchr(argv[0], '/');
    const int dir = slash ? (int)(slash - argv[0]) + 1 : 0;
    snprintf(weights_path, path_size, "%.*sweights.bin", dir, argv[0]);
    o->weights = argc - first > 3 ? argv[first + 3] : weights_path;
    return 0;
}

#ifdef MODEL_WEIGHTS_FILE
/* The weights from their file into `weights` (MODEL_WEIGHT_BYTES); one line on failure. */
static int read_weights(const char *path, void *weights) {
    int status = check_file("weights", path, (long)MODEL_WEIGHT_BYTES, "float32");
    if (status) return status;
    FILE *f = fopen(path, "rb");
    if (!f || fread(weights, 1, MODEL_WEIGHT_BYTES, f) != MODEL_WEIGHT_BYTES) {
        fprintf(stderr, "cannot read the weights from %s\n", path);
        status = 2;
    }
    if (f) fclose(f);
    return status;
}
#endif

/* The outputs not streamed, from the arena after the last run, each at its place in `out` (the
 * streamed ones are there already); closes `out`. */
static int write_outputs(FILE *out, const char *path, const void *arena, long runs) {
    float chunk[1024];
    int failed = 0;
    long base = 0;
    for (int m = 0; m < MODEL_CNNS && !failed; m++)
    for (int k = 0; k < model_outputs(m) && !failed; base += model_output_elems(m, k) * (long)sizeof(float), k++) {
        if (model_output_streamed(m, k)) continue;
        failed = fseek(out, base, SEEK_SET) != 0;
        for (long i = 0, total = model_output_elems(m, k); i < total && !failed; i += 1024) {
            const long count = total - i < 1024 ? total - i : 1024;
            model_read(arena, m, k, runs - 1, i, count, chunk);
            failed = fwrite(chunk, sizeof(float), (size_t)count, out) != (size_t)count;
        }
    }
    if (fclose(out) || failed) {
        fprintf(stderr, "cannot write %s: %s\n", path, strerror(errno));
        return 2;
    }
    return 0;
}

#ifdef MODEL_WEIGHTS_FILE
#define WEIGHTS weights,
#define WEIGHT_FILE_BYTES ((size_t)MODEL_WEIGHT_BYTES)
#define IMAGE_WEIGHTS ((size_t)0)
#else
#define WEIGHTS
#define WEIGHT_FILE_BYTES ((size_t)0)
#define IMAGE_WEIGHTS ((size_t)MODEL_WEIGHT_BYTES) /* const data in the program's image */
#endif

static double elapsed(const struct timespec *t0, const struct timespec *t1) {
    return (double)(t1->tv_sec - t0->tv_sec) + 1e-9 * (double)(t1->tv_nsec - t0->tv_nsec);
}

/* The median of what the wall and the CPU clock read around nothing, read as a run is timed. */
static void empty_intervals(double *wall, double *cpu) {
    enum { SAMPLES = 101 };
    double w[SAMPLES], c[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) {
        struct timespec c0, w0, w1, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        clock_gettime(CLOCK_MONOTONIC, &w0);
        clock_gettime(CLOCK_MONOTONIC, &w1);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        w[i] = elapsed(&w0, &w1);
        c[i] = elapsed(&c0, &c1);
    }
    qsort(w, SAMPLES, sizeof(double), cmp);
    qsort(c, SAMPLES, sizeof(double), cmp);
    *wall = w[SAMPLES / 2];
    *cpu = c[SAMPLES / 2];
}

/* Every run, timed into seconds[] (wall) and own[] (the shorter of wall and CPU time, less the
 * clocks' empty intervals); 0, or 3 with the failing CNN said. Streamed outputs go into `out`. */
static int run_all(void *arena, const float *weights, FILE *in, FILE *out, const char *whole, const options *o,
                   double *seconds, double *own) {
    const long runs = o->runs;
    const int threads = (int)o->threads;
    /* One source per input of each CNN: its rows read from where it lies in the file. */
    file_source src[MODEL_CNNS][MODEL_MAX_INPUTS];
    tf_source sources[MODEL_CNNS][MODEL_MAX_INPUTS];
    long base = 0, first[MODEL_CNNS];
    for (int m = 0; m < MODEL_CNNS; m++) {
        first[m] = base;
        for (int k = 0; k < model_inputs(m); k++) {
            const long *shape = model_input_shape_of(m, k);
            src[m][k].f = in;
            src[m][k].base = base;
            src[m][k].shape = shape;
            src[m][k].item = model_input_item(m, k);
            src[m][k].nhwc = model_input_nhwc(m, k);
            sources[m][k].fill = file_rows;
            sources[m][k].ctx = &src[m][k];
            base += shape[0] * shape[1] * shape[2] * shape[3] * (long)src[m][k].item;
        }
    }
    /* One sink per output of each CNN: its rows written where it lies in OUTPUT.bin (as floats). */
    file_sink dst[MODEL_CNNS][MODEL_MAX_OUTPUTS];
    tf_sink sinks[MODEL_CNNS][MODEL_MAX_OUTPUTS];
    base = 0;
    for (int m = 0; m < MODEL_CNNS; m++)
        for (int k = 0; k < model_outputs(m); k++) {
            dst[m][k].f = out;
            dst[m][k].base = base;
            dst[m][k].shape = model_output_shape_of(m, k);
            dst[m][k].item = model_output_item(m, k);
            sinks[m][k].emit = file_emit;
            sinks[m][k].ctx = &dst[m][k];
            base += model_output_elems(m, k) * (long)sizeof(float);
        }
    (void)weights;
    double wall_empty, cpu_empty;
    empty_intervals(&wall_empty, &cpu_empty);
    for (long r = 0; r < runs; r++) {
        struct timespec c0, t0, t1, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int m = 0; m < MODEL_CNNS; m++) {
            tf_tensor tensors[MODEL_MAX_INPUTS];
            if (whole) { /* the input read whole first: a source over it per input */
                const char *at = whole + first[m];
                for (int k = 0; k < model_inputs(m); k++) {
                    const long *s = model_input_shape_of(m, k);
                    tensors[k] = (tf_tensor){at, s[1], s[2], s[3], model_input_item(m, k), model_input_nhwc(m, k)};
                    sources[m][k] = (tf_source){tf_tensor_rows, &tensors[k]};
                    at += s[0] * s[1] * s[2] * s[3] * model_input_item(m, k);
                }
            }
            const int status = model_run_cnn_io(arena, WEIGHTS m, r, sources[m], sinks[m], threads);
            if (status) {
                fprintf(stderr, "CNN %d stopped with status %d (%s)\n", m, status,
                        whole ? "a kernel failed, or writing its output rows" : "reading its input rows or writing its "
                        "output rows failed, or a kernel");
                return 3;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        seconds[r] = elapsed(&t0, &t1);
        const double wall = seconds[r] - wall_empty, cpu = elapsed(&c0, &c1) - cpu_empty;
        own[r] = wall < cpu ? wall : cpu;
        if (own[r] < 0) own[r] = 0;
    }
    return 0;
}

int main(int argc, char **argv) {
    options o;
    char weights_path[4096];
    int status = parse(argc, argv, &o, weights_path, sizeof weights_path);
    if (status) return status;
    const long in_bytes = input_bytes();
    status = check_file("input", o.input, in_bytes, input_kind());
    if (status) return status;
    const size_t need = (size_t)MODEL_ARENA_BYTES + WEIGHT_FILE_BYTES + (o.preload ? (size_t)in_bytes : 0)
                        + 2 * (size_t)o.runs * sizeof(double);
    if (!memory_allows(need, IMAGE_WEIGHTS)) return 4;
    void *arena = NULL, *weights = NULL;
    char *whole = NULL;
    double *seconds = NULL;
    FILE *in = NULL, *out = NULL;
    status = 4;
    if (!(arena = allocate("the arena", MODEL_ARENA_BYTES))) goto done;
#ifdef MODEL_WEIGHTS_FILE
    if (!(weights = allocate("the weights", MODEL_WEIGHT_BYTES))) goto done;
    if ((status = read_weights(o.weights, weights)) != 0) goto done;
    status = 4;
#endif
    if (!(seconds = allocate("the timings", 2 * (size_t)o.runs * sizeof(double)))) goto done;
    if (o.preload && !(whole = allocate("the input", (size_t)in_bytes))) goto done;
    status = 2;
    if (!(in = fopen(o.input, "rb")) || (whole && fread(whole, 1, (size_t)in_bytes, in) != (size_t)in_bytes)) {
        fprintf(stderr, "cannot read input %s: %s\n", o.input, strerror(errno));
        goto done;
    }
    if (!(out = fopen(o.output, "wb"))) {
        fprintf(stderr, "cannot write %s: %s\n", o.output, strerror(errno));
        goto done;
    }
    double *own = seconds + o.runs;
    if ((status = run_all(arena, weights, in, out, whole, &o, seconds, own)) != 0) goto done;
    status = write_outputs(out, o.output, arena, o.runs);
    out = NULL; /* closed */
    if (status) goto done;
    qsort(seconds, (size_t)o.runs, sizeof(double), cmp);
    /* the runs after the first (which pays for cold pages and caches), where there are any */
    const long warm = o.runs > 1 ? o.runs - 1 : 1;
    qsort(own + o.runs - warm, (size_t)warm, sizeof(double), cmp);
    /* simd: the vector width the kernels were built with (0: the portable path), so a check
     * can tell which path it ran. */
    printf("runs %ld median_seconds %.9f cpu_seconds %.9f peak_rss_kib %ld simd %d\n", o.runs, seconds[o.runs / 2],
           own[o.runs - warm + warm / 2], peak_rss_kib(), tf_simd());
done:
    if (in) fclose(in);
    if (out) fclose(out);
    free(whole);
    free(seconds);
    free(weights);
    free(arena);
    return status;
}
