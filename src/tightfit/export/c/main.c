/* main.c: tightfit's test program for an exported model (not part of the library).
 * usage: model [-p] INPUT.bin OUTPUT.bin [RUNS [WEIGHTS.bin]]
 * INPUT.bin holds every CNN's input, float32 NCHW, one after another; OUTPUT.bin gets every output
 * of every CNN likewise. The input is read by rows as the plan's steps ask for them, so it is never
 * whole in memory; the arena is this program's only large buffer (and the weights, when they come
 * from a file). With -p the input is read whole first (timings then count no file reads). Prints the median seconds of a run and the process's peak resident set (VmHWM). */
#define _POSIX_C_SOURCE 200112L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model.h"

static float arena[MODEL_ARENA_BYTES / 4 + 1] TF_ALIGNED;

typedef struct { FILE *f; long base; const long *shape; } file_source;

static int file_rows(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                     float *dst, long sn, long sc, long sh, long sw) {
    const file_source *s = (const file_source *)ctx;
    const long c_ = s->shape[1], h_ = s->shape[2], w_ = s->shape[3];
    float chunk[256];
    for (long n = n0; n < n1; n++)
    for (long c = 0; c < c_; c++)
    for (long h = h0; h < h1; h++) {
        if (fseek(s->f, s->base + (((n * c_ + c) * h_ + h) * w_ + w0) * (long)sizeof(float), SEEK_SET)) return 1;
        for (long w = w0; w < w1; w += 256) {
            const long k = w1 - w < 256 ? w1 - w : 256;
            if (fread(chunk, sizeof(float), (size_t)k, s->f) != (size_t)k) return 1;
            float *out = dst + (n - n0) * sn + c * sc + (h - h0) * sh + (w - w0) * sw;
            for (long i = 0; i < k; i++) out[i * sw] = chunk[i];
        }
    }
    return 0;
}

/* The process's peak resident set (VmHWM, Linux), in KiB; -1 where unknown. */
static long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const int preload = argc > 1 && strcmp(argv[1], "-p") == 0;
    if (preload) {
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: %s [-p] INPUT.bin OUTPUT.bin [RUNS [WEIGHTS.bin]]\n", argv[0]);
        return 2;
    }
    const long runs = argc > 3 ? atol(argv[3]) : 1;
    FILE *in = fopen(argv[1], "rb");
    if (!in || runs < 1) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
#ifdef MODEL_WEIGHTS_FILE
    const char *wpath = argc > 4 ? argv[4] : "weights.bin";
    FILE *wf = fopen(wpath, "rb");
    void *block = NULL;
    if (posix_memalign(&block, 64, MODEL_WEIGHT_BYTES + 4)) block = NULL;
    float *weights = block;
    if (!wf || !weights || fread(weights, 1, MODEL_WEIGHT_BYTES, wf) != MODEL_WEIGHT_BYTES) {
        fprintf(stderr, "cannot read the weights from %s\n", wpath);
        return 2;
    }
    fclose(wf);
#define WEIGHTS weights,
#else
#define WEIGHTS
#endif
    file_source src[MODEL_CNNS];
    float *whole = NULL;
    long base = 0;
    for (int m = 0; m < MODEL_CNNS; m++) {
        const long *shape = model_input_shape(m);
        src[m].f = in;
        src[m].base = base;
        src[m].shape = shape;
        base += shape[0] * shape[1] * shape[2] * shape[3] * (long)sizeof(float);
    }
    if (preload) {
        whole = malloc((size_t)base + 4);
        if (!whole || fread(whole, 1, (size_t)base, in) != (size_t)base) {
            fprintf(stderr, "cannot read %s\n", argv[1]);
            return 2;
        }
    }
    double *seconds = malloc((size_t)runs * sizeof(double));
    if (!seconds) return 3;
    for (long r = 0; r < runs; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int m = 0; m < MODEL_CNNS; m++) {
            const int status = preload ? model_run_tensor(arena, WEIGHTS m, r, whole + src[m].base / (long)sizeof(float))
                                       : model_run_cnn(arena, WEIGHTS m, r, file_rows, &src[m]);
            if (status) {
                fprintf(stderr, "CNN %d stopped with status %d\n", m, status);
                return 3;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        seconds[r] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    fclose(in);
    FILE *out = fopen(argv[2], "wb");
    if (!out) {
        fprintf(stderr, "cannot write %s\n", argv[2]);
        return 2;
    }
    float chunk[1024];
    for (int m = 0; m < MODEL_CNNS; m++)
    for (int k = 0; k < model_outputs(m); k++)
    for (long i = 0, total = model_output_elems(m, k); i < total; i += 1024) {
        const long count = total - i < 1024 ? total - i : 1024;
        model_read(arena, m, k, runs - 1, i, count, chunk);
        if (fwrite(chunk, sizeof(float), (size_t)count, out) != (size_t)count) return 2;
    }
    if (fclose(out)) return 2;
    qsort(seconds, (size_t)runs, sizeof(double), cmp);
    printf("runs %ld median_seconds %.9f peak_rss_kib %ld\n", runs, seconds[runs / 2], peak_rss_kib());
    free(seconds);
    free(whole);
#ifdef MODEL_WEIGHTS_FILE
    free(block); /* else LeakSanitizer fails a -fsanitize=address run of the program */
#endif
    return 0;
}
