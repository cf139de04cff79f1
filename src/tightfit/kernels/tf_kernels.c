/* tightfit kernels (see tf_kernels.h): every op of the plan format over strided views of one arena.
 * This one file is what the Python executor loads (built as a shared library), what its profiler
 * times and what the exported program compiles.
 *
 * Each op has a portable C99 path that takes any view. Where the compiler targets vectors (GCC or
 * clang with AVX-512, AVX2 or NEON enabled by the flags: -march=native, -mavx2, an aarch64 target),
 * or with -DTF_SIMD=1, the hot ops on channels-last views (unit-stride channels) take a vector path
 * written with the compiler's generic vectors of 16 floats (one zmm, two ymm or four q registers):
 * dense and depthwise convolutions register-blocked, pooling, batch norm and residual sums with their
 * clamp fused. -DTF_SIMD=0 forces the portable path (a microcontroller build has no vectors). */
/* Threads (pthreads) where the platform has them; -DTF_THREADS=0 builds without (a
 * microcontroller's build has no __unix__ and gets none). */
#ifndef TF_THREADS
#if defined(__unix__) || defined(__APPLE__)
#define TF_THREADS 1
#else
#define TF_THREADS 0
#endif
#endif
#if TF_THREADS && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200112L
#endif

#include <float.h>
#include <math.h>
#include <string.h>
#if TF_THREADS
#include <pthread.h>
#endif

#include "tf_kernels.h"

/* The step kinds a build runs: bit k for TF_STEP_k (default every one). An exported program's build
 * passes its plan's kinds (-DTF_KINDS=0x...ULL, its Makefile's KINDS): the kernels of the others are
 * then never called, so the compiler leaves them out (a static glibc program of yolov2-16 maps 124
 * KiB less code), and a step of a kind left out stops the run with -1. */
#ifndef TF_KINDS
#define TF_KINDS (~0ULL)
#endif
#define TF_WANTS(kind) ((TF_KINDS >> (kind)) & 1ULL)
#define TF_INT8_KINDS (((1ULL << (TF_STEP_QMUL + 1)) - 1) & ~((1ULL << TF_STEP_QCONV) - 1))

#ifndef TF_SIMD
#if defined(__GNUC__) && (defined(__AVX512F__) || defined(__AVX2__) || defined(__ARM_NEON) || defined(__aarch64__))
#define TF_SIMD 1
#else
#define TF_SIMD 0
#endif
#endif

/* --- activations ------------------------------------------------------------------------------ */

/* e^x in plain arithmetic that a compiler vectorizes (libm's expf is a call per element: SiLU
 * after efficientnet_b0's convolutions took 40% of its run): Cody-Waite reduction by ln 2, n
 * rounded by the 1.5 * 2^23 shift (no branch, no conversion), Cephes' degree-6 polynomial; within
 * 2 ulp of expf over its range, NaN in NaN out, clamped where expf under- or overflows. */
static inline float exp_fast(float x) {
    float v = x < -87.3f ? -87.3f : x;
    v = v > 88.3f ? 88.3f : v;
    union { int32_t i; float f; } shifted, scale;
    shifted.f = v * 1.44269504088896341f + 12582912.0f;
    const float n = shifted.f - 12582912.0f;
    const float r = v - n * 0.693359375f + n * 2.12194440e-4f;
    const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r
                     + 1.6666665459e-1f) * r + 5.0000001201e-1f;
    scale.i = (shifted.i - 0x4B400000 + 127) << 23;
    return (p * r * r + r + 1.0f) * scale.f;
}

static float act1(int kind, float a, float b, float v) {
    float t;
    switch (kind) {
    case TF_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case TF_ACT_LEAKYRELU: return v >= 0.0f ? v : a * v;
    case TF_ACT_CLIP: return v < a ? a : (v > b ? b : v);
    case TF_ACT_SIGMOID: return 1.0f / (1.0f + exp_fast(-v));
    case TF_ACT_TANH: return tanhf(v);
    case TF_ACT_HARDSIGMOID: t = a * v + b; return t < 0.0f ? 0.0f : (t > 1.0f ? 1.0f : t);
    case TF_ACT_HARDSWISH: t = v + 3.0f; t = t < 0.0f ? 0.0f : (t > 6.0f ? 6.0f : t); return v * t / 6.0f;
    case TF_ACT_SILU: return v / (1.0f + exp_fast(-v));
    case TF_ACT_MISH: t = v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v)); return v * tanhf(t);
    case TF_ACT_GELU: return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    case TF_ACT_GELU_TANH: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case TF_ACT_SOFTPLUS: return v > 0.0f ? v + log1pf(expf(-v)) : log1pf(expf(v));
    case TF_ACT_ELU: return v >= 0.0f ? v : a * expm1f(v);
    case TF_ACT_SELU: return v > 0.0f ? b * v : b * a * expm1f(v);
    case TF_ACT_SQRT: return sqrtf(v);
    case TF_ACT_EXP: return expf(v);
    case TF_ACT_LOG: return logf(v);
    case TF_ACT_NEG: return -v;
    case TF_ACT_ABS: return fabsf(v);
    case TF_ACT_RECIPROCAL: return 1.0f / v;
    case TF_ACT_ERF: return erff(v);
    default: return v;
    }
}

static float acts(const tf_acts *a, float v) {
    if (!a) return v;
    for (int i = 0; i < TF_MAX_ACTS && a->kind[i]; i++) v = act1(a->kind[i], a->a[i], a->b[i], v);
    return v;
}

#if TF_SIMD
static int v_act_run(float *p, long c, int kind);
#endif

/* The chain over c values `stride` apart (in place). */
static void acts_pixel(float *p, long c, long stride, const tf_acts *a) {
    if (!a || !a->kind[0]) return;
    if (!a->kind[1] && stride == 1) {  /* one activation over contiguous values: loops that vectorize */
#if TF_SIMD
        if (v_act_run(p, c, a->kind[0])) return;
#endif
        switch (a->kind[0]) {
        case TF_ACT_RELU: for (long k = 0; k < c; k++) p[k] = p[k] > 0.0f ? p[k] : 0.0f; return;
        case TF_ACT_SIGMOID: for (long k = 0; k < c; k++) p[k] = 1.0f / (1.0f + exp_fast(-p[k])); return;
        case TF_ACT_SILU: for (long k = 0; k < c; k++) p[k] = p[k] / (1.0f + exp_fast(-p[k])); return;
        /* a select, not act1's branch: the branch's cost followed the data (mispredicted on random values) */
        case TF_ACT_LEAKYRELU: { const float s = a->a[0]; for (long k = 0; k < c; k++) p[k] = p[k] >= 0.0f ? p[k] : s * p[k]; return; }
        default: break;
        }
    }
    if (a->kind[0] == TF_ACT_RELU && !a->kind[1]) {
        for (long k = 0; k < c; k++) p[k * stride] = p[k * stride] > 0.0f ? p[k * stride] : 0.0f;
        return;
    }
    for (long k = 0; k < c; k++) p[k * stride] = acts(a, p[k * stride]);
}

/* The chain over every element of y (in place). */
static void acts_view(float *arena, const tf_view *y, const tf_acts *a) {
    if (!a || !a->kind[0]) return;
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        acts_pixel(arena + y->off + n * y->sn + h * y->sh + w * y->sw, y->c, y->sc, a);
    }
}

static float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* --- convolution ------------------------------------------------------------------------------ */

/* Kernel rows [k0, k1) whose input row i + k * d lies in [0, size) (i: the row of tap 0). */
static void tap_span(long i, long k, long d, long size, long *k0, long *k1) {
    long lo = i >= 0 ? 0 : (d == 1 ? -i : (-i + d - 1) / d); /* d == 1: no division (one per pixel counts) */
    long hi = size - i <= 0 ? 0 : (d == 1 ? size - i : (size - i + d - 1) / d);
    *k0 = lo;
    *k1 = hi < k ? hi : k;
}

/* Output pixel (oy, ox)'s window: the input pixel of tap (0, 0), (iy, ix) = (oy * sh - pt, ox * sw -
 * pl), which may lie in the padding, and the kernel rows [ky0, ky1) and columns [kx0, kx1) inside x. */
typedef struct { long iy, ix, ky0, ky1, kx0, kx1; } window;

static window window_at(const tf_view *x, long iy, long ix, long kh, long kw, long dh, long dw) {
    window t;
    t.iy = iy;
    t.ix = ix;
    tap_span(iy, kh, dh, x->h, &t.ky0, &t.ky1);
    tap_span(ix, kw, dw, x->w, &t.kx0, &t.kx1);
    return t;
}

static void conv_dense(float *arena, const float *wts, const tf_conv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long cin = x->c, cout = y->c, rows = a->kh * a->kw * cin, panels = (cout + 15) / 16;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, 1, 1);
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long p = 0; p < panels; p++) {
            const float *wp = wts + a->w + p * rows * 16;
            float acc[16];
            memcpy(acc, wts + a->b + p * 16, sizeof acc);
            for (long ky = t.ky0; ky < t.ky1; ky++)
            for (long kx = t.kx0; kx < t.kx1; kx++) {
                const float *in = arena + x->off + n * x->sn + (t.iy + ky) * x->sh + (t.ix + kx) * x->sw;
                const float *wr = wp + (ky * a->kw + kx) * cin * 16;
                for (long k = 0; k < cin; k++) {
                    const float xv = in[k * x->sc];
                    for (int j = 0; j < 16; j++) acc[j] += xv * wr[k * 16 + j];
                }
            }
            const long m = cout - p * 16 < 16 ? cout - p * 16 : 16;
            for (long j = 0; j < m; j++) out[(p * 16 + j) * y->sc] = clampf(acc[j], a->lo, a->hi);
        }
    }
}

static void conv_depthwise(float *arena, const float *wts, const tf_conv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long c = y->c;
    const float *w = wts + a->w, *b = wts + a->b;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long k = 0; k < c; k++) out[k * y->sc] = b[k];
        for (long ky = t.ky0; ky < t.ky1; ky++)
        for (long kx = t.kx0; kx < t.kx1; kx++) {
            const float *in = arena + x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw;
            const float *tap = w + (ky * a->kw + kx) * c;
            for (long k = 0; k < c; k++) out[k * y->sc] += in[k * x->sc] * tap[k];
        }
        for (long k = 0; k < c; k++) out[k * y->sc] = clampf(out[k * y->sc], a->lo, a->hi);
    }
}

static void conv_grouped(float *arena, const float *wts, const tf_conv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long cig = x->c / a->groups, cog = y->c / a->groups, rows = a->kh * a->kw * cig;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long g = 0; g < a->groups; g++) {
            const float *w = wts + a->w + g * rows * cog, *b = wts + a->b + g * cog;
            float *o = out + g * cog * y->sc;
            for (long k = 0; k < cog; k++) o[k * y->sc] = b[k];
            for (long ky = t.ky0; ky < t.ky1; ky++)
            for (long kx = t.kx0; kx < t.kx1; kx++) {
                const float *in = arena + x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw
                                  + g * cig * x->sc;
                const float *wr = w + (ky * a->kw + kx) * cig * cog;
                for (long ci = 0; ci < cig; ci++) {
                    const float xv = in[ci * x->sc];
                    for (long k = 0; k < cog; k++) o[k * y->sc] += xv * wr[ci * cog + k];
                }
            }
            for (long k = 0; k < cog; k++) o[k * y->sc] = clampf(o[k * y->sc], a->lo, a->hi);
        }
    }
}

/* --- the vector path ---------------------------------------------------------------------------- */

#if TF_SIMD
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

/* Output pixels the dense convolution accumulates at once, each in up to TF_PANELS panels of 16
 * channels held in registers: 6 x 4 fill 24 of AVX-512's 32 vector registers (4 more hold the
 * panels' weights; the input value is a broadcast operand); AVX2 (16 of 8 floats) and NEON (32 of 4)
 * hold 3 x 2 without spilling. */
#ifndef TF_PIXELS
#if defined(__AVX512F__)
#define TF_PIXELS 6
#else
#define TF_PIXELS 3
#endif
#endif
#ifndef TF_PANELS
#if defined(__AVX512F__)
#define TF_PANELS 4
#else
#define TF_PANELS 2
#endif
#endif
#if (TF_PIXELS != 3 && TF_PIXELS != 6) || (TF_PANELS != 2 && TF_PANELS != 4)
#error "TF_PIXELS must be 3 or 6 and TF_PANELS 2 or 4 (the dense blocks compiled)"
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

/* A convolution as the vector kernels take it: pointers and element strides of the views, the window
 * (dilation 1) and the clamp. Depthwise needs channels-last views (channels unit-stride); dense
 * takes any channel strides xs_c, ys_c (channels-first: the plane size), compiled apart for 1. */
typedef struct {
    const float *x; float *y; const float *w; const float *b;
    long n, c, ih, iw, oh, ow, cin;          /* c: output channels, cin: input channels */
    long xs_n, xs_h, xs_w, ys_n, ys_h, ys_w;
    long kh, kw, sh, sw, pt, pl;             /* kernel, stride, top and left zero padding */
    float lo, hi;
    long xs_c, ys_c;
    int act;                                 /* applied after the clamp: 0, TF_ACT_SILU or TF_ACT_SIGMOID */
} vconv;

/* m <= 16 floats; a constant 16 is one vector load or store. */
static inline __attribute__((always_inline)) v16 load(const float *p, long m) {
    v16 v = {0};
    if (m == 16) memcpy(&v, p, 64); else memcpy(&v, p, (size_t)m * sizeof(float));
    return v;
}

static inline __attribute__((always_inline)) void store(float *p, v16 v, long m) {
    if (m == 16) memcpy(p, &v, 64); else memcpy(p, &v, (size_t)m * sizeof(float));
}

static inline __attribute__((always_inline)) v16 splat(float v) { return v - (v16){0}; }

static inline __attribute__((always_inline)) v16 clamp16(v16 v, v16 lo, v16 hi) { /* NaN passes through */
    const i16 below = v < lo, above = v > hi;
    const i16 r = ((i16)lo & below) | ((i16)v & ~below);
    return (v16)(((i16)hi & above) | (r & ~above));
}

static void clamp_run(float *restrict out, long c, float lo, float hi) {
    for (long k = 0; k < c; k++) {
        float v = out[k];
        v = v < lo ? lo : v;
        out[k] = v > hi ? hi : v;
    }
}

/* Lanes of a where m is set, of b elsewhere. */
static inline __attribute__((always_inline)) v16 pick(i16 m, v16 a, v16 b) {
    return (v16)(((i16)a & m) | ((i16)b & ~m));
}

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* exp_fast on 16 lanes, written out on vectors: the scalar loop's clamps, left to the vectorizer,
 * became three masked divisions per vector in SiLU (80% of acts_pixel's time). AVX-512 clamps with
 * min / max (x the operand a NaN passes from), rounds n with roundscale and scales by 2^n with
 * scalef: 20 instructions a vector in SiLU instead of 28 (it is bound by their count, the
 * multiply-adds most: Zen 4 runs one of 16 lanes a cycle). The polynomial is of degree 5, not
 * exp_fast's 7: near-minimax for e^r on [-ln 2 / 2, ln 2 / 2] (fitted by reweighted least squares),
 * within 2e-7 of e^x relatively (3 ulp), and so are the sigmoid and SiLU made from it. */
static inline __attribute__((always_inline)) v16 exp16(v16 x) {
#if defined(__AVX512F__)
    const __m512 v = _mm512_min_ps(_mm512_set1_ps(88.3f), _mm512_max_ps(_mm512_set1_ps(-87.3f), (__m512)x));
    const v16 n = (v16)_mm512_roundscale_ps((__m512)((v16)v * 1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT);
    const v16 r = (v16)v - n * 0.693359375f + n * 2.12194440e-4f;
#else
    v16 v = pick(x < splat(-87.3f), splat(-87.3f), x);
    v = pick(v > splat(88.3f), splat(88.3f), v);
    const v16 shifted = v * 1.44269504088896341f + 12582912.0f, n = shifted - 12582912.0f;
    const v16 r = v - n * 0.693359375f + n * 2.12194440e-4f;
#endif
    const v16 p = ((8.312532678e-3f * r + 4.189014062e-2f) * r + 1.666711420e-1f) * r + 4.999923110e-1f;
    const v16 e = (p * r + 1.0f) * r + 1.0f;  /* 1 + r + r^2 p in two multiply-adds */
#if defined(__AVX512F__)
    return (v16)_mm512_scalef_ps((__m512)e, (__m512)n);
#else
    return e * (v16)((((i16)shifted) - 0x4B400000 + 127) << 23);
#endif
}

/* 1 / d for d >= 1 (or NaN): AVX-512's 14-bit estimate and one Newton step (within 2 ulp), where a
 * division per vector held SiLU to half its speed; elsewhere the division. */
static inline __attribute__((always_inline)) v16 recip16(v16 d) {
#if defined(__AVX512F__)
    const v16 r = (v16)_mm512_rcp14_ps((__m512)d);
    return r * (2.0f - d * r);
#else
    return 1.0f / d;
#endif
}

/* The activations the vector kernels apply to the outputs they just stored (still in L1): SiLU
 * and sigmoid, efficientnet_b0's (a second pass over a convolution's whole output read and wrote
 * every value from memory again). */
static inline __attribute__((always_inline)) v16 act16(v16 v, int kind) {
    if (kind == TF_ACT_SILU) return v * recip16(1.0f + exp16(-v));
    if (kind == TF_ACT_SIGMOID) return recip16(1.0f + exp16(-v));
    return v;
}

/* The activation kinds act16 has. */
static int vector_act(int kind) { return kind == TF_ACT_SILU || kind == TF_ACT_SIGMOID; }

/* Whole vectors in the loop: a load or store of a variable count goes through the stack, and a 64-byte
 * load of what was just stored there as two halves (AVX-512 on AMD's Zen 4) is not forwarded: 25
 * cycles a vector. */
static int v_act_run(float *p, long c, int kind) {
    if (!vector_act(kind)) return 0;
    long k = 0;
    for (; k + 16 <= c; k += 16) store(p + k, act16(load(p + k, 16), kind), 16);
    if (k < c) store(p + k, act16(load(p + k, c - k), kind), c - k);
    return 1;
}

/* Channels [c0, c1) (element stride sc) of r output pixels, just stored (in L1), through the
 * activation: applied in the registers before the stores, its code in every block shape's loops
 * slowed the plain ones (mobilenet_v2 8.1 -> 9.2 ms). */
static void act_pixels(float *const *yp, int r, long c0, long c1, long sc, int kind) {
    int abut = sc == 1;  /* each pixel's run ends where the next one's starts: one run (fewer set-ups) */
    for (int i = 0; abut && i + 1 < r; i++) abut = yp[i] + c1 == yp[i + 1] + c0;
    if (abut) {
        v_act_run(yp[0] + c0, r * (c1 - c0), kind);
        return;
    }
    for (int i = 0; i < r; i++) {
        if (sc == 1) v_act_run(yp[i] + c0, c1 - c0, kind);
        else for (long k = c0; k < c1; k++) yp[i][k * sc] = act1(kind, 0.0f, 0.0f, yp[i][k * sc]);
    }
}

/* The kernel taps of output pixel (oy, ox) that read the input, not its zero padding: rows [y0, y1)
 * and columns [x0, x1) of the kernel; tap (ky, kx) reads input pixel (iy + ky, ix + kx). */
typedef struct { long y0, y1, x0, x1, iy, ix; } taps;

static taps taps_of(const vconv *a, long oy, long ox) {
    const long iy = oy * a->sh - a->pt, ix = ox * a->sw - a->pl;
    taps t = {iy < 0 ? -iy : 0, a->ih - iy < a->kh ? a->ih - iy : a->kh,
              ix < 0 ? -ix : 0, a->iw - ix < a->kw ? a->iw - ix : a->kw, iy, ix};
    return t;
}

static const float *input_pixel(const vconv *a, long n, long y, long x) {
    return a->x + n * a->xs_n + y * a->xs_h + x * a->xs_w;
}

/* Output pixels a depthwise block accumulates at once, each its own sum: one sum per pixel is a chain
 * of dependent multiply-adds (25 in a 5x5 window, 4 cycles each), and each tap's weights are loaded
 * once for the block (efficientnet_b0's 5x5 layers ran 2.3x onnxruntime's time a pixel at a time).
 * 6, measured: 3x3 on 144 channels of 56 x 56 0.21 ms in blocks of 4, 0.19 of 6, no faster of 8. */
#define TF_DW_PIXELS 6

/* Channels [k0, k0 + 16) of r <= TF_DW_PIXELS output pixels, `step` input pixels apart, whose window
 * rows [y0, y1) and every column lie in the input (`in`: the first one's tap (0, 0)); kw constant
 * where the caller passes one (its column loop unrolled). The taps in order (ky, kx), as one pixel's
 * sum takes them. */
static inline __attribute__((always_inline)) void dw_pixels(const vconv *a, const float *in, float *out, int r,
        long step, long y0, long y1, long k0, long kw) {
    const long c = a->c;
    v16 acc[TF_DW_PIXELS];
    const v16 bias = load(a->b + k0, 16);
    for (int i = 0; i < r; i++) acc[i] = bias;
    for (long ky = y0; ky < y1; ky++)
        for (long kx = 0; kx < kw; kx++) {
            const v16 w = load(a->w + (ky * kw + kx) * c + k0, 16);
            const float *x = in + ky * a->xs_h + kx * a->xs_w;
            for (int i = 0; i < r; i++) acc[i] += load(x + i * step, 16) * w;
        }
    const v16 lo = splat(a->lo), hi = splat(a->hi);
    for (int i = 0; i < r; i++) store(out + i * a->ys_w, clamp16(acc[i], lo, hi), 16);
}

/* One pixel whose window crosses the left or right edge (its taps' columns [x0, x1) in the input). */
static void dw_edge(const vconv *a, const taps *t, const float *in, float *out, long k0) {
    v16 acc = load(a->b + k0, 16);
    for (long ky = t->y0; ky < t->y1; ky++)
        for (long kx = t->x0; kx < t->x1; kx++)
            acc += load(in + ky * a->xs_h + kx * a->xs_w, 16) * load(a->w + (ky * a->kw + kx) * a->c + k0, 16);
    store(out, clamp16(acc, splat(a->lo), splat(a->hi)), 16);
}

/* The 16-channel runs of one output row: edge pixels one at a time, the others in blocks, every run
 * of a block before the next block (the input read in pixel order, whole pixels at a time). */
static inline __attribute__((always_inline)) void dw_row(const vconv *a, long n, long oy, long kw) {
    const long step = a->sw * a->xs_w;
    for (long ox = 0; ox < a->ow;) {
        const taps t = taps_of(a, oy, ox);
        const float *in = input_pixel(a, n, t.iy, t.ix);
        float *out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        long r = 0;  /* the pixels from ox on whose windows lie within the row */
        while (t.x0 == 0 && r < TF_DW_PIXELS && ox + r < a->ow && (ox + r) * a->sw - a->pl + kw <= a->iw) r++;
        for (long k0 = 0; k0 + 16 <= a->c; k0 += 16) {
            switch (r) {
            case 0: dw_edge(a, &t, in + k0, out + k0, k0); break;
            case 1: dw_pixels(a, in + k0, out + k0, 1, step, t.y0, t.y1, k0, kw); break;
            case 2: dw_pixels(a, in + k0, out + k0, 2, step, t.y0, t.y1, k0, kw); break;
            case 3: dw_pixels(a, in + k0, out + k0, 3, step, t.y0, t.y1, k0, kw); break;
            case 4: dw_pixels(a, in + k0, out + k0, 4, step, t.y0, t.y1, k0, kw); break;
            case 5: dw_pixels(a, in + k0, out + k0, 5, step, t.y0, t.y1, k0, kw); break;
            default: dw_pixels(a, in + k0, out + k0, TF_DW_PIXELS, step, t.y0, t.y1, k0, kw); break;
            }
        }
        ox += r ? r : 1;
    }
}

/* One output row of channels [k0, c), fewer than 16: per pixel, a channel loop per tap. */
static void dw_tail(const vconv *a, long n, long oy, long k0) {
    const long c = a->c;
    for (long ox = 0; ox < a->ow; ox++) {
        float *restrict out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        const taps t = taps_of(a, oy, ox);
        for (long k = k0; k < c; k++) out[k] = a->b[k];
        for (long ky = t.y0; ky < t.y1; ky++)
            for (long kx = t.x0; kx < t.x1; kx++) {
                const float *restrict in = input_pixel(a, n, t.iy + ky, t.ix + kx);
                const float *restrict tap = a->w + (ky * a->kw + kx) * c;
                for (long k = k0; k < c; k++) out[k] += in[k] * tap[k];
            }
        clamp_run(out + k0, c - k0, a->lo, a->hi);
    }
}

/* w is (kh * kw) x c: the taps of every channel, one row per tap. Row by row (3x3 and 5x5 windows
 * compiled apart), then the row's activation while it is in L1. */
static void v_depthwise(const vconv *a) {
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++) {
        if (a->kw == 3) dw_row(a, n, oy, 3);
        else if (a->kw == 5) dw_row(a, n, oy, 5);
        else dw_row(a, n, oy, a->kw);
        if (a->c % 16) dw_tail(a, n, oy, a->c - a->c % 16);
        if (!a->act) continue;
        float *row = a->y + n * a->ys_n + oy * a->ys_h;  /* just written, in L1 */
        if (a->ys_w == a->c) v_act_run(row, a->ow * a->c, a->act);  /* whole pixels: one run */
        else for (long ox = 0; ox < a->ow; ox++) v_act_run(row + ox * a->ys_w, a->c, a->act);
    }
}

/* Dense: w is panels of 16 output channels, (ceil(c / 16), kh * kw * cin, 16), zero padded; b is
 * padded to the panels. r <= TF_PIXELS output pixels with the same taps (xp: each one's input pixel
 * at tap (0, 0), which may lie in the padding; yp: its output) times np <= TF_PANELS panels are
 * accumulated in registers, one broadcast input value and np weight vectors per tap and channel. */
static inline __attribute__((always_inline)) void store_c(float *p, v16 v, long m, long sc) {
    if (sc == 1) { store(p, v, m); return; }
    float lane[16];
    memcpy(lane, &v, 64);
    for (long k = 0; k < m; k++) p[k * sc] = lane[k];
}

/* acc += the len inputs from off (stride xc) of each pixel times weight rows [row, row + len). */
static inline __attribute__((always_inline)) void dense_run(v16 (*acc)[TF_PIXELS], const float **xp, int r, int np,
        const float *w0, long rows, long off, long row, long len, long xc) {
    for (long k = 0; k < len; k++) {
        v16 u[TF_PANELS];
        for (int p = 0; p < np; p++) memcpy(&u[p], w0 + p * rows * 16 + (row + k) * 16, 64);
        for (int i = 0; i < r; i++) {
            const float xv = xp[i][off + k * xc];
            for (int p = 0; p < np; p++) acc[p][i] += xv * u[p];
        }
    }
}

/* The taps in order (ky, kx, channel), as the portable kernel sums them (so any block shape, and any
 * split among threads, gives the same bits). */
static inline __attribute__((always_inline)) void dense_block(const vconv *a, const float **xp, float **yp, int r,
        int np, long j, const taps *t, long xc, long yc, int row_runs) {
    const long cin = a->cin, rows = a->kh * a->kw * cin;
    const float *w0 = a->w + j * rows * 16;
    v16 acc[TF_PANELS][TF_PIXELS];
    for (int p = 0; p < np; p++) {
        const v16 bias = load(a->b + (j + p) * 16, 16);
        for (int i = 0; i < r; i++) acc[p][i] = bias;
    }
    if (a->kh == 1 && a->kw == 1 && t->y0 == 0 && t->y1 == 1 && t->x0 == 0 && t->x1 == 1) { /* no tap loops */
        dense_run(acc, xp, r, np, w0, rows, 0, 0, cin, xc);
    } else if (row_runs) { /* channels-last, pixels adjacent: a kernel row's taps are one run */
        const long x0 = t->x0, len = (t->x1 - x0) * cin;
        for (long ky = t->y0; ky < t->y1; ky++)
            dense_run(acc, xp, r, np, w0, rows, ky * a->xs_h + x0 * cin, (ky * a->kw + x0) * cin, len, 1);
    } else {
        for (long ky = t->y0; ky < t->y1; ky++)
        for (long kx = t->x0; kx < t->x1; kx++)
            dense_run(acc, xp, r, np, w0, rows, ky * a->xs_h + kx * a->xs_w, (ky * a->kw + kx) * cin, cin, xc);
    }
    const v16 lo = splat(a->lo), hi = splat(a->hi);
    for (int p = 0; p < np; p++) {
        const long left = a->c - (j + p) * 16, m = left < 16 ? left : 16;
        for (int i = 0; i < r; i++) store_c(yp[i] + (j + p) * 16 * yc, clamp16(acc[p][i], lo, hi), m, yc);
    }
}

/* Each block shape compiled apart (constant loop bounds): r pixels times np panels. */
#define TF_BLOCK(r, np, xc, yc) case (r) * 8 + (np): dense_block(a, xp, yp, r, np, j, t, xc, yc, row_runs); break;
#define TF_PANEL_BLOCKS2(r, xc, yc) TF_BLOCK(r, 1, xc, yc) TF_BLOCK(r, 2, xc, yc)
#if TF_PANELS == 4
#define TF_PANEL_BLOCKS(r, xc, yc) TF_PANEL_BLOCKS2(r, xc, yc) TF_BLOCK(r, 3, xc, yc) TF_BLOCK(r, 4, xc, yc)
#else
#define TF_PANEL_BLOCKS(r, xc, yc) TF_PANEL_BLOCKS2(r, xc, yc)
#endif
#if TF_PIXELS == 6
#define TF_PIXEL_BLOCKS(B, xc, yc) B(1, xc, yc) B(2, xc, yc) B(3, xc, yc) B(4, xc, yc) B(5, xc, yc) B(6, xc, yc)
#else
#define TF_PIXEL_BLOCKS(B, xc, yc) B(1, xc, yc) B(2, xc, yc) B(3, xc, yc)
#endif

/* Taps x input channels below which a block takes two panels, not TF_PANELS: its sums are too short
 * to pay for twice the accumulators' set-up and stores (mobilenet_v2's 16 -> 96 1x1 on 112 x 112:
 * 0.46 ms in blocks of two panels, 0.52 ms of four). 1x1 convolutions keep two panels too (no
 * faster with four, measured: 320 -> 1280 on 7 x 7, 256 -> 128 on 28 x 28); a 7x7 stem on 3
 * channels gains 10%. */
#define TF_DEEP 128

/* Channels-last views take the blocks compiled for unit channel strides (up to TF_PANELS panels
 * where the sums are deep); any other the strided ones (two panels). */
/* A stem's few input channels (channels-last, pixels adjacent) take blocks of their own, which sum a
 * kernel row's taps as one run (7x7 on 3 channels: 3% faster). In the blocks every other
 * convolution takes, the same branch made 1x1 convolutions 5% slower (code generation, measured). */
static void dense_few(const vconv *a, const float **xp, float **yp, int r, const taps *t, long j0, long j1) {
    const int row_runs = 1;
    for (long j = j0; j < j1; j += TF_PANELS) {
        const int np = (int)(j1 - j < TF_PANELS ? j1 - j : TF_PANELS);
        switch (r * 8 + np) {
        TF_PIXEL_BLOCKS(TF_PANEL_BLOCKS, 1, 1)
        default: break;
        }
    }
}

static void dense_pixels(const vconv *a, const float **xp, float **yp, int r, const taps *t, long j0, long j1) {
    const int unit = a->xs_c == 1 && a->ys_c == 1, row_runs = 0;
    if (unit && a->cin < 16 && a->xs_w == a->cin && a->kh * a->kw * a->cin >= TF_DEEP) {
        dense_few(a, xp, yp, r, t, j0, j1);
        return;
    }
    const long most = unit && a->kh * a->kw > 1 && a->kh * a->kw * a->cin >= TF_DEEP ? TF_PANELS : 2;
    for (long j = j0; j < j1; j += most) {
        const int np = (int)(j1 - j < most ? j1 - j : most);
        if (unit) {
            switch (r * 8 + np) {
            TF_PIXEL_BLOCKS(TF_PANEL_BLOCKS, 1, 1)
            default: break;
            }
        } else {
            switch (r * 8 + np) {
            TF_PIXEL_BLOCKS(TF_PANEL_BLOCKS2, a->xs_c, a->ys_c)
            default: break;
            }
        }
    }
    if (a->act) act_pixels(yp, r, j0 * 16, j1 * 16 < a->c ? j1 * 16 : a->c, a->ys_c, a->act);
}

/* Weight bytes of the panels one pass over the pixels uses: they stay in L2 while every pixel reads
 * them (one pass over all panels would read a large layer's whole weight from memory again for every
 * block of pixels: 3x3 512->512 on 7x7, 9.4 MB, nine times). */
#define TF_PASS_BYTES (256 * 1024)

/* Pixels waiting for a block: up to TF_PIXELS with the same taps (r of them; none: a free slot). */
typedef struct { taps t; int r; const float *xp[TF_PIXELS]; float *yp[TF_PIXELS]; } pending;

/* Slots of pending pixels: the interior's, the left and right edges', and one for a corner, so that
 * the few pixels of each padded edge wait for the edge pixels of the next rows and go in full blocks
 * too, not one at a time (28 x 28 with padding 1: 4 blocks of 6, one of 2 and two of 1 a row). */
#define TF_SLOTS 4

static int same_taps(const taps *s, const taps *t) {
    return s->x0 == t->x0 && s->x1 == t->x1 && s->y0 == t->y0 && s->y1 == t->y1;
}

static void run_pending(const vconv *a, pending *s, long j0, long j1) {
    if (s->r) dense_pixels(a, s->xp, s->yp, s->r, &s->t, j0, j1);
    s->r = 0;
}

/* The pending slot for pixels of taps t: the one waiting with the same taps, else a free one, else
 * the next in turn, its pixels run first. */
static pending *slot_for(const vconv *a, pending *slot, int *turn, const taps *t, long j0, long j1) {
    pending *idle = 0;
    for (int i = 0; i < TF_SLOTS; i++) {
        if (slot[i].r && same_taps(&slot[i].t, t)) return &slot[i];
        if (!slot[i].r && !idle) idle = &slot[i];
    }
    if (!idle) {
        idle = &slot[*turn];
        *turn = (*turn + 1) % TF_SLOTS;
        run_pending(a, idle, j0, j1);
    }
    idle->t = *t;
    return idle;
}

/* Output pixels in order, in blocks of TF_PIXELS pixels of the same taps (every pixel's sums are the
 * same whichever block it goes in), in passes over a few panels of output channels each. */
static void v_dense(const vconv *a) {
    const long panels = (a->c + 15) / 16, panel_bytes = a->kh * a->kw * a->cin * 16 * (long)sizeof(float);
    const long fit = TF_PASS_BYTES / panel_bytes, chunk = fit < TF_PANELS ? TF_PANELS : fit - fit % TF_PANELS;
    for (long j0 = 0; j0 < panels; j0 += chunk) {
        const long j1 = j0 + chunk < panels ? j0 + chunk : panels;
        pending slot[TF_SLOTS];
        int turn = 0;
        for (int i = 0; i < TF_SLOTS; i++) slot[i].r = 0;
        for (long n = 0; n < a->n; n++)
        for (long oy = 0; oy < a->oh; oy++)
        for (long ox = 0; ox < a->ow; ox++) {
            const taps t = taps_of(a, oy, ox);
            pending *s = slot_for(a, slot, &turn, &t, j0, j1);
            s->xp[s->r] = input_pixel(a, n, t.iy, t.ix);
            s->yp[s->r++] = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
            if (s->r == TF_PIXELS) run_pending(a, s, j0, j1);
        }
        for (int i = 0; i < TF_SLOTS; i++) run_pending(a, &slot[i], j0, j1);
    }
}

static int unit_channels(const tf_view *x, const tf_view *y) {
    return (x->sc == 1 || x->c == 1) && (y->sc == 1 || y->c == 1);
}

/* The activation chain's one kind the vector kernels apply before their stores (0: none there). */
static int fused_act(const tf_acts *a) {
    if (!a || !a->kind[0] || (TF_MAX_ACTS > 1 && a->kind[1]) || !vector_act(a->kind[0])) return 0;
    return a->kind[0];
}

/* Dense convolutions of dilation 1 on any views, depthwise ones on channels-last views, their
 * activations applied; 0 where another kernel applies. */
static int v_conv(float *arena, const float *wts, const tf_conv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    if (a->dh != 1 || a->dw != 1 || a->kind == TF_CONV_GROUPED) return 0;
    if (a->kind == TF_CONV_DEPTHWISE && !unit_channels(x, y)) return 0;
    if (!y->n || !y->h || !y->w || !y->c) return 1;
    const int act = fused_act(a->act);
    vconv c = {arena + x->off, arena + y->off, wts + a->w, wts + a->b, y->n, y->c, x->h, x->w, y->h, y->w, x->c,
               x->sn, x->sh, x->sw, y->sn, y->sh, y->sw, a->kh, a->kw, a->sh, a->sw, a->pt, a->pl, a->lo, a->hi,
               x->c == 1 ? 1 : x->sc, y->c == 1 ? 1 : y->sc, act};
    if (a->kind == TF_CONV_DENSE) v_dense(&c); else v_depthwise(&c);
    if (!act) acts_view(arena, y, a->act);
    return 1;
}

/* Whether an activation chain is one clamp (none, ReLU or Clip), which a vector kernel fuses. */
static int one_clamp(const tf_acts *a, float *lo, float *hi) {
    *lo = -INFINITY;
    *hi = INFINITY;
    if (!a || !a->kind[0]) return 1;
    if (TF_MAX_ACTS > 1 && a->kind[1]) return 0;
    if (a->kind[0] == TF_ACT_RELU) { *lo = 0.0f; return 1; }
    if (a->kind[0] == TF_ACT_CLIP) { *lo = a->a[0]; *hi = a->b[0]; return 1; }
    return 0;
}
#endif

static void conv(float *arena, const float *wts, const tf_conv_args *a) {
#if TF_SIMD
    if (v_conv(arena, wts, a)) return;
#endif
    if (a->kind == TF_CONV_DENSE) conv_dense(arena, wts, a);
    else if (a->kind == TF_CONV_DEPTHWISE) conv_depthwise(arena, wts, a);
    else conv_grouped(arena, wts, a);
    acts_view(arena, &a->y, a->act);
}

/* --- pooling ---------------------------------------------------------------------------------- */

/* Taps k of one axis whose position o * s - pad + k * d lies in [lo, hi) (averages' divisor). */
static long taps_in(long o, long k, long s, long pad, long d, long lo, long hi) {
    long count = 0;
    for (long i = 0; i < k; i++) {
        const long t = o * s - pad + i * d;
        count += t >= lo && t < hi;
    }
    return count;
}

/* An average's divisor at output pixel (oy, ox) of the view: the taps inside the input, and with
 * count_include_pad those in the layer's padding too (never the ceil-mode overhang). */
static float pool_divisor(const tf_pool_args *a, long oy, long ox) {
    const long gy = a->oy0 + oy, gx = a->ox0 + ox, inc = a->count_include_pad;
    return (float)(taps_in(gy, a->kh, a->sh, a->pad_t, a->dh, inc ? -a->pad_t : 0, a->in_h + (inc ? a->pad_b : 0))
                   * taps_in(gx, a->kw, a->sw, a->pad_l, a->dw, inc ? -a->pad_l : 0, a->in_w + (inc ? a->pad_r : 0)));
}

#if TF_SIMD
/* The largest of the window's taps over 16 q channels, a NaN tap giving NaN (as the portable kernel's
 * max): v > m ? v : m per tap, NaNs noted apart and put in at the end (one compare less per tap);
 * q blocks at once, whose chains of compares overlap. */
static inline __attribute__((always_inline)) void window_max(float *out, const float *base, long xs_h, long xs_w,
        const window *t, int q, v16 lo, v16 hi) {
    v16 acc[4];
    i16 nan[4];
    for (int b = 0; b < q; b++) { acc[b] = splat(-FLT_MAX); nan[b] = (i16){0}; }
    for (long ky = t->ky0; ky < t->ky1; ky++)
        for (long kx = t->kx0; kx < t->kx1; kx++)
            for (int b = 0; b < q; b++) {
                v16 v;
                memcpy(&v, base + ky * xs_h + kx * xs_w + b * 16, 64);
                const i16 take = v > acc[b];
                nan[b] |= v != v;
                acc[b] = (v16)(((i16)v & take) | ((i16)acc[b] & ~take));
            }
    for (int b = 0; b < q; b++)
        store(out + b * 16, clamp16((v16)(((i16)splat(NAN) & nan[b]) | ((i16)acc[b] & ~nan[b])), lo, hi), 16);
}

/* Input column x's largest over rows [0, rows) from p (row stride xs_h), q blocks of 16 channels,
 * NaNs noted apart in nan as window_max notes them; no such column: the lowest float. */
typedef struct { v16 m[4]; i16 nan[4]; } column;

static inline __attribute__((always_inline)) column column_max(const float *p, long x, long iw, long xs_w, long xs_h,
        long rows, int q) {
    column c;
    for (int b = 0; b < q; b++) { c.m[b] = splat(-FLT_MAX); c.nan[b] = (i16){0}; }
    if (x < 0 || x >= iw) return c;
    for (long ky = 0; ky < rows; ky++)
        for (int b = 0; b < q; b++) {
            v16 v;
            memcpy(&v, p + x * xs_w + ky * xs_h + b * 16, 64);
            const i16 take = v > c.m[b];
            c.nan[b] |= v != v;
            c.m[b] = (v16)(((i16)v & take) | ((i16)c.m[b] & ~take));
        }
    return c;
}

/* The largest of three columns' maxima, a NaN in any giving NaN, clamped, stored to q blocks. */
static inline __attribute__((always_inline)) void store_max3(float *out, const column *c0, const column *c1,
        const column *c2, int q, v16 lo, v16 hi) {
    for (int b = 0; b < q; b++) {
        v16 m = c0->m[b];
        i16 take = c1->m[b] > m;
        m = (v16)(((i16)c1->m[b] & take) | ((i16)m & ~take));
        take = c2->m[b] > m;
        m = (v16)(((i16)c2->m[b] & take) | ((i16)m & ~take));
        const i16 nan = c0->nan[b] | c1->nan[b] | c2->nan[b];
        store(out + b * 16, clamp16((v16)(((i16)splat(NAN) & nan) | ((i16)m & ~nan)), lo, hi), 16);
    }
}

/* A 3-wide max pool of stride 1 or 2 along output row oy, channels [k0, k0 + 16 q): each input
 * column's maximum over the window's rows is taken once and kept for the pixels that share it
 * (stride 1: three, stride 2: two), not taken again per pixel. A pixel's maximum is its columns'
 * in column order (the same value as window_max's, row by row, but for the sign of equal zeros). */
static inline __attribute__((always_inline)) void max3_row(float *arena, const tf_pool_args *a, long n, long oy,
        long k0, int q, v16 lo, v16 hi) {
    const tf_view *x = &a->x, *y = &a->y;
    const window t = window_at(x, oy * a->sh - a->pt, -a->pl, a->kh, 3, 1, 1);
    const float *p = arena + x->off + n * x->sn + (t.iy + t.ky0) * x->sh + k0;
    const long rows = t.ky1 - t.ky0, s = a->sw, iw = x->w, xs_w = x->sw, xs_h = x->sh;
    float *out = arena + y->off + n * y->sn + oy * y->sh + k0;
    long ix = -a->pl;
    column c0 = column_max(p, ix, iw, xs_w, xs_h, rows, q), c1 = column_max(p, ix + 1, iw, xs_w, xs_h, rows, q);
    for (long ox = 0; ox < y->w; ox++, ix += s) {
        const column c2 = column_max(p, ix + 2, iw, xs_w, xs_h, rows, q);
        store_max3(out + ox * y->sw, &c0, &c1, &c2, q, lo, hi);
        if (s == 1) { c0 = c1; c1 = c2; }
        else { c0 = c2; c1 = column_max(p, ix + 3, iw, xs_w, xs_h, rows, q); }
    }
}

/* Every output row of a 3-wide max pool of stride 1 or 2, channels [0, 16 * floor(c / 16)). */
static void max3_rows(float *arena, const tf_pool_args *a, v16 lo, v16 hi) {
    const tf_view *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++) {
        long k0 = 0;
        for (; k0 + 64 <= y->c; k0 += 64) max3_row(arena, a, n, oy, k0, 4, lo, hi);
        for (; k0 + 16 <= y->c; k0 += 16) max3_row(arena, a, n, oy, k0, 1, lo, hi);
    }
}

/* Pooling of dilation 1 on channels-last views, 16 channels at a time, a clamp fused. */
static int v_pool(float *arena, const tf_pool_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    float lo, hi;
    if (!unit_channels(x, y) || a->dh != 1 || a->dw != 1 || !one_clamp(a->act, &lo, &hi)) return 0;
    const int avg = a->kind == TF_POOL_AVG;
    const v16 vlo = splat(lo), vhi = splat(hi), none = splat(-FLT_MAX);
    const int rowwise = !avg && a->kw == 3 && (a->sw == 1 || a->sw == 2);
    if (rowwise) max3_rows(arena, a, vlo, vhi);
    if (rowwise && y->c % 16 == 0) return 1;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, 1, 1);
        const float *base = arena + x->off + n * x->sn + t.iy * x->sh + t.ix * x->sw;
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        const float d = avg ? pool_divisor(a, oy, ox) : 1.0f;
        const v16 div = splat(d > 0.0f ? d : 1.0f); /* a window wholly in the padding: its sum, 0 */
        long k0 = rowwise ? y->c / 16 * 16 : 0;
        if (!avg) {
            for (; k0 + 64 <= y->c; k0 += 64) window_max(out + k0, base + k0, x->sh, x->sw, &t, 4, vlo, vhi);
            for (; k0 + 16 <= y->c; k0 += 16) window_max(out + k0, base + k0, x->sh, x->sw, &t, 1, vlo, vhi);
        }
        for (; k0 < y->c; k0 += 16) {
            const long m = y->c - k0 < 16 ? y->c - k0 : 16;
            v16 acc = avg ? splat(0.0f) : none;
            for (long ky = t.ky0; ky < t.ky1; ky++)
                for (long kx = t.kx0; kx < t.kx1; kx++) {
                    const v16 v = load(base + ky * x->sh + kx * x->sw + k0, m);
                    if (avg) {
                        acc += v;
                    } else { /* a NaN tap gives NaN */
                        const i16 take = (v > acc) | (v != v);
                        acc = (v16)(((i16)v & take) | ((i16)acc & ~take));
                    }
                }
            if (avg) acc /= div;
            store(out + k0, clamp16(acc, vlo, vhi), m);
        }
    }
    return 1;
}
#endif

/* Per output pixel, the taps in the window (padding never read), each over every channel. */
static void pool(float *arena, const tf_pool_args *a) {
#if TF_SIMD
    if (v_pool(arena, a)) return;
#endif
    const tf_view *x = &a->x, *y = &a->y;
    const int avg = a->kind == TF_POOL_AVG;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        /* A max starts at the lowest float, as onnxruntime's does: a window wholly in the padding gives it. */
        for (long c = 0; c < y->c; c++) out[c * y->sc] = avg ? 0.0f : -FLT_MAX;
        for (long ky = t.ky0; ky < t.ky1; ky++)
        for (long kx = t.kx0; kx < t.kx1; kx++) {
            const float *in = arena + x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw;
            if (avg) for (long c = 0; c < y->c; c++) out[c * y->sc] += in[c * x->sc];
            else for (long c = 0; c < y->c; c++) {
                const float v = in[c * x->sc];
                out[c * y->sc] = v > out[c * y->sc] || v != v ? v : out[c * y->sc];
            }
        }
        if (avg) {
            const float div = pool_divisor(a, oy, ox);
            if (div > 0.0f) /* else a window wholly in the padding: its sum, 0, as onnxruntime gives */
                for (long c = 0; c < y->c; c++) out[c * y->sc] /= div;
        }
        acts_pixel(out, y->c, y->sc, a->act);
    }
}

/* Channels-last: every channel's sum or maximum at once, pixel after pixel, in the output (each
 * channel's values taken in the same order as one at a time: the same bits, in vector loops). */
static int global_pool_unit(float *arena, const tf_global_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    if (x->sc != 1 || y->sc != 1) return 0;
    const int max = a->kind == TF_GLOBAL_MAX;
    for (long n = 0; n < x->n; n++) {
        float *out = arena + y->off + n * y->sn;
        for (long c = 0; c < x->c; c++) out[c] = max ? -INFINITY : 0.0f;
        for (long h = 0; h < x->h; h++)
        for (long w = 0; w < x->w; w++) {
            const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
            if (max) for (long c = 0; c < x->c; c++) out[c] = in[c] > out[c] || in[c] != in[c] ? in[c] : out[c];
            else for (long c = 0; c < x->c; c++) out[c] += in[c];
        }
        if (a->kind == TF_GLOBAL_MEAN) {
            const float count = (float)(x->h * x->w);
            for (long c = 0; c < x->c; c++) out[c] /= count;
        }
        acts_pixel(out, x->c, 1, a->act);
    }
    return 1;
}

static void global_pool(float *arena, const tf_global_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    if (global_pool_unit(arena, a)) return;
    for (long n = 0; n < x->n; n++)
    for (long c = 0; c < x->c; c++) {
        float r = a->kind == TF_GLOBAL_MAX ? -INFINITY : 0.0f;
        for (long h = 0; h < x->h; h++)
        for (long w = 0; w < x->w; w++) {
            const float v = arena[x->off + n * x->sn + c * x->sc + h * x->sh + w * x->sw];
            r = a->kind == TF_GLOBAL_MAX ? (v > r || v != v ? v : r) : r + v;
        }
        if (a->kind == TF_GLOBAL_MEAN) r /= (float)(x->h * x->w);
        arena[y->off + n * y->sn + c * y->sc] = acts(a->act, r);
    }
}

/* --- dense layers ----------------------------------------------------------------------------- */

/* Whether each sample of v is one block in logical (C, H, W) order (a dimension of 1 has any stride). */
static int contiguous(const tf_view *v) {
    return (v->w == 1 || v->sw == 1) && (v->h == 1 || v->sh == v->w) && (v->c == 1 || v->sc == v->h * v->w);
}

/* 16 partial sums (they vectorise; the order of the additions differs from one accumulator's by
 * rounding only). */
static float dot(const float *a, const float *b, long n) {
    float acc[16] = {0};
    long i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float r = 0.0f;
    for (; i < n; i++) r += a[i] * b[i];
    for (int j = 0; j < 16; j++) r += acc[j];
    return r;
}

/* y = x W^T + b, x flattened per sample in logical (C, H, W) order: one dot product where the
 * sample is contiguous in that order, else a walk of the view. */
static void gemm(float *arena, const float *wts, const tf_gemm_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long outs = y->c * y->h * y->w;
    const int flat = contiguous(x);
    for (long n = 0; n < x->n; n++)
    for (long o = 0; o < outs; o++) {
        const float *w = wts + a->w + o * a->in_features;
        const float *in = arena + x->off + n * x->sn;
        float acc = a->b >= 0 ? wts[a->b + o] : 0.0f;
        if (flat) acc += dot(in, w, a->in_features);
        else {
            long i = 0;
            for (long c = 0; c < x->c; c++)
            for (long h = 0; h < x->h; h++, i += x->w)
            for (long k = 0; k < x->w; k++) acc += in[c * x->sc + h * x->sh + k * x->sw] * w[i + k];
        }
        const long oc = o / (y->h * y->w), oh = o / y->w % y->h, ow = o % y->w;
        arena[y->off + n * y->sn + oc * y->sc + oh * y->sh + ow * y->sw] = acts(a->act, acc);
    }
}

/* y may be x itself (softmax_axis runs in place): every pass reads x[c] before it writes y[c], and
 * the log form writes nothing before its last pass. */
static void softmax(float *arena, const tf_softmax_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < x->n; n++)
    for (long h = 0; h < x->h; h++)
    for (long w = 0; w < x->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw, top = -INFINITY, sum = 0.0f;
        for (long c = 0; c < x->c; c++) top = in[c * x->sc] > top ? in[c * x->sc] : top;
        for (long c = 0; c < x->c; c++) {
            const float e = expf(in[c * x->sc] - top);
            sum += e;
            if (!a->log) out[c * y->sc] = e;
        }
        if (a->log) {
            const float shift = top + logf(sum);
            for (long c = 0; c < x->c; c++) out[c * y->sc] = in[c * x->sc] - shift;
        } else {
            for (long c = 0; c < x->c; c++) out[c * y->sc] /= sum;
        }
    }
}

/* Over C at each pixel: LayerNorm over channels (two passes: mean, then variance). */
static void channel_norm(float *arena, const float *wts, const tf_norm_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < x->n; n++)
    for (long h = 0; h < x->h; h++)
    for (long w = 0; w < x->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw;
        double mean = 0.0, var = 0.0;
        for (long c = 0; c < x->c; c++) mean += in[c * x->sc];
        mean /= (double)x->c;
        for (long c = 0; c < x->c; c++) var += (in[c * x->sc] - mean) * (in[c * x->sc] - mean);
        const float inv = (float)(1.0 / sqrt(var / (double)x->c + a->eps)), m = (float)mean;
        for (long c = 0; c < x->c; c++) out[c * y->sc] = (in[c * x->sc] - m) * inv * wts[a->scale + c] + wts[a->bias + c];
        acts_pixel(out, y->c, y->sc, a->act);
    }
}

/* Over H x W of each sample and channel: InstanceNormalization. */
static void instance_norm(float *arena, const float *wts, const tf_norm_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const double count = (double)(x->h * x->w);
    for (long n = 0; n < x->n; n++)
    for (long c = 0; c < x->c; c++) {
        const float *in = arena + x->off + n * x->sn + c * x->sc;
        float *out = arena + y->off + n * y->sn + c * y->sc;
        double mean = 0.0, var = 0.0;
        for (long h = 0; h < x->h; h++)
            for (long w = 0; w < x->w; w++) mean += in[h * x->sh + w * x->sw];
        mean /= count;
        for (long h = 0; h < x->h; h++)
            for (long w = 0; w < x->w; w++) var += (in[h * x->sh + w * x->sw] - mean) * (in[h * x->sh + w * x->sw] - mean);
        const float inv = (float)(1.0 / sqrt(var / count + a->eps)) * wts[a->scale + c], m = (float)mean, b = wts[a->bias + c];
        for (long h = 0; h < x->h; h++)
            for (long w = 0; w < x->w; w++) out[h * y->sh + w * y->sw] = acts(a->act, (in[h * x->sh + w * x->sw] - m) * inv + b);
    }
}

/* Mean or max over C at each pixel, into the one channel of y. */
static void channel_reduce(float *arena, const tf_global_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < x->n; n++)
    for (long h = 0; h < x->h; h++)
    for (long w = 0; w < x->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float r = a->kind == TF_GLOBAL_MAX ? -INFINITY : 0.0f;
        for (long c = 0; c < x->c; c++) {
            const float v = in[c * x->sc];
            r = a->kind == TF_GLOBAL_MAX ? (v > r || v != v ? v : r) : r + v;
        }
        if (a->kind == TF_GLOBAL_MEAN) r /= (float)x->c;
        arena[y->off + n * y->sn + h * y->sh + w * y->sw] = acts(a->act, r);
    }
}

/* --- elementwise ------------------------------------------------------------------------------ */

/* An operand's base and strides over (N, C, H, W), a dimension of size 1 broadcast (stride 0). */
typedef struct { const float *p; long sn, sc, sh, sw; } strided;

static strided operand(const float *arena, const float *wts, const tf_operand *o) {
    strided r;
    if (o->is_const) {
        r.p = wts + o->w + (o->h == 1 ? 0 : o->h0) * o->w_ + (o->w_ == 1 ? 0 : o->w0);
        r.sn = 0;
        r.sc = o->c == 1 ? 0 : o->h * o->w_;
        r.sh = o->h == 1 ? 0 : o->w_;
        r.sw = o->w_ == 1 ? 0 : 1;
        return r;
    }
    const tf_view *v = &o->v;
    r.p = arena + v->off;
    r.sn = v->n == 1 ? 0 : v->sn;
    r.sc = v->c == 1 ? 0 : v->sc;
    r.sh = v->h == 1 ? 0 : v->sh;
    r.sw = v->w == 1 ? 0 : v->sw;
    return r;
}

/* r f v for operand i >= 1 of a fold (tf_kernels.h's TF_ELT_*); MIN and MAX pass NaN on. */
static float combine(int fn, int i, float r, float v) {
    switch (fn) {
    case TF_ELT_PRODUCT: return r * v;
    case TF_ELT_SUB: return r - v;
    case TF_ELT_DIV: return r / v;
    case TF_ELT_POW: return powf(r, v);
    case TF_ELT_MIN: return v < r || v != v ? v : r;
    case TF_ELT_MAX: return v > r || v != v ? v : r;
    case TF_ELT_PRELU: return r < 0.0f ? r * v : r;
    case TF_ELT_CLIP: return i == 1 ? (v > r ? v : r) : (v < r ? v : r);
    default: return r + v;
    }
}

/* out = p0 f p1 over c contiguous values in one vector loop (a residual sum, a squeeze-and-excite
 * scale: efficientnet_b0's products took 25% of its run element by element); 0 where f has none. */
static int pair_unit(int fn, float *out, const float *p0, const float *p1, long c) {
    switch (fn) {
    case TF_ELT_SUM: for (long k = 0; k < c; k++) out[k] = p0[k] + p1[k]; return 1;
    case TF_ELT_PRODUCT: for (long k = 0; k < c; k++) out[k] = p0[k] * p1[k]; return 1;
    case TF_ELT_SUB: for (long k = 0; k < c; k++) out[k] = p0[k] - p1[k]; return 1;
    case TF_ELT_DIV: for (long k = 0; k < c; k++) out[k] = p0[k] / p1[k]; return 1;
    default: return 0;
    }
}

/* y = acts(op0 f op1 f ...); y may be an operand exactly (in place): each element is read from
 * every operand before it is written. */
static void eltwise(float *arena, const float *wts, const tf_eltwise_args *a) {
    const tf_view *y = &a->y;
    strided ops[TF_MAX_OPERANDS];
    for (int i = 0; i < a->count; i++) ops[i] = operand(arena, wts, &a->op[i]);
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const float *p[TF_MAX_OPERANDS];
        for (int i = 0; i < a->count; i++) p[i] = ops[i].p + n * ops[i].sn + h * ops[i].sh + w * ops[i].sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw;
        if (!(a->count == 2 && ops[0].sc == 1 && ops[1].sc == 1 && y->sc == 1 && pair_unit(a->fn, out, p[0], p[1], y->c))) {
            for (long c = 0; c < y->c; c++) {
                float r = p[0][c * ops[0].sc];
                for (int i = 1; i < a->count; i++) r = combine(a->fn, i, r, p[i][c * ops[i].sc]);
                out[c * y->sc] = r;
            }
        }
        acts_pixel(out, y->c, y->sc, a->act);
    }
}

#if TF_SIMD
/* Batch norm (or a bare activation, scale < 0) on channels-last views with a clamp fused. */
static int v_affine(float *arena, const float *wts, const tf_affine_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    float lo, hi;
    if (!unit_channels(x, y) || !one_clamp(a->act, &lo, &hi)) return 0;
    const v16 vlo = splat(lo), vhi = splat(hi);
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw;
        for (long k0 = 0; k0 < y->c; k0 += 16) {
            const long m = y->c - k0 < 16 ? y->c - k0 : 16;
            v16 v = load(in + k0, m);
            if (a->scale >= 0) v = v * load(wts + a->scale + k0, m) + load(wts + a->shift + k0, m);
            store(out + k0, clamp16(v, vlo, vhi), m);
        }
    }
    return 1;
}
#endif

static void affine(float *arena, const float *wts, const tf_affine_args *a) {
#if TF_SIMD
    if (v_affine(arena, wts, a)) return;
#endif
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++)
    for (long c = 0; c < y->c; c++) {
        float v = arena[x->off + n * x->sn + c * x->sc + h * x->sh + w * x->sw];
        if (a->scale >= 0) v = v * wts[a->scale + c] + wts[a->shift + c];
        arena[y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw] = acts(a->act, v);
    }
}

/* ONNX LRN: x / (bias + alpha / size * sum of squares over channels [c - (size-1)/2, c + size/2]). */
static void lrn(float *arena, const tf_lrn_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long before = (a->size - 1) / 2, after = a->size / 2;
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw;
        for (long c = 0; c < y->c; c++) {
            float sum = 0.0f;
            for (long j = c - before; j <= c + after; j++)
                if (j >= 0 && j < x->c) sum += in[j * x->sc] * in[j * x->sc];
            out[c * y->sc] = in[c * x->sc] / powf(a->bias + a->alpha / (float)a->size * sum, a->beta);
        }
    }
}

/* --- data movement ---------------------------------------------------------------------------- */

static int same_shape(const tf_view *x, const tf_view *y) {
    return x->n == y->n && x->c == y->c && x->h == y->h && x->w == y->w;
}

/* y = x for same-shaped views of `item`-byte elements (4: floats, 1: int8; a view's offsets and
 * strides count its elements), in the order of y's addresses: downwards when y lies above x in
 * one buffer (the same strides: y is x moved), so every element is read before it is overwritten.
 * Inline, so that each caller's constant `item` makes its own copy loops. */
static inline void copy_items(float *arena, const tf_view *x, const tf_view *y, const size_t item) {
    char *base = (char *)arena;
    const long dims[4] = {y->n, y->c, y->h, y->w};
    const long xs[4] = {x->sn, x->sc, x->sh, x->sw}, ys[4] = {y->sn, y->sc, y->sh, y->sw};
    int order[4] = {0, 1, 2, 3};
    for (int i = 0; i < 4; i++) /* outermost first: the largest output stride */
        for (int j = i + 1; j < 4; j++)
            if (ys[order[j]] > ys[order[i]]) { const int t = order[i]; order[i] = order[j]; order[j] = t; }
    const int down = y->off > x->off;
    const long d0 = dims[order[0]], d1 = dims[order[1]], d2 = dims[order[2]], d3 = dims[order[3]];
    const long sx = xs[order[3]], sy = ys[order[3]];
    const int run = sx == 1 && sy == 1;
    for (long i0 = 0; i0 < d0; i0++)
    for (long i1 = 0; i1 < d1; i1++)
    for (long i2 = 0; i2 < d2; i2++) {
        const long j0 = down ? d0 - 1 - i0 : i0, j1 = down ? d1 - 1 - i1 : i1, j2 = down ? d2 - 1 - i2 : i2;
        const char *src = base + (size_t)(x->off + j0 * xs[order[0]] + j1 * xs[order[1]] + j2 * xs[order[2]]) * item;
        char *dst = base + (size_t)(y->off + j0 * ys[order[0]] + j1 * ys[order[1]] + j2 * ys[order[2]]) * item;
        if (run) memmove(dst, src, (size_t)d3 * item);
        else if (down) for (long k = d3 - 1; k >= 0; k--) memcpy(dst + k * sy * (long)item, src + k * sx * (long)item, item);
        else for (long k = 0; k < d3; k++) memcpy(dst + k * sy * (long)item, src + k * sx * (long)item, item);
    }
}

static void copy_same(float *arena, const tf_view *x, const tf_view *y) { copy_items(arena, x, y, sizeof(float)); }

static float *at(float *arena, const tf_view *v, long i) {
    const long w = i % v->w, h = i / v->w % v->h, c = i / (v->w * v->h) % v->c, n = i / (v->w * v->h * v->c);
    return arena + v->off + n * v->sn + c * v->sc + h * v->sh + w * v->sw;
}

static void copy(float *arena, const tf_copy_args *a) {
    if (same_shape(&a->x, &a->y)) {
        copy_same(arena, &a->x, &a->y);
        return;
    }
    const long count = a->y.n * a->y.c * a->y.h * a->y.w; /* a reshape: the same elements in logical order */
    for (long i = 0; i < count; i++) *at(arena, &a->y, i) = *at(arena, &a->x, i);
}

static void concat(float *arena, const tf_concat_args *a) {
    long c0 = 0;
    for (int i = 0; i < a->count; i++) {
        tf_view y = a->y;
        y.off += c0 * y.sc;
        y.c = a->x[i].c;
        copy_same(arena, &a->x[i], &y);
        c0 += y.c;
    }
    acts_view(arena, &a->y, a->act);
}

/* y's channel k * groups + i is x's channel i * (c / groups) + k (ShuffleNet's reshape, transpose,
 * reshape), pixel by pixel. */
static void shuffle(float *arena, const tf_shuffle_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long g = a->groups, per = y->c / g;
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + w * x->sw;
        float *out = arena + y->off + n * y->sn + h * y->sh + w * y->sw;
        for (long i = 0; i < g; i++)
            for (long k = 0; k < per; k++) out[(k * g + i) * y->sc] = in[(i * per + k) * x->sc];
    }
}

static long pad_index(int mode, long i, long size) {
    if (mode == TF_PAD_EDGE) return i < 0 ? 0 : (i >= size ? size - 1 : i);
    if (mode == TF_PAD_REFLECT) return i < 0 ? -i : (i >= size ? 2 * size - 2 - i : i);
    return i;
}

static void pad(float *arena, const tf_pad_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const long gy = a->oy0 + oy - a->t, gx = a->ox0 + ox - a->l;
        const int outside = gy < 0 || gy >= a->in_h || gx < 0 || gx >= a->in_w;
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        if (outside && a->mode == TF_PAD_CONSTANT) {
            for (long c = 0; c < y->c; c++) out[c * y->sc] = a->value;
            continue;
        }
        const long iy = pad_index(a->mode, gy, a->in_h) - a->iy0, ix = pad_index(a->mode, gx, a->in_w) - a->ix0;
        const float *in = arena + x->off + n * x->sn + iy * x->sh + ix * x->sw;
        for (long c = 0; c < y->c; c++) out[c * y->sc] = in[c * x->sc];
    }
}

static void resize(float *arena, const int32_t *idx, const tf_resize_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const float *in = arena + x->off + n * x->sn + idx[a->rows + oy] * x->sh + idx[a->cols + ox] * x->sw;
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long c = 0; c < y->c; c++) out[c * y->sc] = in[c * x->sc];
    }
}

static void moves(float *arena, const tf_moves_args *a) {
    for (int i = 0; i < a->count; i++) copy_same(arena, &a->x[i], &a->to[i]);
    acts_view(arena, &a->y, a->act);
}

/* The place in x (whose first place is input place i0, `size` places) that tap k of padded output
 * place q reads, or -1 where (q - k * d) / s is not a whole input place inside x. */
static long deconv_place(long q, long k, long s, long d, long i0, long size) {
    const long t = q - k * d;
    if (t < 0 || t % s) return -1;
    return t / s - i0 >= 0 && t / s - i0 < size ? t / s - i0 : -1;
}

static void deconv(float *arena, const float *wts, const tf_deconv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long cig = x->c / a->groups, cog = y->c / a->groups;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long g = 0; g < a->groups; g++) {
            const float *w = wts + a->w + g * a->kh * a->kw * cig * cog, *b = wts + a->b + g * cog;
            float *o = out + g * cog * y->sc;
            for (long k = 0; k < cog; k++) o[k * y->sc] = b[k];
            for (long ky = 0; ky < a->kh; ky++) {
                const long iy = deconv_place(a->oy0 + oy, ky, a->sh, a->dh, a->iy0, x->h);
                if (iy < 0) continue;
                for (long kx = 0; kx < a->kw; kx++) {
                    const long ix = deconv_place(a->ox0 + ox, kx, a->sw, a->dw, a->ix0, x->w);
                    if (ix < 0) continue;
                    const float *in = arena + x->off + n * x->sn + iy * x->sh + ix * x->sw + g * cig * x->sc;
                    const float *wr = w + (ky * a->kw + kx) * cig * cog;
                    for (long ci = 0; ci < cig; ci++) {
                        const float xv = in[ci * x->sc];
                        for (long k = 0; k < cog; k++) o[k * y->sc] += xv * wr[ci * cog + k];
                    }
                }
            }
        }
        acts_pixel(out, y->c, y->sc, a->act);
    }
}

static void interp(float *arena, const float *wts, const int32_t *idx, const tf_interp_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long T = a->taps;
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        float *out = arena + y->off + n * y->sn + oy * y->sh + ox * y->sw;
        for (long c = 0; c < y->c; c++) {
            float sum = 0.0f;
            for (long i = 0; i < T; i++) {
                const float *row = arena + x->off + n * x->sn + c * x->sc + idx[a->rows + oy * T + i] * x->sh;
                float along = 0.0f;
                for (long j = 0; j < T; j++) along += wts[a->col_w + ox * T + j] * row[idx[a->cols + ox * T + j] * x->sw];
                sum += wts[a->row_w + oy * T + i] * along;
            }
            out[c * y->sc] = sum;
        }
    }
}

/* --- attention blocks (issue 38): products of two activations, reductions over any axes ------- */

/* y[n][c] = a[n][c] b[n][c] for each (n, c) of y: the h x w matrices of the views. The inner loop
 * runs along a row of y and b (unit stride in contiguous tensors) for each term k of the sum. */
static void matmul(float *arena, const tf_matmul_args *p) {
    const tf_view *a = &p->a, *b = &p->b, *y = &p->y;
    const long m = y->h, cols = y->w, inner = a->w;
    for (long n = 0; n < y->n; n++)
    for (long c = 0; c < y->c; c++) {
        const float *pa = arena + a->off + n * a->sn + c * a->sc, *pb = arena + b->off + n * b->sn + c * b->sc;
        float *py = arena + y->off + n * y->sn + c * y->sc;
        for (long i = 0; i < m; i++) {
            float *row = py + i * y->sh;
            for (long j = 0; j < cols; j++) row[j * y->sw] = 0.0f;
            for (long k = 0; k < inner; k++) {
                const float v = pa[i * a->sh + k * a->sw];
                const float *brow = pb + k * b->sh;
                for (long j = 0; j < cols; j++) row[j * y->sw] += v * brow[j * b->sw];
            }
            acts_pixel(row, cols, y->sw, p->act);
        }
    }
}

/* A Linear over W at every (n, c, h): one dot product per output where x's rows are unit-stride. */
static void linear(float *arena, const float *wts, const tf_linear_args *p) {
    const tf_view *x = &p->x, *y = &p->y;
    for (long n = 0; n < y->n; n++)
    for (long c = 0; c < y->c; c++)
    for (long h = 0; h < y->h; h++) {
        const float *in = arena + x->off + n * x->sn + c * x->sc + h * x->sh;
        float *out = arena + y->off + n * y->sn + c * y->sc + h * y->sh;
        for (long o = 0; o < y->w; o++) {
            const float *w = wts + p->w + o * x->w;
            float acc = p->b >= 0 ? wts[p->b + o] : 0.0f;
            if (x->sw == 1) acc += dot(in, w, x->w);
            else for (long k = 0; k < x->w; k++) acc += in[k * x->sw] * w[k];
            out[o * y->sw] = acc;
        }
        acts_pixel(out, y->w, y->sw, p->act);
    }
}

/* One value of y from the block of x its place selects: the dims where y has 1 and x more whole. */
static float reduce_block(const float *in, const long *d, const long *s, int kind) {
    double r = kind == TF_REDUCE_MAX ? -INFINITY : 0.0;
    for (long i0 = 0; i0 < d[0]; i0++)
    for (long i1 = 0; i1 < d[1]; i1++)
    for (long i2 = 0; i2 < d[2]; i2++)
    for (long i3 = 0; i3 < d[3]; i3++) {
        const double v = in[i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3]];
        if (kind == TF_REDUCE_MAX) r = v > r || v != v ? v : r;
        else r += kind == TF_REDUCE_L2 ? v * v : v;
    }
    if (kind == TF_REDUCE_MEAN) r /= (double)(d[0] * d[1] * d[2] * d[3]);
    if (kind == TF_REDUCE_L2) r = sqrt(r);
    return (float)r;
}

static void reduce(float *arena, const tf_reduce_args *p) {
    const tf_view *x = &p->x, *y = &p->y;
    const long xd[4] = {x->n, x->c, x->h, x->w}, yd[4] = {y->n, y->c, y->h, y->w};
    const long xs[4] = {x->sn, x->sc, x->sh, x->sw};
    long d[4], step[4]; /* the reduced block's dims, and x's stride per place of y (0 where reduced) */
    for (int k = 0; k < 4; k++) {
        const int whole = yd[k] == 1 && xd[k] > 1;
        d[k] = whole ? xd[k] : 1;
        step[k] = whole ? 0 : xs[k];
    }
    for (long n = 0; n < y->n; n++)
    for (long c = 0; c < y->c; c++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const float *in = arena + x->off + n * step[0] + c * step[1] + h * step[2] + w * step[3];
        arena[y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw] = acts(p->act, reduce_block(in, d, xs, p->kind));
    }
}

/* --- int8 (quantized layers, issue 40) ------------------------------------------------------------
 * Views of int8 tensors count bytes from the arena's start. Requantization is onnxruntime's CPU
 * (MLAS) one: an int32 accumulator times a float multiplier, clamped to the output range less its
 * zero point, rounded half to even (nearbyintf in the default rounding mode), plus the zero point.
 * Where onnxruntime runs a layer as DequantizeLinear -> float op -> QuantizeLinear (an Add, an
 * AveragePool), the kernel does the same float arithmetic in the same order: each product is
 * stored through a volatile so that no build (-ffp-contract=fast) fuses it into a multiply-add. */

static int8_t *q8(float *arena, long off) { return (int8_t *)arena + off; }

/* The first and one past the last element a view spans (strides are not negative). */
static void view_span(const tf_view *v, long *lo, long *hi) {
    *lo = v->off;
    *hi = v->off + (v->n - 1) * v->sn + (v->c - 1) * v->sc + (v->h - 1) * v->sh + (v->w - 1) * v->sw + 1;
}

/* Whether a step's output shares bytes with its input (in place, or overlaid at an offset: its
 * rows' order is what makes that safe, ops/walks.py, so one thread runs it and
 * its kernel keeps that order). */
static int overlapping(const tf_view *x, const tf_view *y) {
    long xl, xh, yl, yh;
    view_span(x, &xl, &xh);
    view_span(y, &yl, &yh);
    return xl < yh && yl < xh;
}


static int32_t word_i32(const float *wts, long i) { /* an int32 stored in the weights' 4-byte words */
    int32_t v;
    memcpy(&v, wts + i, sizeof v);
    return v;
}

/* v rounded half to even, for |v| <= 2^22: adding and taking off 1.5 * 2^23 leaves the float's
 * integer part rounded in the default rounding mode, as nearbyintf does, in plain arithmetic that a
 * compiler vectorizes (nearbyintf is a call per element). Callers clamp v first. */
static inline float round_even(float v) { return (v + 12582912.0f) - 12582912.0f; }

/* round_even(v) + z, saturated to [lo, hi] (MLAS: clamped before rounding, to the range less z). */
static inline int8_t requant(float v, int z, int lo, int hi) {
    const float a = (float)(lo - z), b = (float)(hi - z);
    v = v < a ? a : (v > b ? b : v);
    return (int8_t)((int)round_even(v) + z);
}

/* QuantizeLinear: x / s rounded half to even, plus z, saturated (beyond +-512 it saturates whatever
 * the rounding, so x / s is clamped there first). */
static inline int8_t quantize1(float x, float s, int z) {
    float q = x / s;
    q = q < -512.0f ? -512.0f : (q > 512.0f ? 512.0f : q);
    const float v = round_even(q) + (float)z;
    return (int8_t)(v < -128.0f ? -128 : (v > 127.0f ? 127 : (int)v));
}

static float dequantize1(int q, float s, int z) { return (float)(q - z) * s; }

/* TFLite's fixed-point arithmetic, as its reference kernels and TFLite Micro build it (gemmlowp's
 * SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT: two roundings, not one). */
static int32_t tfl_high_mul(int32_t a, int32_t b) {
    if (a == b && a == INT32_MIN) return INT32_MAX;
    const int64_t ab = (int64_t)a * (int64_t)b;
    const int64_t nudge = ab >= 0 ? ((int64_t)1 << 30) : 1 - ((int64_t)1 << 30);
    return (int32_t)((ab + nudge) / ((int64_t)1 << 31)); /* C's division truncates, as C++'s */
}

static int32_t tfl_div_pot(int32_t x, int e) {
    const int32_t mask = (int32_t)(((int64_t)1 << e) - 1), rem = x & mask, threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return (x >> e) + (rem > threshold ? 1 : 0);
}

/* MultiplyByQuantizedMultiplier: x * m * 2^shift, m a Q31 fraction in [0.5, 1). */
static int32_t tfl_scale(int32_t x, int32_t m, int shift) {
    const int left = shift > 0 ? shift : 0, right = shift > 0 ? 0 : -shift;
    return tfl_div_pot(tfl_high_mul((int32_t)((int64_t)x * ((int64_t)1 << left)), m), right);
}

/* The multipliers of channel c of a layer whose multiplier words start at m: a float per channel
 * (onnxruntime), or TFLite's multiplier and shift words per channel. */
static const float *qmul(const float *wts, long m, long c, int round) {
    return wts + m + (round == TF_ROUND_TFLITE ? 2 * c : c);
}

/* An int32 accumulator of channel c to int8 as the step's runtime rounds it (m: qmul's words of
 * channel 0). */
static int8_t requant_acc(int32_t acc, const float *m, long c, int round, int z, int lo, int hi) {
    if (round == TF_ROUND_TFLITE) {
        const int32_t v = tfl_scale(acc, word_i32(m, 2 * c), word_i32(m, 2 * c + 1)) + z;
        return (int8_t)(v < lo ? lo : (v > hi ? hi : v));
    }
    return requant((float)acc * m[c], z, lo, hi);
}

/* int8 convolution as onnxruntime's QLinearConv computes it: acc = bias + sum (x - xz) * w in int32
 * (taps in the padding read the zero point, so they add nothing), y = requant(acc * m[co]).
 * Three loops over the same arithmetic, by the weight layout the binder packed (step_args._qconv):
 *  - dense (groups 1): an int8 GEMM. Weights (K4 / 4, C_out, 4): K = kh * kw * C_in in the order of a
 *    channels-last patch (tap, then channel), padded with zeros to K4, a multiple of 4, each group of 4
 *    inputs beside each other per output channel (the operand layout of AVX-512 VNNI's vpdpbusd and
 *    NEON's sdot); then C_out int32 sums of each channel's weights. acc = bias - xz * wsum + sum x * w
 *    over every tap, the padding's taps reading xz: the same int32 as the exact sum above.
 *  - depthwise (groups = C_in = C_out): weights (kh * kw, C), channels innermost, as channels-last
 *    input is; padding taps skipped.
 *  - grouped: weights (C_out, kh, kw, C_in / groups), one output channel at a time. */

#if TF_SIMD
#define TF_QPIX 12   /* output pixels of one GEMM block (rows of the patch matrix; VNNI's tiles split it) */
#else
#define TF_QPIX 4
#endif
#if TF_SIMD || TF_THREADS
#define TF_QCO 64    /* output channels of one GEMM block (4 vector panels of 16) */
#define TF_QK 4608   /* patch bytes gathered at a time (a multiple of 4: a 3 x 3 window of 512 channels) */
#else                /* a microcontroller's build (no threads, no vectors): its stack holds the */
#define TF_QCO 16    /* blocks' arrays in under 1 KiB */
#define TF_QK 128
#endif

static long round4(long k) { return (k + 3) / 4 * 4; }

#if TF_SIMD && defined(__AVX512F__)
#include <immintrin.h>
#endif

#if TF_SIMD && defined(__AVX512F__)
/* requant's arithmetic on 16 channels (k: those that exist) of a channel run: the sum plus base, its
 * float product by m, clamped, rounded half to even (vcvtps2dq in the default rounding mode, as
 * nearbyintf), plus the zero point. */
static inline __attribute__((always_inline)) void qstore16(int8_t *out, __m512i sum, const int32_t *base, const float *m,
                                                           __mmask16 k, int yz, int lo, int hi) {
    const __m512 a = _mm512_set1_ps((float)(lo - yz)), b = _mm512_set1_ps((float)(hi - yz));
    sum = _mm512_add_epi32(sum, _mm512_maskz_loadu_epi32(k, base));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_maskz_loadu_ps(k, m));
    v = _mm512_min_ps(_mm512_max_ps(v, a), b);
    _mm512_mask_cvtepi32_storeu_epi8(out, k, _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(yz)));
}
#endif

/* requant_acc of a block of channels, stored with stride sc (bias and the zero-point sums in base; m:
 * qmul's words of the block's first channel). */
static void qstore(int8_t *out, long sc, const int32_t *acc, const int32_t *base, const float *m, long count,
                   int round, int yz, int lo, int hi) {
    if (round == TF_ROUND_TFLITE) {
        for (long c = 0; c < count; c++) out[c * sc] = requant_acc(acc[c] + base[c], m, c, round, yz, lo, hi);
        return;
    }
#if TF_SIMD && defined(__AVX512F__)
    if (sc == 1) {
        for (long c = 0; c < count; c += 16) {
            const __mmask16 k = count - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (count - c)) - 1);
            qstore16(out + c, _mm512_maskz_loadu_epi32(k, acc + c), base + c, m + c, k, yz, lo, hi);
        }
        return;
    }
#endif
    if (sc == 1) /* channels-last: one contiguous run the compiler vectorizes */
        for (long c = 0; c < count; c++) out[c] = requant((float)(acc[c] + base[c]) * m[c], yz, lo, hi);
    else for (long c = 0; c < count; c++) out[c * sc] = requant((float)(acc[c] + base[c]) * m[c], yz, lo, hi);
}

/* bytes [k0, k1) of output pixel (oy, ox)'s channels-last patch (tap-major), the padding's taps xz;
 * the run up to a multiple of 4 past K is zero (its weights are). */
static void gather_patch(int8_t *dst, float *arena, const tf_qconv_args *a, long n, long oy, long ox, long k0,
                         long k1, long K) {
    const tf_view *x = &a->x;
    const long cin = x->c;
    const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
    if (k0 == 0 && k1 >= K && x->sc == 1 && x->sw == cin && a->dw == 1 && t.ky0 == 0 && t.ky1 == a->kh && t.kx0 == 0
        && t.kx1 == a->kw) { /* a whole window, channels-last: each of its rows is one run of kw * cin bytes */
        const long run = a->kw * cin;
        for (long ky = 0; ky < a->kh; ky++)
            memcpy(dst + ky * run, q8(arena, x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + t.ix * x->sw), (size_t)run);
        memset(dst + K, 0, (size_t)(k1 - K));
        return;
    }
    long tap = k0 / cin, ci = k0 % cin, k = k0;
    while (k < k1 && k < K) {
        const long run = cin - ci < (k1 < K ? k1 : K) - k ? cin - ci : (k1 < K ? k1 : K) - k;
        const long ky = tap / a->kw, kx = tap % a->kw;
        if (ky >= t.ky0 && ky < t.ky1 && kx >= t.kx0 && kx < t.kx1) {
            const int8_t *in = q8(arena, x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw);
            if (x->sc == 1) memcpy(dst, in + ci, (size_t)run);
            else for (long i = 0; i < run; i++) dst[i] = in[(ci + i) * x->sc];
        } else memset(dst, a->xz, (size_t)run);
        dst += run;
        k += run;
        ci = 0;
        tap++;
    }
    if (k < k1) memset(dst, 0, (size_t)(k1 - k));
}

static inline int32_t qword(const int8_t *p) { /* 4 bytes as one int32 (one load) */
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static int32_t load4(const int8_t *p, long left) { /* 4 patch bytes; fewer at the patch's end, zeros after */
    if (left >= 4) return qword(p);
    uint32_t v = 0; /* byte by byte, little-endian as qword: no call (a call in the loop spills its sums) */
    for (long i = 0; i < left; i++) v |= (uint32_t)(uint8_t)p[i] << (8 * i);
    return (int32_t)v;
}

#if TF_SIMD && defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* vpdpbusd multiplies unsigned by signed bytes: x + 128 (x ^ 0x80) times w, so the sum holds 128 *
 * wsum more, taken off with the zero point. */
#define TF_QOFF 128
/* Where the tile's sums go: requantized (as qstore) straight from the registers into each pixel's
 * channel run (channels-last output), or (out NULL) added into acc. */
typedef struct { int8_t *out[TF_QPIX]; const int32_t *base; const float *m; int yz, lo, hi; long np; } qsink;

static inline __attribute__((always_inline)) __mmask16 qmask(long left) {
    return left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

static inline __attribute__((always_inline)) __m512i qx_word(const int8_t *row, long g, long nk) {
    (void)nk;
    return _mm512_set1_epi32(qword(row + 4 * g));
}

static inline __attribute__((always_inline)) __m512i qx_tail(const int8_t *row, long g, long nk) {
    return _mm512_set1_epi32(load4(row + 4 * g, nk - 4 * g));
}

/* The accumulators are named variables, not an array: compilers keep an array of vectors this
 * large in memory (a store and a reload around every vpdpbusd). Pixels past np and panels past nj
 * are compiled out (np, nj: constants in every caller). */
#define QP(p) __m512i c##p##0 = z, c##p##1 = z, c##p##2 = z, c##p##3 = z;
#define QD(p, j) if (nj > j) c##p##j = _mm512_dpbusd_epi32(c##p##j, xb, w##j);
#define QROW(p, LOAD) if (np > p) { const __m512i xb = _mm512_xor_si512(LOAD(rows[p], g, nk), flip); \
                                    QD(p, 0) QD(p, 1) QD(p, 2) QD(p, 3) }
#define QGROUP(LOAD) { const int8_t *wg = wp + (g * cout + co0) * 4; \
    const __m512i w0 = _mm512_maskz_loadu_epi32(mk[0], wg), w1 = nj > 1 ? _mm512_maskz_loadu_epi32(mk[1], wg + 64) : z; \
    const __m512i w2 = nj > 2 ? _mm512_maskz_loadu_epi32(mk[2], wg + 128) : z; \
    const __m512i w3 = nj > 3 ? _mm512_maskz_loadu_epi32(mk[3], wg + 192) : z; \
    QROW(0, LOAD) QROW(1, LOAD) QROW(2, LOAD) QROW(3, LOAD) QROW(4, LOAD) QROW(5, LOAD) \
    QROW(6, LOAD) QROW(7, LOAD) QROW(8, LOAD) QROW(9, LOAD) QROW(10, LOAD) QROW(11, LOAD) }
#define QBASE(p) if (np > p) { c##p##0 = b0; c##p##1 = b1; c##p##2 = b2; c##p##3 = b3; }
#define QOUT1(p, j) if (nj > j) qsink_store(o, p, j, c##p##j, mk[j], m##j, lo, hi, yz);
#define QOUT(p) if (np > p && o->np > p) { QOUT1(p, 0) QOUT1(p, 1) QOUT1(p, 2) QOUT1(p, 3) }
#define QADD1(p, j) if (nj > j) qacc_add(acc[p] + 16 * j, c##p##j);
#define QADD(p) if (np > p) { QADD1(p, 0) QADD1(p, 1) QADD1(p, 2) QADD1(p, 3) }

/* qstore16's arithmetic on a sum that holds base already */
static inline __attribute__((always_inline)) void qsink_store(const qsink *o, int p, int j, __m512i sum, __mmask16 k,
                                                              __m512 m, __m512 lo, __m512 hi, __m512i yz) {
    const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), m), lo), hi);
    _mm512_mask_cvtepi32_storeu_epi8(o->out[p] + 16 * j, k, _mm512_add_epi32(_mm512_cvtps_epi32(v), yz));
}

static inline __attribute__((always_inline)) void qacc_add(int32_t *acc, __m512i sum) {
    _mm512_storeu_si512((void *)acc, _mm512_add_epi32(_mm512_loadu_si512((const void *)acc), sum));
}

/* np pixels (rows) x nj panels of 16 output channels over the whole of K: each group of 4 weights
 * of the nj panels is loaded once for the np pixels. The sums start from base (o) or zero (added
 * into acc). */
static inline __attribute__((always_inline)) void qtile(const int8_t *const *rows, long nk, const int8_t *wp, long cout,
                                                        long co0, long nco, int32_t (*acc)[TF_QCO], const qsink *o,
                                                        const int np, const int nj) {
    const __m512i z = _mm512_setzero_si512(), flip = _mm512_set1_epi32((int)0x80808080u);
    __mmask16 mk[4];
    for (int j = 0; j < 4; j++) mk[j] = qmask(nco - 16 * j);
    QP(0) QP(1) QP(2) QP(3) QP(4) QP(5) QP(6) QP(7) QP(8) QP(9) QP(10) QP(11)
    if (o) {
        const __m512i b0 = _mm512_maskz_loadu_epi32(mk[0], o->base), b1 = _mm512_maskz_loadu_epi32(mk[1], o->base + 16);
        const __m512i b2 = _mm512_maskz_loadu_epi32(mk[2], o->base + 32), b3 = _mm512_maskz_loadu_epi32(mk[3], o->base + 48);
        QBASE(0) QBASE(1) QBASE(2) QBASE(3) QBASE(4) QBASE(5) QBASE(6) QBASE(7) QBASE(8) QBASE(9) QBASE(10) QBASE(11)
    }
    const long full = nk / 4;
    long g = 0;
    for (; g < full; g++) QGROUP(qx_word)
    if (nk % 4) QGROUP(qx_tail) /* the last group's inputs, fewer than 4 (their weights are zero past K) */
    if (!o) {
        QADD(0) QADD(1) QADD(2) QADD(3) QADD(4) QADD(5) QADD(6) QADD(7) QADD(8) QADD(9) QADD(10) QADD(11)
        return;
    }
    const __m512 lo = _mm512_set1_ps((float)(o->lo - o->yz)), hi = _mm512_set1_ps((float)(o->hi - o->yz));
    const __m512i yz = _mm512_set1_epi32(o->yz);
    const __m512 m0 = _mm512_maskz_loadu_ps(mk[0], o->m), m1 = _mm512_maskz_loadu_ps(mk[1], o->m + 16);
    const __m512 m2 = _mm512_maskz_loadu_ps(mk[2], o->m + 32), m3 = _mm512_maskz_loadu_ps(mk[3], o->m + 48);
    QOUT(0) QOUT(1) QOUT(2) QOUT(3) QOUT(4) QOUT(5) QOUT(6) QOUT(7) QOUT(8) QOUT(9) QOUT(10) QOUT(11)
}

/* The tile from pixel p0 of the block on (its sink shifted to match). */
static inline __attribute__((always_inline)) void qtile_at(const int8_t *const *rows, long nk, const int8_t *wp, long cout,
                                                           long co0, long nco, int32_t (*acc)[TF_QCO], const qsink *o,
                                                           int p0, const int np, const int nj) {
    if (!o) {
        qtile(rows + p0, nk, wp, cout, co0, nco, acc + p0, NULL, np, nj);
        return;
    }
    if (p0 >= o->np) return;
    qsink part = *o;
    part.np = o->np - p0;
    for (int p = 0; p < np; p++) part.out[p] = o->out[p0 + p];
    qtile(rows + p0, nk, wp, cout, co0, nco, NULL, &part, np, nj);
}

/* The block's TF_QPIX (12) pixels in tiles of 12 accumulators, by how many panels its channels take
 * (GCC spills a tile of 16 or more to the stack inside the loop: measured half the speed). */
typedef char tf_qpix_is_12[TF_QPIX == 12 ? 1 : -1]; /* the tiles below cover 12 pixels */
static void qgemm_any(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                      int32_t (*acc)[TF_QCO], const qsink *o) {
    switch ((nco + 15) / 16) {
    case 1: qtile_at(rows, nk, wp, cout, co0, nco, acc, o, 0, 12, 1); break;
    case 2: for (int p0 = 0; p0 < 12; p0 += 6) qtile_at(rows, nk, wp, cout, co0, nco, acc, o, p0, 6, 2); break;
    case 3: for (int p0 = 0; p0 < 12; p0 += 4) qtile_at(rows, nk, wp, cout, co0, nco, acc, o, p0, 4, 3); break;
    default: for (int p0 = 0; p0 < 12; p0 += 3) qtile_at(rows, nk, wp, cout, co0, nco, acc, o, p0, 3, 4); break;
    }
}

static void qgemm_block(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                        int32_t acc[TF_QPIX][TF_QCO]) {
    qgemm_any(rows, nk, wp, cout, co0, nco, acc, NULL);
}

#define TF_QSINK 1
static void qgemm_store(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                        const qsink *o) {
    qgemm_any(rows, nk, wp, cout, co0, nco, NULL, o);
}
#elif TF_SIMD && defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define TF_QOFF 0
/* NEON's sdot: 4 signed bytes of x times the 4 weights of each of 4 output channels, summed into
 * their 4 int32 lanes (the packed layout's groups as they are); 2 pixels x 16 channels a pass. */
static inline int8x16_t qw16(const int8_t *p, long left) { /* the 4 weights of 4 channels (left: channels there) */
    if (left >= 4) return vld1q_s8(p);
    int8_t b[16] = {0};
    if (left > 0) memcpy(b, p, (size_t)(4 * left));
    return vld1q_s8(b);
}

static void qgemm_block(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                        int32_t acc[TF_QPIX][TF_QCO]) {
    const long full = nk / 4, groups = (nk + 3) / 4;
    for (int p = 0; p < TF_QPIX; p += 2)
    for (long c = 0; c < nco; c += 16) {
        int32x4_t s[2][4];
        for (int j = 0; j < 4; j++) s[0][j] = s[1][j] = vdupq_n_s32(0);
        for (long g = 0; g < groups; g++) {
            const int32_t v0 = g < full ? qword(rows[p] + 4 * g) : load4(rows[p] + 4 * g, nk - 4 * g);
            const int32_t v1 = g < full ? qword(rows[p + 1] + 4 * g) : load4(rows[p + 1] + 4 * g, nk - 4 * g);
            const int8x16_t x0 = vreinterpretq_s8_s32(vdupq_n_s32(v0)), x1 = vreinterpretq_s8_s32(vdupq_n_s32(v1));
            const int8_t *wg = wp + (g * cout + co0 + c) * 4;
            for (int j = 0; j < 4; j++) {
                const int8x16_t w = qw16(wg + 16 * j, nco - c - 4 * j);
                s[0][j] = vdotq_s32(s[0][j], x0, w);
                s[1][j] = vdotq_s32(s[1][j], x1, w);
            }
        }
        for (int q = 0; q < 2; q++) {
            int32_t sums[16];
            for (int j = 0; j < 4; j++) vst1q_s32(sums + 4 * j, s[q][j]);
            for (long i = 0; i < 16 && c + i < nco; i++) acc[p + q][c + i] += sums[i];
        }
    }
}
#elif TF_SIMD && defined(__AVX2__)
#include <immintrin.h>
#define TF_QOFF 0
/* AVX2 (no VNNI): vpmaddwd on int16-widened bytes. Each group of 4 inputs times the 4 weights of 4
 * output channels gives 8 int32, two per channel (x0 w0 + x1 w1, x2 w2 + x3 w3: each under 2^15, so
 * exact); the pairs are summed at the end. */
static inline __m256i qw16(const int8_t *p, long left) { /* the 4 weights of 4 channels (left: channels there) */
    if (left >= 4) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)p));
    /* a channel's 4 weights are one int32 lane: the lanes there, masked (no call: the sums stay in registers) */
    const __m128i lanes = _mm_cmpgt_epi32(_mm_set1_epi32((int)(left > 0 ? left : 0)), _mm_setr_epi32(0, 1, 2, 3));
    return _mm256_cvtepi8_epi16(_mm_maskload_epi32((const int *)(const void *)p, lanes));
}

static inline __m256i qx16(const int8_t *row, long g, long full, long nk) { /* 4 inputs, widened, 4 times */
    const int32_t v = g < full ? qword(row + 4 * g) : load4(row + 4 * g, nk - 4 * g);
    return _mm256_broadcastq_epi64(_mm_cvtepi8_epi16(_mm_cvtsi32_si128(v)));
}

static void qgemm_block(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                        int32_t acc[TF_QPIX][TF_QCO]) {
    const long full = nk / 4, groups = (nk + 3) / 4;
    for (int p = 0; p < TF_QPIX; p += 2)
    for (long c = 0; c < nco; c += 16) { /* 2 pixels x 16 channels: 8 accumulators */
        __m256i s[2][4];
        for (int j = 0; j < 4; j++) s[0][j] = s[1][j] = _mm256_setzero_si256();
        for (long g = 0; g < groups; g++) {
            const __m256i x0 = qx16(rows[p], g, full, nk), x1 = qx16(rows[p + 1], g, full, nk);
            const int8_t *wg = wp + (g * cout + co0 + c) * 4;
            for (int j = 0; j < 4; j++) {
                const __m256i w = qw16(wg + 16 * j, nco - c - 4 * j);
                s[0][j] = _mm256_add_epi32(s[0][j], _mm256_madd_epi16(x0, w));
                s[1][j] = _mm256_add_epi32(s[1][j], _mm256_madd_epi16(x1, w));
            }
        }
        for (int q = 0; q < 2; q++) {
            int32_t sums[16];
            /* hadd pairs the channels' two halves, lane-wise: (0 1 4 5 | 2 3 6 7); 0xD8 orders them */
            _mm256_storeu_si256((__m256i *)(void *)sums, _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[q][0], s[q][1]), 0xD8));
            _mm256_storeu_si256((__m256i *)(void *)(sums + 8), _mm256_permute4x64_epi64(_mm256_hadd_epi32(s[q][2], s[q][3]), 0xD8));
            for (long i = 0; i < 16 && c + i < nco; i++) acc[p + q][c + i] += sums[i];
        }
    }
}
#else
#define TF_QOFF 0
static void qgemm_block(const int8_t *const *rows, long nk, const int8_t *wp, long cout, long co0, long nco,
                        int32_t acc[TF_QPIX][TF_QCO]) {
    const long groups = (nk + 3) / 4;
    for (long g = 0; g < groups; g++) {
        const int8_t *wg = wp + (g * cout + co0) * 4;
        const long left = nk - 4 * g;
        for (int p = 0; p < TF_QPIX; p++) {
            int8_t xv[4];
            const int32_t word = load4(rows[p] + 4 * g, left);
            memcpy(xv, &word, 4);
            const int32_t x0 = xv[0], x1 = xv[1], x2 = xv[2], x3 = xv[3];
            int32_t *ap = acc[p];
            for (long c = 0; c < nco; c++)
                ap[c] += x0 * wg[4 * c] + x1 * wg[4 * c + 1] + x2 * wg[4 * c + 2] + x3 * wg[4 * c + 3];
        }
    }
}
#endif

/* Output pixels [i0, i0 + np) of sample n, counted row by row over y's rows and columns (a block
 * may span rows), channels [co0, co0 + nco) (base: their bias less the zero point's sums). */
static void qconv_pixels(float *arena, const float *wts, const tf_qconv_args *a, long n, long i0, long np,
                         long co0, long nco, const int32_t *base, int direct) {
    const tf_view *x = &a->x, *y = &a->y;
    const long K = a->kh * a->kw * x->c, K4 = round4(K), cout = y->c;
    const int8_t *wp = (const int8_t *)(wts + a->w);
    int8_t patch[TF_QPIX][TF_QK];
    const int8_t *rows[TF_QPIX];
    int8_t *outs[TF_QPIX];
    int32_t acc[TF_QPIX][TF_QCO];
    for (int p = 0; p < TF_QPIX; p++) { /* a short block repeats its last pixel */
        const long i = i0 + (p < np ? p : np - 1), oy = i / y->w, ox = i % y->w;
        outs[p] = q8(arena, y->off + n * y->sn + oy * y->sh + ox * y->sw + co0 * y->sc);
        if (direct) rows[p] = q8(arena, x->off + n * x->sn + oy * a->sh * x->sh + ox * a->sw * x->sw);
        else if (K4 <= TF_QK) {
            if (p < np) gather_patch(patch[p], arena, a, n, oy, ox, 0, K4, K);
            rows[p] = patch[p < np ? p : np - 1];
        }
    }
#ifdef TF_QSINK
    /* one pass over K: the sums requantized from registers (onnxruntime's rounding: qstore16) */
    if (y->sc == 1 && a->round != TF_ROUND_TFLITE && (direct || K4 <= TF_QK)) {
        qsink o = {{0}, base, wts + a->m + co0, a->yz, a->lo, a->hi, np};
        memcpy(o.out, outs, sizeof outs);
        qgemm_store(rows, direct ? K : K4, wp, cout, co0, nco, &o);
        return;
    }
#endif
    memset(acc, 0, sizeof acc);
    if (direct || K4 <= TF_QK) /* 1x1, no padding, channels-last: each pixel's channels are its patch */
        qgemm_block(rows, direct ? K : K4, wp, cout, co0, nco, acc);
    else for (long k0 = 0; k0 < K4; k0 += TF_QK) {
        const long k1 = K4 - k0 < TF_QK ? K4 : k0 + TF_QK;
        for (int p = 0; p < TF_QPIX; p++) {
            const long i = i0 + (p < np ? p : np - 1);
            if (p < np) gather_patch(patch[p], arena, a, n, i / y->w, i % y->w, k0, k1, K);
            rows[p] = patch[p < np ? p : np - 1];
        }
        qgemm_block(rows, k1 - k0, wp + k0 * cout, cout, co0, nco, acc);
    }
    for (long p = 0; p < np; p++)
        qstore(outs[p], y->sc, acc[p], base, qmul(wts, a->m, co0, a->round), nco, a->round, a->yz, a->lo, a->hi);
}

#define TF_QCHUNK (8 * TF_QPIX) /* output pixels taken through every block of channels at a time */

/* A chunk of output pixels at a time (their inputs stay in cache), in it a block of output channels
 * at a time over all its pixels (the block's weights stay in cache; its bias sums made once). An
 * output over its own input (ops/walks.py: "rows") takes a chunk of one row: a later block of
 * channels reads the row's windows, so no row below it may be written before. */
static void qconv_dense(float *arena, const float *wts, const tf_qconv_args *a) {
    const int direct = a->kh == 1 && a->kw == 1 && a->pt == 0 && a->pl == 0 && a->x.sc == 1;
    const long K4 = round4(a->kh * a->kw * a->x.c), cout = a->y.c, pixels = a->y.h * a->y.w;
    const long chunk = overlapping(&a->x, &a->y) ? a->y.w : TF_QCHUNK;
    const int8_t *wsum = (const int8_t *)(wts + a->w) + K4 * cout;
    int32_t base[TF_QCO];
    for (long n = 0; n < a->y.n; n++)
    for (long c0 = 0; c0 < pixels; c0 += chunk) {
        const long c1 = pixels - c0 < chunk ? pixels : c0 + chunk;
        for (long co0 = 0; co0 < cout; co0 += TF_QCO) {
            const long nco = cout - co0 < TF_QCO ? cout - co0 : TF_QCO;
            memcpy(base, wsum + 4 * co0, (size_t)nco * sizeof(int32_t));
            for (long c = 0; c < nco; c++)
                base[c] = (a->b >= 0 ? word_i32(wts, a->b + co0 + c) : 0) - (a->xz + TF_QOFF) * base[c];
            for (long i = c0; i < c1; i += TF_QPIX)
                qconv_pixels(arena, wts, a, n, i, c1 - i < TF_QPIX ? c1 - i : TF_QPIX, co0, nco, base, direct);
        }
    }
}

#if TF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
/* Channels [c0, c0 + nc) of one channels-last output pixel, nc <= 64: four panels of 16 int32
 * accumulators in registers across the taps (masked past nc), from the biases in acc; requantized
 * and stored to out where y is channels-last, else back to acc. */
static void qdw_avx512(int32_t *acc, int8_t *out, float *arena, const tf_qconv_args *a, const int8_t *w, const float *m,
                       const window *t, long n, long c0, long nc) {
    const tf_view *x = &a->x;
    __m512i s[4];
    __mmask16 k[4];
    const __m512i xz = _mm512_set1_epi32(a->xz);
    for (int j = 0; j < 4; j++) {
        const long left = nc - 16 * j;
        k[j] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
        s[j] = _mm512_maskz_loadu_epi32(k[j], acc + 16 * j); /* acc: the biases (int32 words) */
    }
    const int nj = (int)((nc + 15) / 16);
    for (long ky = t->ky0; ky < t->ky1; ky++)
    for (long kx = t->kx0; kx < t->kx1; kx++) {
        const int8_t *in = q8(arena, x->off + n * x->sn + (t->iy + ky * a->dh) * x->sh + (t->ix + kx * a->dw) * x->sw + c0);
        const int8_t *wr = w + (ky * a->kw + kx) * x->c + c0;
        for (int j = 0; j < nj; j++) {
            const __m512i xv = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k[j], in + 16 * j));
            const __m512i wv = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k[j], wr + 16 * j));
            s[j] = _mm512_add_epi32(s[j], _mm512_mullo_epi32(_mm512_sub_epi32(xv, xz), wv));
        }
    }
    static const int32_t zero[16];
    if (out) {
        for (int j = 0; j < 4 && 16 * j < nc; j++) qstore16(out + 16 * j, s[j], zero, m + c0 + 16 * j, k[j], a->yz, a->lo, a->hi);
        return;
    }
    for (int j = 0; j < 4; j++) _mm512_mask_storeu_epi32(acc + 16 * j, k[j], s[j]);
}
#endif

#if TF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define TF_QDW_TAPS 25 /* the largest window qdw_row widens (5 x 5); larger ones go pixel by pixel */

/* 16 channels' inputs sign-extended to int32: the operand of vpmaddwd against weights stored as
 * int32 (high halves zero), whose lane c then holds x[c] w[c] + (0 or -1) * 0: exact. */
static inline __attribute__((always_inline)) __m512i qdw_x(const int8_t *p, __mmask16 k) {
    return _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, p));
}

static inline __attribute__((always_inline)) __m512i qdw_madd(__m512i s, __m512i x, const int32_t *w) {
#ifdef __AVX512VNNI__
    return _mm512_dpwssd_epi32(s, x, _mm512_loadu_si512((const void *)w));
#else
    return _mm512_add_epi32(s, _mm512_madd_epi16(x, _mm512_loadu_si512((const void *)w)));
#endif
}

/* One output row of channels [c0, c0 + nc) (channels-last x and y, onnxruntime's rounding), nj =
 * its panels of 16 (a constant in each caller: the sums stay in registers): the block's weights as
 * int32 per tap (w32), made once per block; a pixel whose window lies whole inside x sums x * w from
 * base = bias - xz * (sum of the weights), the same int32 as the sum of (x - xz) * w; a pixel at an
 * edge takes qdw_avx512's path (padding taps skipped). */
static inline __attribute__((always_inline)) void qdw_row_nj(float *arena, const tf_qconv_args *a,
                                                             const int32_t (*w32)[TF_QCO], const int32_t *base,
                                                             const int32_t *bias, const int8_t *w, const float *m,
                                                             long n, long oy, long c0, long nc, const int nj) {
    const tf_view *x = &a->x, *y = &a->y;
    const long taps = a->kh * a->kw;
    long off[TF_QDW_TAPS];
    __mmask16 k[4];
    __m512i b[4];
    __m512 mv[4];
    for (int j = 0; j < 4; j++) {
        const long left = nc - 16 * j;
        k[j] = left >= 16 ? (__mmask16)0xFFFF : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
        b[j] = _mm512_maskz_loadu_epi32(k[j], base + 16 * j);
        mv[j] = _mm512_maskz_loadu_ps(k[j], m + c0 + 16 * j);
    }
    const __m512 lo = _mm512_set1_ps((float)(a->lo - a->yz)), hi = _mm512_set1_ps((float)(a->hi - a->yz));
    const __m512i yz = _mm512_set1_epi32(a->yz);
    for (long tap = 0; tap < taps; tap++) off[tap] = tap / a->kw * a->dh * x->sh + tap % a->kw * a->dw * x->sw;
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        int8_t *out = q8(arena, y->off + n * y->sn + oy * y->sh + ox * y->sw + c0);
        if (t.ky0 != 0 || t.kx0 != 0 || t.ky1 != a->kh || t.kx1 != a->kw) {
            qdw_avx512((int32_t *)(void *)bias, out, arena, a, w, m, &t, n, c0, nc);
            continue;
        }
        __m512i s0 = b[0], s1 = b[1], s2 = b[2], s3 = b[3];
        const int8_t *row = q8(arena, x->off + n * x->sn + t.iy * x->sh + t.ix * x->sw + c0);
        for (long tp = 0; tp < taps; tp++) {
            const int8_t *px = row + off[tp];
            s0 = qdw_madd(s0, qdw_x(px, k[0]), w32[tp]);
            if (nj > 1) s1 = qdw_madd(s1, qdw_x(px + 16, k[1]), w32[tp] + 16);
            if (nj > 2) s2 = qdw_madd(s2, qdw_x(px + 32, k[2]), w32[tp] + 32);
            if (nj > 3) s3 = qdw_madd(s3, qdw_x(px + 48, k[3]), w32[tp] + 48);
        }
        const __m512i s[4] = {s0, s1, s2, s3};
        for (int j = 0; j < nj; j++) { /* qstore16's arithmetic (base is in the sums already) */
            const __m512 v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[j]), mv[j]), lo), hi);
            _mm512_mask_cvtepi32_storeu_epi8(out + 16 * j, k[j], _mm512_add_epi32(_mm512_cvtps_epi32(v), yz));
        }
    }
}

static void qdw_row(float *arena, const tf_qconv_args *a, const int32_t (*w32)[TF_QCO], const int32_t *base,
                    const int32_t *bias, const int8_t *w, const float *m, long n, long oy, long c0, long nc) {
    switch ((nc + 15) / 16) {
    case 1: qdw_row_nj(arena, a, w32, base, bias, w, m, n, oy, c0, nc, 1); break;
    case 2: qdw_row_nj(arena, a, w32, base, bias, w, m, n, oy, c0, nc, 2); break;
    case 3: qdw_row_nj(arena, a, w32, base, bias, w, m, n, oy, c0, nc, 3); break;
    default: qdw_row_nj(arena, a, w32, base, bias, w, m, n, oy, c0, nc, 4); break;
    }
}

/* Channels [c0, c0 + nc)'s weights widened (qdw_x's operand, per tap), their biases and base. */
static void qdw_block(const float *wts, const tf_qconv_args *a, long c0, long nc, int32_t (*w32)[TF_QCO],
                      int32_t *base, int32_t *bias) {
    const long C = a->y.c, taps = a->kh * a->kw;
    const int8_t *w = (const int8_t *)(wts + a->w);
    const __m512i xz = _mm512_set1_epi32(a->xz);
    for (int j = 0; 16 * j < nc; j++) {
        const long left = nc - 16 * j;
        const __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
        __m512i sum = _mm512_setzero_si512();
        for (long tp = 0; tp < taps; tp++) {
            const __m512i wv = qdw_x(w + tp * C + c0 + 16 * j, k);
            _mm512_storeu_si512((void *)(w32[tp] + 16 * j), _mm512_and_si512(wv, _mm512_set1_epi32(0xFFFF)));
            sum = _mm512_add_epi32(sum, wv);
        }
        const __m512i b = a->b >= 0 ? _mm512_maskz_loadu_epi32(k, wts + a->b + c0 + 16 * j) : _mm512_setzero_si512();
        _mm512_storeu_si512((void *)(bias + 16 * j), b);
        _mm512_storeu_si512((void *)(base + 16 * j), _mm512_sub_epi32(b, _mm512_mullo_epi32(xz, sum)));
    }
}

/* qdw_row over every row: a block of channels at a time over every row (its weights widened once);
 * an output over its own input (ops/walks.py: "rows") row by row, every block of a row before the
 * next row (the weights widened per row and block). */
static void qdw_rows(float *arena, const float *wts, const tf_qconv_args *a) {
    const long C = a->y.c;
    const int8_t *w = (const int8_t *)(wts + a->w);
    int32_t w32[TF_QDW_TAPS][TF_QCO];
    int32_t base[TF_QCO], bias[TF_QCO];
    if (overlapping(&a->x, &a->y)) {
        for (long n = 0; n < a->y.n; n++)
        for (long oy = 0; oy < a->y.h; oy++)
        for (long c0 = 0; c0 < C; c0 += TF_QCO) {
            const long nc = C - c0 < TF_QCO ? C - c0 : TF_QCO;
            qdw_block(wts, a, c0, nc, w32, base, bias);
            qdw_row(arena, a, (const int32_t (*)[TF_QCO])w32, base, bias, w, wts + a->m, n, oy, c0, nc);
        }
        return;
    }
    for (long c0 = 0; c0 < C; c0 += TF_QCO) {
        const long nc = C - c0 < TF_QCO ? C - c0 : TF_QCO;
        qdw_block(wts, a, c0, nc, w32, base, bias);
        for (long n = 0; n < a->y.n; n++)
        for (long oy = 0; oy < a->y.h; oy++)
            qdw_row(arena, a, (const int32_t (*)[TF_QCO])w32, base, bias, w, wts + a->m, n, oy, c0, nc);
    }
}
#endif

/* Depthwise: channels innermost (contiguous in channels-last views), TF_QCO at a time. */
static void qconv_depthwise(float *arena, const float *wts, const tf_qconv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long C = y->c, xc = x->sc, xz = a->xz;
    const int8_t *w = (const int8_t *)(wts + a->w);
    int32_t acc[TF_QCO] = {0}, zero[TF_QCO] = {0};
#if TF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    if (xc == 1 && y->sc == 1 && a->round != TF_ROUND_TFLITE && a->kh * a->kw <= TF_QDW_TAPS) {
        qdw_rows(arena, wts, a);
        return;
    }
#endif
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        for (long c0 = 0; c0 < C; c0 += TF_QCO) {
            const long nc = C - c0 < TF_QCO ? C - c0 : TF_QCO;
#if TF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
            if (xc == 1 && y->sc == 1 && a->round != TF_ROUND_TFLITE) { /* the biases read in place */
                int32_t *bias = a->b >= 0 ? (int32_t *)(void *)(wts + a->b + c0) : zero;
                qdw_avx512(bias, q8(arena, y->off + n * y->sn + oy * y->sh + ox * y->sw + c0), arena, a, w, wts + a->m, &t, n, c0,
                           nc);
                continue;
            }
#endif
            for (long c = 0; c < nc; c++) acc[c] = a->b >= 0 ? word_i32(wts, a->b + c0 + c) : 0;
#if TF_SIMD && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
            if (xc == 1) qdw_avx512(acc, NULL, arena, a, w, wts + a->m, &t, n, c0, nc);
            else
#endif
            for (long ky = t.ky0; ky < t.ky1; ky++)
            for (long kx = t.kx0; kx < t.kx1; kx++) {
                const int8_t *in = q8(arena, x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw
                                      + c0 * xc);
                const int8_t *wr = w + (ky * a->kw + kx) * C + c0;
                if (xc == 1 && nc == TF_QCO) /* a constant count: whole vectors, no remainder */
                    for (long c = 0; c < TF_QCO; c++) acc[c] += ((int32_t)in[c] - xz) * (int32_t)wr[c];
                else if (xc == 1) for (long c = 0; c < nc; c++) acc[c] += ((int32_t)in[c] - xz) * (int32_t)wr[c];
                else for (long c = 0; c < nc; c++) acc[c] += ((int32_t)in[c * xc] - xz) * (int32_t)wr[c];
            }
            qstore(q8(arena, y->off + n * y->sn + oy * y->sh + ox * y->sw + c0 * y->sc), y->sc, acc, zero,
                   qmul(wts, a->m, c0, a->round), nc, a->round, a->yz, a->lo, a->hi);
        }
    }
}

/* Grouped (neither dense nor depthwise): one output channel at a time. */
static void qconv_grouped(float *arena, const float *wts, const tf_qconv_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long cig = x->c / a->groups, cog = y->c / a->groups, taps = a->kh * a->kw * cig;
    const int8_t *w = (const int8_t *)(wts + a->w);
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        int8_t *out = q8(arena, y->off + n * y->sn + oy * y->sh + ox * y->sw);
        for (long co = 0; co < y->c; co++) {
            const long g = co / cog;
            const int8_t *wc = w + co * taps;
            int32_t acc = a->b >= 0 ? word_i32(wts, a->b + co) : 0;
            for (long ky = t.ky0; ky < t.ky1; ky++)
            for (long kx = t.kx0; kx < t.kx1; kx++) {
                const int8_t *in = q8(arena, x->off + n * x->sn + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw
                                      + g * cig * x->sc);
                const int8_t *wr = wc + (ky * a->kw + kx) * cig;
                for (long ci = 0; ci < cig; ci++) acc += ((int32_t)in[ci * x->sc] - a->xz) * (int32_t)wr[ci];
            }
            out[co * y->sc] = requant_acc(acc, wts + a->m, co, a->round, a->yz, a->lo, a->hi);
        }
    }
}

static void qconv(float *arena, const float *wts, const tf_qconv_args *a) {
    if (a->groups == 1) qconv_dense(arena, wts, a);
    else if (a->groups == a->x.c && a->groups == a->y.c) qconv_depthwise(arena, wts, a);
    else qconv_grouped(arena, wts, a);
}

/* Whether a view's elements in logical (N, C, H, W) order from n's first are contiguous (a size-1
 * dimension's stride does not matter). */
static int qlogical_dense(const tf_view *v) {
    long expect = 1;
    const long size[3] = {v->w, v->h, v->c}, stride[3] = {v->sw, v->sh, v->sc};
    for (int i = 0; i < 3; i++) {
        if (size[i] > 1 && stride[i] != expect) return 0;
        expect *= size[i];
    }
    return 1;
}

/* Elements [k0, k1) of sample n in logical (C, H, W) order: a flatten folded in. */
static void gather_features(int8_t *dst, float *arena, const tf_view *x, long n, long k0, long k1) {
    for (long i = k0; i < k1; i++) {
        const long c = i / (x->h * x->w), h = i / x->w % x->h, k = i % x->w;
        dst[i - k0] = *q8(arena, x->off + n * x->sn + c * x->sc + h * x->sh + k * x->sw);
    }
}

/* sum (x - xz) w over k elements, exactly in int32 (sum x w - xz sum w: loops the compiler vectorizes). */
static int32_t qdot(const int8_t *x, const int8_t *w, long k, int32_t xz) {
    int32_t s = 0, ws = 0;
    for (long i = 0; i < k; i++) {
        s += (int32_t)x[i] * (int32_t)w[i];
        ws += w[i];
    }
    return s - xz * ws;
}

static void qgemm(float *arena, const float *wts, const tf_qgemm_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const long outs = y->c * y->h * y->w, K = a->in_features;
    const int8_t *w = (const int8_t *)(wts + a->w);
    const int dense = qlogical_dense(x);
    int8_t chunk[TF_QK];
    int32_t acc[TF_QCO];
    for (long n = 0; n < x->n; n++)
    for (long o0 = 0; o0 < outs; o0 += TF_QCO) {
        const long no = outs - o0 < TF_QCO ? outs - o0 : TF_QCO;
        for (long o = 0; o < no; o++) acc[o] = a->b >= 0 ? word_i32(wts, a->b + o0 + o) : 0;
        for (long k0 = 0; k0 < K; k0 += TF_QK) {
            const long k1 = K - k0 < TF_QK ? K : k0 + TF_QK;
            const int8_t *xs = dense ? q8(arena, x->off + n * x->sn) + k0 : chunk;
            if (!dense) gather_features(chunk, arena, x, n, k0, k1);
            for (long o = 0; o < no; o++) acc[o] += qdot(xs, w + (o0 + o) * K + k0, k1 - k0, a->xz);
        }
        for (long o = 0; o < no; o++) {
            const long oi = o0 + o, oc = oi / (y->h * y->w), oh = oi / y->w % y->h, ow = oi % y->w;
            *q8(arena, y->off + n * y->sn + oc * y->sc + oh * y->sh + ow * y->sw) =
                requant_acc(acc[o], wts + a->m, oi, a->round, a->yz, a->lo, a->hi);
        }
    }
}

/* Element (n, c, h, w) of an operand view, a dimension of size 1 broadcast. */
static int qat(float *arena, const tf_view *v, long n, long c, long h, long w) {
    return *q8(arena, v->off + (v->n > 1 ? n * v->sn : 0) + (v->c > 1 ? c * v->sc : 0) + (v->h > 1 ? h * v->sh : 0)
               + (v->w > 1 ? w * v->sw : 0));
}

/* A run of c channels, each view's channels unit-stride: the products go through memory between
 * two loops, which keeps a compiler from fusing one with the sum (as the volatile below does) and
 * lets it vectorize both. */
static void qadd_run(int8_t *out, const int8_t *pa, const int8_t *pb, long c, const tf_qadd_args *a) {
    float va[TF_QCO], vb[TF_QCO];
    for (long c0 = 0; c0 < c; c0 += TF_QCO) {
        const long m = c - c0 < TF_QCO ? c - c0 : TF_QCO;
        for (long i = 0; i < m; i++) {
            va[i] = dequantize1(pa[c0 + i], a->sa, a->za);
            vb[i] = dequantize1(pb[c0 + i], a->sb, a->zb);
        }
        for (long i = 0; i < m; i++) {
            int8_t v = quantize1(va[i] + vb[i], a->sy, a->zy);
            out[c0 + i] = v < a->lo ? (int8_t)a->lo : (v > a->hi ? (int8_t)a->hi : v);
        }
    }
}

/* TFLite's int8 ADD: each input less its zero point, shifted left 20, scaled to twice the larger
 * input scale; the sum scaled to the output's; the zero point added; clamped. */
static int8_t tfl_add1(int qa, int qb, const tf_qadd_args *a) {
    const int32_t va = tfl_scale((qa - a->za) * (1 << 20), a->am, a->ash);
    const int32_t vb = tfl_scale((qb - a->zb) * (1 << 20), a->bm, a->bsh);
    const int32_t v = tfl_scale(va + vb, a->ym, a->ysh) + a->zy;
    return (int8_t)(v < a->lo ? a->lo : (v > a->hi ? a->hi : v));
}

/* TFLite's int8 MUL (reference_integer_ops::Mul, TFLite Micro's mul): the product of the inputs
 * less their zero points, exact in int32, by the fixed-point multiplier of sa sb / sy (ym, ysh), the
 * zero point added, clamped; a dimension of size 1 broadcast. Element by element, each read
 * before its write. */
static void qmul_elements(float *arena, const tf_qadd_args *a) {
    const tf_view *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long c = 0; c < y->c; c++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const int32_t p = (qat(arena, &a->a, n, c, h, w) - a->za) * (qat(arena, &a->b, n, c, h, w) - a->zb);
        const int32_t v = tfl_scale(p, a->ym, a->ysh) + a->zy;
        *q8(arena, y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw) =
            (int8_t)(v < a->lo ? a->lo : (v > a->hi ? a->hi : v));
    }
}

static void qadd(float *arena, const tf_qadd_args *a) {
    const tf_view *y = &a->y;
    if (a->round != TF_ROUND_TFLITE && same_shape(&a->a, y) && same_shape(&a->b, y) && a->a.sc == 1 && a->b.sc == 1
        && y->sc == 1) {
        /* whole pixels back to back in all three: a row is one run (a chunk's reads still come
         * before its writes, so the walk stays position by position) */
        const int merge = y->sw == y->c && a->a.sw == y->c && a->b.sw == y->c;
        for (long n = 0; n < y->n; n++)
        for (long h = 0; h < y->h; h++)
        for (long w = 0; w < y->w; w++) {
            if (merge && w == 0) {
                qadd_run(q8(arena, y->off + n * y->sn + h * y->sh), q8(arena, a->a.off + n * a->a.sn + h * a->a.sh),
                         q8(arena, a->b.off + n * a->b.sn + h * a->b.sh), y->w * y->c, a);
                break;
            }
            qadd_run(q8(arena, y->off + n * y->sn + h * y->sh + w * y->sw), q8(arena, a->a.off + n * a->a.sn + h * a->a.sh + w * a->a.sw),
                     q8(arena, a->b.off + n * a->b.sn + h * a->b.sh + w * a->b.sw), y->c, a);
        }
        return;
    }
    for (long n = 0; n < y->n; n++)
    for (long c = 0; c < y->c; c++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        if (a->round == TF_ROUND_TFLITE) {
            *q8(arena, y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw) =
                tfl_add1(qat(arena, &a->a, n, c, h, w), qat(arena, &a->b, n, c, h, w), a);
            continue;
        }
        volatile float va = dequantize1(qat(arena, &a->a, n, c, h, w), a->sa, a->za);
        volatile float vb = dequantize1(qat(arena, &a->b, n, c, h, w), a->sb, a->zb);
        int8_t v = quantize1(va + vb, a->sy, a->zy);
        v = v < a->lo ? (int8_t)a->lo : (v > a->hi ? (int8_t)a->hi : v);
        *q8(arena, y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw) = v;
    }
}

static int same_q(const tf_qparams *q) { return q->xs == q->ys && q->xz == q->yz; }

/* A max pool of channels-last views with one scale in and out: channels innermost, no requantization. */
static void qmaxpool_last(float *arena, const tf_pool_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    int8_t best[TF_QCO];
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        for (long c0 = 0; c0 < y->c; c0 += TF_QCO) {
            const long nc = y->c - c0 < TF_QCO ? y->c - c0 : TF_QCO;
            memset(best, -128, (size_t)nc);
            for (long ky = t.ky0; ky < t.ky1; ky++)
            for (long kx = t.kx0; kx < t.kx1; kx++) {
                const int8_t *in = q8(arena, x->off + n * x->sn + c0 + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw);
                for (long c = 0; c < nc; c++) best[c] = in[c] > best[c] ? in[c] : best[c];
            }
            memcpy(q8(arena, y->off + n * y->sn + c0 + oy * y->sh + ox * y->sw), best, (size_t)nc);
        }
    }
}

/* TFLite's int8 average: the int32 sum of the window's inputs (padding not counted) over their
 * count, rounded half away from zero (x and y are quantized alike). */
static int8_t tfl_average(float *arena, const tf_view *x, long n, long c, const window *t, const tf_pool_args *a) {
    int32_t acc = 0, count = 0;
    for (long ky = t->ky0; ky < t->ky1; ky++)
    for (long kx = t->kx0; kx < t->kx1; kx++, count++)
        acc += *q8(arena, x->off + n * x->sn + c * x->sc + (t->iy + ky * a->dh) * x->sh + (t->ix + kx * a->dw) * x->sw);
    if (count == 0) return 0;
    acc = acc > 0 ? (acc + count / 2) / count : (acc - count / 2) / count;
    return (int8_t)(acc < -128 ? -128 : (acc > 127 ? 127 : acc));
}

static void qpool(float *arena, const tf_qpool_args *qa) {
    const tf_pool_args *a = &qa->p;
    const tf_qparams *q = &qa->q;
    const tf_view *x = &a->x, *y = &a->y;
    const int avg = a->kind == TF_POOL_AVG, same = same_q(q);
    if (!avg && same && x->sc == 1 && y->sc == 1) {
        qmaxpool_last(arena, a);
        return;
    }
    for (long n = 0; n < y->n; n++)
    for (long oy = 0; oy < y->h; oy++)
    for (long ox = 0; ox < y->w; ox++) {
        const window t = window_at(x, oy * a->sh - a->pt, ox * a->sw - a->pl, a->kh, a->kw, a->dh, a->dw);
        const float div = avg ? pool_divisor(a, oy, ox) : 1.0f;
        for (long c = 0; c < y->c; c++) {
            int best = -128;
            float sum = 0.0f;
            /* onnxruntime's float AveragePool (MLAS) sums each kernel column top to bottom, then the
             * columns left to right: that order, found by experiment, gives its floats exactly. */
            if (avg && qa->mode == 2) /* row by row (onnxruntime's global and NCHWc float paths) */
                for (long ky = t.ky0; ky < t.ky1; ky++)
                for (long kx = t.kx0; kx < t.kx1; kx++) {
                    volatile float d = dequantize1(*q8(arena, x->off + n * x->sn + c * x->sc + (t.iy + ky * a->dh) * x->sh
                                                          + (t.ix + kx * a->dw) * x->sw), q->xs, q->xz);
                    sum += d;
                }
            else for (long kx = t.kx0; kx < t.kx1; kx++) {
                float col = 0.0f;
                for (long ky = t.ky0; ky < t.ky1; ky++) {
                    const int v = *q8(arena, x->off + n * x->sn + c * x->sc + (t.iy + ky * a->dh) * x->sh + (t.ix + kx * a->dw) * x->sw);
                    if (avg) {
                        volatile float d = dequantize1(v, q->xs, q->xz);
                        col += d;
                    } else if (v > best) best = v;
                }
                sum += col;
            }
            int8_t r;
            if (avg && qa->mode == 3) r = tfl_average(arena, x, n, c, &t, a);
            else if (avg && qa->mode == 1) { /* QLinearAveragePool: a row-major sum, y / ys + yz rounded */
                float s = 0.0f;
                for (long ky = t.ky0; ky < t.ky1; ky++)
                for (long kx = t.kx0; kx < t.kx1; kx++) {
                    volatile float d = q->xs * (float)(*q8(arena, x->off + n * x->sn + c * x->sc + (t.iy + ky * a->dh) * x->sh
                                                           + (t.ix + kx * a->dw) * x->sw) - q->xz);
                    s += d;
                }
                if (div > 0.0f) s /= div;
                /* onnxruntime on x86 runs it on uint8 (its QDQ int8 -> uint8 conversion): the zero point
                 * plus 128 is added before rounding, which rounds some sums differently (found by
                 * experiment: exact with it, a few elements in a thousand off without). */
                const float v = nearbyintf(s / q->ys + (float)(q->yz + 128));
                r = (int8_t)((v < 0.0f ? 0 : (v > 255.0f ? 255 : (int)v)) - 128);
            } else if (avg) r = quantize1(div > 0.0f ? sum / div : sum, q->ys, q->yz);
            else r = same ? (int8_t)best : quantize1(dequantize1(best, q->xs, q->xz), q->ys, q->yz);
            *q8(arena, y->off + n * y->sn + c * y->sc + oy * y->sh + ox * y->sw) = r;
        }
    }
}

static int8_t qglobal_one(const tf_qglobal_args *a, int32_t acc, int best) {
    const tf_qparams *q = &a->q;
    if (a->kind == TF_GLOBAL_MAX) return same_q(q) ? (int8_t)best : quantize1(dequantize1(best, q->xs, q->xz), q->ys, q->yz);
    if (a->round == TF_ROUND_TFLITE) { /* TFLite's MEAN */
        const int32_t v = tfl_scale(acc - (int32_t)(a->x.h * a->x.w) * q->xz, a->qm, a->qs) + q->yz;
        return (int8_t)(v < -128 ? -128 : (v > 127 ? 127 : v));
    }
    return requant((float)(acc - (int32_t)(a->x.h * a->x.w) * q->xz) * a->m, q->yz, -128, 127);
}

static void qglobal(float *arena, const tf_qglobal_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    int32_t acc[TF_QCO];
    int best[TF_QCO];
    for (long n = 0; n < x->n; n++)
    for (long c0 = 0; c0 < x->c; c0 += TF_QCO) { /* channels innermost: contiguous in channels-last views */
        const long nc = x->c - c0 < TF_QCO ? x->c - c0 : TF_QCO;
        for (long c = 0; c < nc; c++) {
            acc[c] = 0;
            best[c] = -128;
        }
        for (long h = 0; h < x->h; h++)
        for (long w = 0; w < x->w; w++) {
            const int8_t *in = q8(arena, x->off + n * x->sn + c0 * x->sc + h * x->sh + w * x->sw);
            for (long c = 0; c < nc; c++) {
                const int v = in[c * x->sc];
                acc[c] += v;
                best[c] = v > best[c] ? v : best[c];
            }
        }
        for (long c = 0; c < nc; c++) *q8(arena, y->off + n * y->sn + (c0 + c) * y->sc) = qglobal_one(a, acc[c], best[c]);
    }
}

/* y = x for same-shaped int8 views (copy_same's walk on bytes): a window shifted within its
 * buffer (a copy step of a parts plan) reads every byte before it is overwritten. */
static void qcopy_same(float *arena, const tf_view *x, const tf_view *y) { copy_items(arena, x, y, 1); }

/* y = x (int8, logical order; same-shaped views walk y's order, others are a reshape), each
 * value requantized from x's scale to y's unless q is NULL. */
static void qmove(float *arena, const tf_view *x, const tf_view *y, const tf_qparams *q) {
    if (!q && same_shape(x, y)) {
        qcopy_same(arena, x, y);
        return;
    }
    const long count = y->n * y->c * y->h * y->w;
    const int reshape = !same_shape(x, y);
    for (long i = 0; i < count; i++) {
        const long w = i % y->w, h = i / y->w % y->h, c = i / (y->w * y->h) % y->c, n = i / (y->w * y->h * y->c);
        long xi = x->off + n * x->sn + c * x->sc + h * x->sh + w * x->sw;
        if (reshape) {
            const long xw = i % x->w, xh = i / x->w % x->h, xc = i / (x->w * x->h) % x->c, xn = i / (x->w * x->h * x->c);
            xi = x->off + xn * x->sn + xc * x->sc + xh * x->sh + xw * x->sw;
        }
        const int v = *q8(arena, xi);
        *q8(arena, y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw) =
            q ? quantize1(dequantize1(v, q->xs, q->xz), q->ys, q->yz) : (int8_t)v;
    }
}

static void qconcat(float *arena, const tf_qconcat_args *a) {
    long c0 = 0;
    for (int i = 0; i < a->count; i++) {
        const tf_view *x = &a->x[i];
        tf_view y = a->y;
        y.off += c0 * y.sc;
        y.c = x->c;
        qmove(arena, x, &y, same_q(&a->q[i]) ? NULL : &a->q[i]);
        c0 += x->c;
    }
}

/* QuantizeLinear along runs of contiguous floats (channels of a channels-last input, or rows of a
 * channels-first one): quantize1 per element in a plain loop the compiler vectorizes (the same
 * division, clamp and rounding), instead of the general walk's index arithmetic per element. */
static void quantize_runs(int8_t *out, long so, const float *in, long count, float s, int z) {
    if (so == 1) for (long i = 0; i < count; i++) out[i] = quantize1(in[i], s, z);
    else for (long i = 0; i < count; i++) out[i * so] = quantize1(in[i], s, z);
}

static void quantize_fast(float *arena, const tf_quant_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    const int last = x->sc == 1; /* else x->sw == 1 */
    /* channels-last in both with whole pixels back to back: a row's pixels are one run */
    const int merge = last && y->sc == 1 && x->sw == x->c && y->sw == y->c;
    const long outer = merge ? 1 : (last ? y->w : y->c), run = merge ? y->w * y->c : (last ? y->c : y->w);
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long i = 0; i < outer; i++) {
        const float *in = arena + x->off + n * x->sn + h * x->sh + i * (last ? x->sw : x->sc);
        int8_t *out = q8(arena, y->off + n * y->sn + h * y->sh + i * (last ? y->sw : y->sc));
        quantize_runs(out, last ? y->sc : y->sw, in, run, a->q.ys, a->q.yz);
    }
}

static void quantize_step(float *arena, const tf_quant_args *a, int kind) {
    const tf_view *x = &a->x, *y = &a->y;
    if (kind == TF_STEP_QCOPY) {
        qmove(arena, x, y, same_q(&a->q) ? NULL : &a->q);
        if (a->lo > -128 || a->hi < 127)
            for (long n = 0; n < y->n; n++)
            for (long c = 0; c < y->c; c++)
            for (long h = 0; h < y->h; h++)
            for (long w = 0; w < y->w; w++) {
                int8_t *v = q8(arena, y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw);
                *v = *v < a->lo ? (int8_t)a->lo : (*v > a->hi ? (int8_t)a->hi : *v);
            }
        return;
    }
    if (kind == TF_STEP_QUANTIZE && a->round != TF_ROUND_TFLITE && (a->x.sc == 1 || a->x.sw == 1)) {
        quantize_fast(arena, a);
        return;
    }
    const int last = x->sc == 1 || y->sc == 1; /* channels-last: channels innermost */
    for (long n = 0; n < y->n; n++)
    for (long i = 0; i < y->c * y->h * y->w; i++) {
        const long c = last ? i % y->c : i / (y->h * y->w), h = last ? i / y->c / y->w : i / y->w % y->h,
                   w = last ? i / y->c % y->w : i % y->w;
        const long xi = x->off + n * x->sn + c * x->sc + h * x->sh + w * x->sw;
        const long yi = y->off + n * y->sn + c * y->sc + h * y->sh + w * y->sw;
        if (kind == TF_STEP_QUANTIZE && a->round == TF_ROUND_TFLITE) { /* TFLite rounds half away from zero */
            const float v = roundf(arena[xi] / a->q.ys) + (float)a->q.yz;
            *q8(arena, yi) = (int8_t)(v < -128.0f ? -128 : (v > 127.0f ? 127 : (int)v));
        } else if (kind == TF_STEP_QUANTIZE) *q8(arena, yi) = quantize1(arena[xi], a->q.ys, a->q.yz);
        else arena[yi] = dequantize1(*q8(arena, xi), a->q.xs, a->q.xz);
    }
}

/* TFLite's int8 softmax (reference_ops::Softmax), on gemmlowp's fixed-point numbers: a raw int32
 * with I integer bits stands for raw / 2^(31 - I). */
static int32_t fx_mul_pot(int32_t x, int e) { /* SaturatingRoundingMultiplyByPOT<e> */
    if (e < 0) return tfl_div_pot(x, -e);
    const int32_t threshold = (int32_t)((1u << (31 - e)) - 1);
    return x > threshold ? INT32_MAX : (x < -threshold ? INT32_MIN : (int32_t)((uint32_t)x << e));
}

/* exp(a) for a in [-1/4, 0), Q0.31: a Taylor expansion around -1/8. */
static int32_t fx_exp_quarter(int32_t a) {
    const int32_t c = 1895147668, third = 715827883; /* exp(-1/8), 1/3 */
    const int32_t x = a + (1 << 28), x2 = tfl_high_mul(x, x), x3 = tfl_high_mul(x2, x), x4 = tfl_high_mul(x2, x2);
    const int32_t x4_4 = fx_mul_pot(x4, -2);
    const int32_t poly = fx_mul_pot(tfl_high_mul(x4_4 + x3, third) + x2, -1);
    return c + tfl_high_mul(c, x + poly);
}

/* exp(a) for a <= 0 given in Q5.26, as Q0.31 (gemmlowp's exp_on_negative_values). */
static int32_t fx_exp_negative(int32_t a) {
    static const int32_t mult[7] = {1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242};
    const int32_t quarter = 1 << 24, mod = (a & (quarter - 1)) - quarter;
    int32_t r = fx_exp_quarter(fx_mul_pot(mod, 5));
    const int32_t rem = mod - a;
    for (int e = -2; e <= 4; e++) /* exp(-2^e) for each bit of the remainder */
        if (rem & (1 << (26 + e))) r = tfl_high_mul(r, mult[e + 2]);
    return a == 0 ? INT32_MAX : r;
}

/* 1 / (1 + x) for x in [0, 1), Q0.31: Newton-Raphson in Q2.29. */
static int32_t fx_one_over_one_plus(int32_t a) {
    const int64_t sum = (int64_t)a + INT32_MAX;
    const int32_t half = (int32_t)((sum + (sum >= 0 ? 1 : -1)) / 2); /* RoundingHalfSum(a, 1) */
    int32_t x = 1515870810 + tfl_high_mul(half, -1010580540); /* 48/17 - 32/17 d */
    for (int i = 0; i < 3; i++) x = x + fx_mul_pot(tfl_high_mul(x, (1 << 29) - tfl_high_mul(half, x)), 2);
    return fx_mul_pot(x, 1);
}

static void qsoftmax(float *arena, const tf_qsoftmax_args *a) {
    const tf_view *x = &a->x, *y = &a->y;
    for (long n = 0; n < y->n; n++)
    for (long h = 0; h < y->h; h++)
    for (long w = 0; w < y->w; w++) {
        const int8_t *in = q8(arena, x->off + n * x->sn + h * x->sh + w * x->sw);
        int8_t *out = q8(arena, y->off + n * y->sn + h * y->sh + w * y->sw);
        int best = -128;
        for (long c = 0; c < x->c; c++) best = in[c * x->sc] > best ? in[c * x->sc] : best;
        int32_t sum = 0; /* Q12.19 */
        for (long c = 0; c < x->c; c++) {
            const int32_t d = in[c * x->sc] - best;
            if (d >= a->diff_min) sum += tfl_div_pot(fx_exp_negative(tfl_high_mul(d * (1 << a->shift), a->m)), 12);
        }
        int lz = 0; /* GetReciprocal: the sum's leading zeros */
        while (lz < 32 && !((uint32_t)sum & (0x80000000u >> lz))) lz++;
        const int over_unit = 12 - lz;
        const int32_t scale = fx_one_over_one_plus((int32_t)(((uint32_t)sum << lz) - 0x80000000u));
        const int exponent = over_unit + 31 - 8;
        for (long c = 0; c < x->c; c++) {
            const int32_t d = in[c * x->sc] - best;
            int32_t v = -128;
            if (d >= a->diff_min) {
                const int32_t e = fx_exp_negative(tfl_high_mul(d * (1 << a->shift), a->m));
                v = tfl_div_pot(tfl_high_mul(scale, e), exponent) - 128;
                v = v > 127 ? 127 : (v < -128 ? -128 : v);
            }
            out[c * y->sc] = (int8_t)v;
        }
    }
}

/* One int8 step; 0 if `kind` is not one. */
static int run_int8(float *arena, const float *weights, int kind, const void *p) {
    switch (kind) {
    case TF_STEP_QCONV: qconv(arena, weights, (const tf_qconv_args *)p); return 1;
    case TF_STEP_QGEMM: qgemm(arena, weights, (const tf_qgemm_args *)p); return 1;
    case TF_STEP_QADD: qadd(arena, (const tf_qadd_args *)p); return 1;
    case TF_STEP_QMUL: qmul_elements(arena, (const tf_qadd_args *)p); return 1;
    case TF_STEP_QPOOL: qpool(arena, (const tf_qpool_args *)p); return 1;
    case TF_STEP_QGLOBAL: qglobal(arena, (const tf_qglobal_args *)p); return 1;
    case TF_STEP_QCONCAT: qconcat(arena, (const tf_qconcat_args *)p); return 1;
    case TF_STEP_QSOFTMAX: qsoftmax(arena, (const tf_qsoftmax_args *)p); return 1;
    case TF_STEP_QUANTIZE: case TF_STEP_DEQUANTIZE: case TF_STEP_QCOPY:
        quantize_step(arena, (const tf_quant_args *)p, kind); return 1;
    default: return 0;
    }
}

/* --- end int8 ----------------------------------------------------------------------------------- */

/* --- the step loop ---------------------------------------------------------------------------- */

/* One step; 0, or the input or output callback's status (-1: an unknown step kind, -2: an output
 * step without a sink). */
static int run_step(float *arena, const float *weights, const int32_t *indices, const tf_step *step,
                    const tf_source *inputs, const tf_sink *outputs) {
    const void *p = step->args;
    switch (step->kind) {
    case TF_STEP_CONV: if (!TF_WANTS(TF_STEP_CONV)) return -1;
        conv(arena, weights, (const tf_conv_args *)p); break;
    case TF_STEP_POOL: if (!TF_WANTS(TF_STEP_POOL)) return -1; pool(arena, (const tf_pool_args *)p); break;
    case TF_STEP_GLOBAL: if (!TF_WANTS(TF_STEP_GLOBAL)) return -1;
        global_pool(arena, (const tf_global_args *)p); break;
    case TF_STEP_GEMM: if (!TF_WANTS(TF_STEP_GEMM)) return -1;
        gemm(arena, weights, (const tf_gemm_args *)p); break;
    case TF_STEP_SOFTMAX: if (!TF_WANTS(TF_STEP_SOFTMAX)) return -1;
        softmax(arena, (const tf_softmax_args *)p); break;
    case TF_STEP_CHANNEL_NORM: if (!TF_WANTS(TF_STEP_CHANNEL_NORM)) return -1;
        channel_norm(arena, weights, (const tf_norm_args *)p); break;
    case TF_STEP_INSTANCE_NORM: if (!TF_WANTS(TF_STEP_INSTANCE_NORM)) return -1;
        instance_norm(arena, weights, (const tf_norm_args *)p); break;
    case TF_STEP_CHANNEL_REDUCE: if (!TF_WANTS(TF_STEP_CHANNEL_REDUCE)) return -1;
        channel_reduce(arena, (const tf_global_args *)p); break;
    case TF_STEP_ELTWISE: if (!TF_WANTS(TF_STEP_ELTWISE)) return -1;
        eltwise(arena, weights, (const tf_eltwise_args *)p); break;
    case TF_STEP_AFFINE: if (!TF_WANTS(TF_STEP_AFFINE)) return -1;
        affine(arena, weights, (const tf_affine_args *)p); break;
    case TF_STEP_LRN: if (!TF_WANTS(TF_STEP_LRN)) return -1; lrn(arena, (const tf_lrn_args *)p); break;
    case TF_STEP_CONCAT: if (!TF_WANTS(TF_STEP_CONCAT)) return -1;
        concat(arena, (const tf_concat_args *)p); break;
    case TF_STEP_PAD: if (!TF_WANTS(TF_STEP_PAD)) return -1; pad(arena, (const tf_pad_args *)p); break;
    case TF_STEP_RESIZE: if (!TF_WANTS(TF_STEP_RESIZE)) return -1;
        resize(arena, indices, (const tf_resize_args *)p); break;
    case TF_STEP_COPY: if (!TF_WANTS(TF_STEP_COPY)) return -1; copy(arena, (const tf_copy_args *)p); break;
    case TF_STEP_SHUFFLE: if (!TF_WANTS(TF_STEP_SHUFFLE)) return -1;
        shuffle(arena, (const tf_shuffle_args *)p); break;
    case TF_STEP_MOVES: if (!TF_WANTS(TF_STEP_MOVES)) return -1;
        moves(arena, (const tf_moves_args *)p); break;
    case TF_STEP_DECONV: if (!TF_WANTS(TF_STEP_DECONV)) return -1;
        deconv(arena, weights, (const tf_deconv_args *)p); break;
    case TF_STEP_INTERP: if (!TF_WANTS(TF_STEP_INTERP)) return -1;
        interp(arena, weights, indices, (const tf_interp_args *)p); break;
    /* issue 38 */
    case TF_STEP_MATMUL: if (!TF_WANTS(TF_STEP_MATMUL)) return -1;
        matmul(arena, (const tf_matmul_args *)p); break;
    case TF_STEP_REDUCE: if (!TF_WANTS(TF_STEP_REDUCE)) return -1;
        reduce(arena, (const tf_reduce_args *)p); break;
    case TF_STEP_LINEAR: if (!TF_WANTS(TF_STEP_LINEAR)) return -1;
        linear(arena, weights, (const tf_linear_args *)p); break;
    case TF_STEP_INPUT: {
        const tf_input_args *a = (const tf_input_args *)p;
        const tf_view *y = &a->y;
        const tf_source *src = &inputs[a->input];
        void *dst = a->item == 1 ? (void *)q8(arena, y->off) : (void *)(arena + y->off);
        return src->fill(src->ctx, a->n0, a->n0 + y->n, a->h0, a->h0 + y->h, a->w0, a->w0 + y->w,
                     dst, y->sn, y->sc, y->sh, y->sw);
    }
    case TF_STEP_OUTPUT: {
        const tf_output_args *a = (const tf_output_args *)p;
        const tf_view *x = &a->x;
        if (!outputs) return -2;
        const tf_sink *sink = &outputs[a->output];
        const void *src = a->item == 1 ? (const void *)q8(arena, x->off) : (const void *)(arena + x->off);
        return sink->emit(sink->ctx, a->n0, a->n0 + x->n, a->h0, a->h0 + x->h, a->w0, a->w0 + x->w,
                          src, x->sn, x->sc, x->sh, x->sw);
    }
    default:
        if (!(TF_KINDS & TF_INT8_KINDS) || !run_int8(arena, weights, step->kind, p)) return -1;
    }
    return 0;
}

/* A table's rows as the steps they stand for: a REPEAT row runs the `body` rows after it `count`
 * times (a body may hold loops of its own, TF_MAX_LOOPS deep), iteration r of each enclosing loop
 * adding r * step to the moving fields of its body's rows (a copy of their arguments, moved). Every
 * walk of a table (one thread's or several's) goes through next_step, so a loop means the same
 * steps wherever it runs. */
#define TF_MAX_LOOPS 4
typedef struct { const tf_repeat_args *a; long first, end, r; } loop_level; /* body rows [first, end) */
typedef struct {
    const tf_step *rows; long count, i; /* i: the next row */
    loop_level at[TF_MAX_LOOPS];
    int depth, bad;                     /* bad: a table nested deeper than TF_MAX_LOOPS */
    tf_step step;                       /* a moved step handed out */
    tf_any_args args;                   /* its arguments */
} cursor;

static void cursor_at(cursor *c, const tf_step *rows, long count) {
    c->rows = rows, c->count = count, c->i = 0, c->depth = 0, c->bad = 0;
}

/* The first of loop a's deltas for body row j (deltas are in row order), or a->deltas. */
static long first_delta(const tf_repeat_args *a, long j) {
    long lo = 0, hi = a->deltas;
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        if (a->delta[mid].row < j) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Row i as run now: itself when no enclosing loop moves a field of it. */
static const tf_step *moved(cursor *c, const tf_step *row, long i) {
    int copied = 0;
    for (int d = 0; d < c->depth; d++) {
        const loop_level *l = &c->at[d];
        const long j = i - l->first;
        for (long k = first_delta(l->a, j); l->r > 0 && k < l->a->deltas && l->a->delta[k].row == j; k++) {
            const tf_delta *dl = &l->a->delta[k];
            if (!copied) memcpy(&c->args, row->args, (size_t)dl->size), copied = 1;
            tf_int *field = (tf_int *)((char *)&c->args + dl->at);
            *field = (tf_int)(*field + l->r * dl->step);
        }
    }
    if (!copied) return row;
    c->step.kind = row->kind;
    c->step.args = &c->args;
    return &c->step;
}

/* The next step, NULL after the last (or on a table too deeply nested: c->bad). */
static const tf_step *next_step(cursor *c) {
    for (;;) {
        if (c->depth > 0 && c->i == c->at[c->depth - 1].end) {
            loop_level *l = &c->at[c->depth - 1];
            if (++l->r < l->a->count) c->i = l->first;
            else c->depth--;
            continue;
        }
        if (c->i >= c->count) return NULL;
        const tf_step *row = &c->rows[c->i];
        if (row->kind != TF_STEP_REPEAT) return moved(c, row, c->i++);
        const tf_repeat_args *a = (const tf_repeat_args *)row->args;
        if (a->body <= 0 || a->count <= 0) {
            c->i += 1 + (a->body > 0 ? a->body : 0);
            continue;
        }
        if (c->depth == TF_MAX_LOOPS) {
            c->bad = 1;
            return NULL;
        }
        loop_level *l = &c->at[c->depth++];
        l->a = a, l->first = c->i + 1, l->end = c->i + 1 + a->body, l->r = 0;
        c->i++;
    }
}

#if TF_THREADS
/* --- a step shared among threads ---------------------------------------------------------------- */

/* Every part below computes each of its output elements with the same arithmetic as the whole step
 * (the same operands, taps or products summed in the same order), so any split among any number of
 * threads gives the same bits (tests/test_threads.py). A part is the kernel itself on a smaller
 * view: no kernel knows it runs on a part. */

static tf_view view_rows(tf_view v, long r0, long r1) {
    v.off = (tf_int)(v.off + r0 * v.sh);
    v.h = (tf_int)(r1 - r0);
    return v;
}

static tf_view view_channels(tf_view v, long c0, long c1) {
    v.off = (tf_int)(v.off + c0 * v.sc);
    v.c = (tf_int)(c1 - c0);
    return v;
}

static tf_view view_cols(tf_view v, long c0, long c1) {
    v.off = (tf_int)(v.off + c0 * v.sw);
    v.w = (tf_int)(c1 - c0);
    return v;
}

static int same_view(const tf_view *a, const tf_view *b) {
    return a->off == b->off && a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->sn == b->sn
           && a->sc == b->sc && a->sh == b->sh && a->sw == b->sw;
}

/* Output rows [r0, r1) and columns [c0, c1) of a convolution. The input view stays; its first row
 * and column move with pt and pl (negative: rows or columns of the view above or left of the part). */
static void conv_cells(float *arena, const float *wts, const tf_conv_args *a, long r0, long r1, long c0, long c1) {
    tf_conv_args part = *a;
    part.y = view_cols(view_rows(a->y, r0, r1), c0, c1);
    part.pt = (tf_int)(a->pt - r0 * a->sh);
    part.pl = (tf_int)(a->pl - c0 * a->sw);
    conv(arena, wts, &part);
}

/* Likewise for a pooling (oy0, ox0: the part's first output row and column, for averages' divisors). */
static void pool_cells(float *arena, const tf_pool_args *a, long r0, long r1, long c0, long c1) {
    tf_pool_args part = *a;
    part.y = view_cols(view_rows(a->y, r0, r1), c0, c1);
    part.pt = (tf_int)(a->pt - r0 * a->sh);
    part.pl = (tf_int)(a->pl - c0 * a->sw);
    part.oy0 = (tf_int)(a->oy0 + r0);
    part.ox0 = (tf_int)(a->ox0 + c0);
    pool(arena, &part);
}

/* Output channels [16 p0, 16 p1) of a dense convolution (its weight panels p0 to p1). */
static void conv_panels(float *arena, const float *wts, const tf_conv_args *a, long p0, long p1) {
    tf_conv_args part = *a;
    const long c0 = p0 * 16, c1 = p1 * 16 < a->y.c ? p1 * 16 : a->y.c;
    part.y = view_channels(a->y, c0, c1);
    part.w = (tf_int)(a->w + p0 * a->kh * a->kw * a->x.c * 16);
    part.b = (tf_int)(a->b + c0);
    conv(arena, wts, &part);
}

/* Output rows [r0, r1) of an elementwise step: each operand not broadcast along H takes the same
 * rows (a constant's from h0 + r0). */
static void eltwise_rows(float *arena, const float *wts, const tf_eltwise_args *a, long r0, long r1) {
    tf_operand op[TF_MAX_OPERANDS];
    tf_eltwise_args part = *a;
    for (int i = 0; i < a->count; i++) {
        op[i] = a->op[i];
        if (op[i].is_const && op[i].h != 1) op[i].h0 = (tf_int)(op[i].h0 + r0);
        else if (!op[i].is_const && op[i].v.h != 1) op[i].v = view_rows(op[i].v, r0, r1);
    }
    part.y = view_rows(a->y, r0, r1);
    part.op = op;
    eltwise(arena, wts, &part);
}

static void affine_rows(float *arena, const float *wts, const tf_affine_args *a, long r0, long r1) {
    tf_affine_args part = *a;
    part.x = view_rows(a->x, r0, r1);
    part.y = view_rows(a->y, r0, r1);
    affine(arena, wts, &part);
}

#define TF_SHARED_VIEWS 64 /* a concatenation of more inputs runs on one thread */

static void concat_rows(float *arena, const tf_concat_args *a, long r0, long r1) {
    tf_view x[TF_SHARED_VIEWS];
    tf_concat_args part = *a;
    for (int i = 0; i < a->count; i++) x[i] = view_rows(a->x[i], r0, r1);
    part.y = view_rows(a->y, r0, r1);
    part.x = x;
    concat(arena, &part);
}

static void copy_rows(float *arena, const tf_copy_args *a, long r0, long r1) {
    tf_copy_args part = *a;
    part.x = view_rows(a->x, r0, r1);
    part.y = view_rows(a->y, r0, r1);
    copy(arena, &part);
}

/* Outputs [c0, c1) of a gemm whose outputs are channels (y is N x C x 1 x 1): their rows of W. */
static void gemm_outputs(float *arena, const float *wts, const tf_gemm_args *a, long c0, long c1) {
    tf_gemm_args part = *a;
    part.y = view_channels(a->y, c0, c1);
    part.w = (tf_int)(a->w + c0 * a->in_features);
    if (a->b >= 0) part.b = (tf_int)(a->b + c0);
    gemm(arena, wts, &part);
}

/* Rows [r0, r1) of an input step whose source is the library's own tf_tensor_rows (a copy from
 * memory, safe on any thread: any other source's callback is called from the caller's thread only). */
static int input_rows(float *arena, const tf_input_args *a, const tf_source *inputs, long r0, long r1) {
    const tf_view *y = &a->y;
    const tf_source *src = &inputs[a->input];
    const long off = y->off + r0 * y->sh;
    void *dst = a->item == 1 ? (void *)q8(arena, off) : (void *)(arena + off);
    return src->fill(src->ctx, a->n0, a->n0 + y->n, a->h0 + r0, a->h0 + r1, a->w0, a->w0 + y->w, dst, y->sn, y->sc,
                     y->sh, y->sw);
}

/* How a step is shared: by output rows, by output pixels (rows x columns in order: few rows, as
 * 7 x 7), by panels of 16 output channels (a dense convolution), or by outputs (a gemm's).
 * Rows and pixels leave each thread the same part of the image step after step (a stride-2 step's
 * output rows [0, h/2) read its input rows [0, h)), so its data stays in that thread's cache: a cache
 * line that moves between cores costs about as much as a few hundred multiply-adds, and on the
 * 2-core EPYC measured, ten times that when the host runs its two cores on different core complexes
 * (a round trip of 330 ns, not 50: the 2-thread times are bimodal by process placement). A global
 * pool is not shared for that reason: its channels' split would have each thread read every row of
 * them, half of which the other thread wrote (efficientnet_b0's squeeze-excite pools: measured
 * slower shared). */
enum { TF_SPLIT_NONE, TF_SPLIT_ROWS, TF_SPLIT_PIXELS, TF_SPLIT_PANELS, TF_SPLIT_OUTPUTS };
typedef struct { long units; int by; double work; } split;

/* The fraction of the threads' time busy when `units` are shared among them (1: even shares). */
static double balance(long units, int threads) {
    return (double)units / (double)(threads * ((units + threads - 1) / threads));
}

/* Rows where they share evenly enough, else pixels (7 rows on 2 threads leave one idle for a
 * seventh of the step; 49 pixels do not). */
static split rows_or_pixels(const tf_view *y, double work, int threads) {
    split s = {y->h, TF_SPLIT_ROWS, work};
    if (balance(y->h, threads) < 0.95 && balance((long)y->h * y->w, threads) > balance(y->h, threads))
        s.units = (long)y->h * y->w, s.by = TF_SPLIT_PIXELS;
    return s;
}

static double elements(const tf_view *v) { return (double)v->n * v->c * v->h * v->w; }

/* Work in multiply-adds; a value moved or combined counts as TF_ELEMENT_WORK of them (measured: an
 * elementwise step's element takes about as long as four of a dense convolution's multiply-adds),
 * and so does each weight a convolution reads (a squeeze-excite convolution on 1 x 1 pixels reads
 * each once). */
#define TF_ELEMENT_WORK 4.0
static split conv_split(const tf_conv_args *a, int threads) {
    const long per_tap = a->kind == TF_CONV_DENSE ? a->x.c : a->kind == TF_CONV_DEPTHWISE ? 1 : a->x.c / a->groups;
    const double taps = (double)a->kh * a->kw * per_tap;
    const double work = elements(&a->y) * taps + TF_ELEMENT_WORK * taps * a->y.c;
    split s = rows_or_pixels(&a->y, work, threads);
    const long panels = (a->y.c + 15) / 16;
    if (overlapping(&a->x, &a->y)) s.by = TF_SPLIT_NONE; /* in place: its rows' order makes it safe */
    else if (a->kind == TF_CONV_DENSE && panels >= threads && balance(panels, threads) > balance(s.units, threads))
        s.units = panels, s.by = TF_SPLIT_PANELS;
    return s;
}

/* Whether an elementwise step is shared: each view operand is y itself or apart from it (an element
 * is then read before it is written, whichever thread writes it), and no view is broadcast over the
 * pixels. A product by a per-channel scale (squeeze-excite) follows a global pool, which runs on the
 * caller's thread and leaves the scaled tensor in that thread's cache: shared, each thread's rows
 * moved back to it line by line, and efficientnet_b0 ran slower (measured: 5% at 2 threads).
 * Constants are weights, read by both threads alike. */
static int shared_eltwise(const tf_eltwise_args *a) {
    if (a->count > TF_MAX_OPERANDS) return 0;
    for (int i = 0; i < a->count; i++) {
        const tf_operand *o = &a->op[i];
        if (o->is_const) continue;
        if ((long)o->v.h * o->v.w != (long)a->y.h * a->y.w) return 0;
        if (!same_view(&o->v, &a->y) && overlapping(&o->v, &a->y)) return 0;
    }
    return 1;
}

static split concat_split(const tf_concat_args *a) {
    split s = {a->y.h, TF_SPLIT_ROWS, TF_ELEMENT_WORK * elements(&a->y)};
    if (a->count > TF_SHARED_VIEWS) s.by = TF_SPLIT_NONE;
    for (int i = 0; i < a->count && s.by; i++)
        if (overlapping(&a->x[i], &a->y)) s.by = TF_SPLIT_NONE;
    return s;
}

/* The split a step would take (by TF_SPLIT_NONE: none). */
static split split_kind(const tf_step *step, const tf_source *inputs, int threads) {
    const split none = {0, TF_SPLIT_NONE, 0.0};
    const void *p = step->args;
    switch (step->kind) {
    case TF_STEP_CONV: return conv_split((const tf_conv_args *)p, threads);
    case TF_STEP_POOL: {
        const tf_pool_args *a = (const tf_pool_args *)p;
        split s = rows_or_pixels(&a->y, elements(&a->y) * a->kh * a->kw, threads);
        if (overlapping(&a->x, &a->y)) s.by = TF_SPLIT_NONE;
        return s;
    }
    case TF_STEP_ELTWISE: {
        const tf_eltwise_args *a = (const tf_eltwise_args *)p;
        const split s = {a->y.h, shared_eltwise(a) ? TF_SPLIT_ROWS : TF_SPLIT_NONE, TF_ELEMENT_WORK * a->count * elements(&a->y)};
        return s;
    }
    case TF_STEP_AFFINE: {
        const tf_affine_args *a = (const tf_affine_args *)p;
        const int apart = same_view(&a->x, &a->y) || !overlapping(&a->x, &a->y);
        const split s = {a->y.h, apart ? TF_SPLIT_ROWS : TF_SPLIT_NONE, TF_ELEMENT_WORK * elements(&a->y)};
        return s;
    }
    case TF_STEP_CONCAT: return concat_split((const tf_concat_args *)p);
    case TF_STEP_COPY: {
        const tf_copy_args *a = (const tf_copy_args *)p;
        const int apart = same_shape(&a->x, &a->y) && !overlapping(&a->x, &a->y);
        const split s = {a->y.h, apart ? TF_SPLIT_ROWS : TF_SPLIT_NONE, TF_ELEMENT_WORK * elements(&a->y)};
        return s;
    }
    case TF_STEP_GEMM: {
        const tf_gemm_args *a = (const tf_gemm_args *)p;
        const int by = a->y.h == 1 && a->y.w == 1 && !overlapping(&a->x, &a->y) ? TF_SPLIT_OUTPUTS : TF_SPLIT_NONE;
        const split s = {a->y.c, by, TF_ELEMENT_WORK * a->in_features * elements(&a->y)};
        return s;
    }
    case TF_STEP_INPUT: {
        const tf_input_args *a = (const tf_input_args *)p;
        const split s = {a->y.h, inputs[a->input].fill == tf_tensor_rows ? TF_SPLIT_ROWS : TF_SPLIT_NONE,
                         TF_ELEMENT_WORK * elements(&a->y)};
        return s;
    }
    default: return none;
    }
}

/* Work below TF_SHARE_MIN multiply-adds (a microsecond or two) runs on one thread: sharing it would
 * cost a meeting of the threads for less than it saves. */
#ifndef TF_SHARE_MIN
#define TF_SHARE_MIN 65536.0
#endif

/* How step is shared among `threads` (by TF_SPLIT_NONE: it runs on the caller's thread). A build
 * without a step's kind (TF_KINDS) never shares it: it fails on the caller's thread. */
static split split_of(const tf_step *step, const tf_source *inputs, int threads) {
    split s = {0, TF_SPLIT_NONE, 0.0};
    if (threads <= 1 || step->kind < 0 || step->kind >= 64 || !TF_WANTS(step->kind)) return s;
    s = split_kind(step, inputs, threads);
    if (s.units < 2 || s.work < TF_SHARE_MIN) s.by = TF_SPLIT_NONE;
    return s;
}

#ifdef TF_TEST_HOOKS
/* Tests only (built with -DTF_TEST_HOOKS): how a step would be shared (TF_SPLIT_*, 0: not at all),
 * so that a test of the split parts can check that it splits them. */
int tf_split_of(const tf_step *step, const tf_source *inputs, int threads);
int tf_split_of(const tf_step *step, const tf_source *inputs, int threads) {
    return split_of(step, inputs, threads).by;
}
#endif

/* Output rows [r0, r1) and columns [c0, c1) of a convolution or a pooling step. */
static void conv_or_pool_cells(float *arena, const float *wts, const tf_step *step, long r0, long r1, long c0, long c1) {
    if (r1 <= r0 || c1 <= c0) return;
    if (step->kind == TF_STEP_CONV) {
        if (TF_WANTS(TF_STEP_CONV)) conv_cells(arena, wts, (const tf_conv_args *)step->args, r0, r1, c0, c1);
    } else if (TF_WANTS(TF_STEP_POOL)) {
        pool_cells(arena, (const tf_pool_args *)step->args, r0, r1, c0, c1);
    }
}

/* Pixels [p0, p1) of a convolution's or pooling's output, in row order: at most three blocks of rows
 * and columns. */
static void pixels(float *arena, const float *wts, const tf_step *step, long p0, long p1) {
    const tf_view *y = step->kind == TF_STEP_CONV ? &((const tf_conv_args *)step->args)->y : &((const tf_pool_args *)step->args)->y;
    const long w = y->w, first = p0 / w, last = p1 / w; /* rows holding p0 and p1 */
    if (first == last) {
        conv_or_pool_cells(arena, wts, step, first, first + 1, p0 % w, p1 % w);
        return;
    }
    conv_or_pool_cells(arena, wts, step, first, first + 1, p0 % w, w);
    conv_or_pool_cells(arena, wts, step, first + 1, last, 0, w);
    conv_or_pool_cells(arena, wts, step, last, last + 1, 0, p1 % w);
}

/* Units [u0, u1) of a shared step; 0, or the input callback's status. Each kernel is called under its
 * kind's TF_WANTS, as run_step calls it, so that a build leaves out the kernels of kinds it lacks. */
static int run_units(float *arena, const float *wts, const tf_step *step, const tf_source *inputs, int by, long u0, long u1) {
    const void *p = step->args;
    switch (step->kind) {
    case TF_STEP_CONV: {
        const tf_conv_args *a = (const tf_conv_args *)p;
        if (!TF_WANTS(TF_STEP_CONV)) return -1;
        if (by == TF_SPLIT_PANELS) conv_panels(arena, wts, a, u0, u1);
        else if (by == TF_SPLIT_PIXELS) pixels(arena, wts, step, u0, u1);
        else conv_cells(arena, wts, a, u0, u1, 0, a->y.w);
        return 0;
    }
    case TF_STEP_POOL:
        if (!TF_WANTS(TF_STEP_POOL)) return -1;
        if (by == TF_SPLIT_PIXELS) pixels(arena, wts, step, u0, u1);
        else pool_cells(arena, (const tf_pool_args *)p, u0, u1, 0, ((const tf_pool_args *)p)->y.w);
        return 0;
    case TF_STEP_ELTWISE: if (TF_WANTS(TF_STEP_ELTWISE)) eltwise_rows(arena, wts, (const tf_eltwise_args *)p, u0, u1); return 0;
    case TF_STEP_AFFINE: if (TF_WANTS(TF_STEP_AFFINE)) affine_rows(arena, wts, (const tf_affine_args *)p, u0, u1); return 0;
    case TF_STEP_CONCAT: if (TF_WANTS(TF_STEP_CONCAT)) concat_rows(arena, (const tf_concat_args *)p, u0, u1); return 0;
    case TF_STEP_COPY: if (TF_WANTS(TF_STEP_COPY)) copy_rows(arena, (const tf_copy_args *)p, u0, u1); return 0;
    case TF_STEP_GEMM: if (TF_WANTS(TF_STEP_GEMM)) gemm_outputs(arena, wts, (const tf_gemm_args *)p, u0, u1); return 0;
    case TF_STEP_INPUT: return input_rows(arena, (const tf_input_args *)p, inputs, u0, u1);
    default: return -1;
    }
}

/* Thread id's share of a shared step: units [units id / threads, units (id + 1) / threads). */
static int share_of(float *arena, const float *weights, const tf_step *step, const tf_source *inputs, split s, int id,
                    int threads) {
    const long u0 = s.units * id / threads, u1 = s.units * (id + 1) / threads;
    return u1 > u0 ? run_units(arena, weights, step, inputs, s.by, u0, u1) : 0;
}

#define TF_MAX_THREADS 64

/* Polls of a meeting before a thread sleeps on it (about 25 us at 25 ns a pause on the EPYC measured). */
#ifndef TF_SPIN
#define TF_SPIN 1000L
#endif
#if defined(__x86_64__) || defined(__i386__)
#define TF_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define TF_PAUSE() __asm__ __volatile__("yield")
#else
#define TF_PAUSE() ((void)0)
#endif

/* Threads meet before each shared step and after the last of a run of them; the caller's thread
 * runs every other step (an input callback other than tf_tensor_rows is called from the caller's
 * thread only). A meeting is a counter and a generation, polled; the mutex and condition variable
 * are only for a thread that waited longer than TF_SPIN polls (`sleepers` of them). */
typedef struct {
    float *arena; const float *weights; const int32_t *indices; const tf_step *steps; long count;
    const tf_source *inputs; const tf_sink *outputs;
    pthread_mutex_t mu; pthread_cond_t cv;
    long arrived, generation, expected, sleepers; /* atomics */
    int threads, status, said; /* said: the status when the last meeting ended (atomics) */
} team;

typedef struct { team *t; int id; } member;

/* A failure said at the next meeting (the first one said stays). */
static void fail(team *t, int status) {
    int none = 0;
    __atomic_compare_exchange_n(&t->status, &none, status, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* A thread that polled long enough sleeps until the generation moves on. Counted among the sleepers
 * before it looks at the generation again (the last arrival moves the generation before it counts
 * them), so either it sees the new generation or the last arrival sees it and wakes it. */
static void sleep_on(team *t, long gen) {
    pthread_mutex_lock(&t->mu);
    __atomic_add_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&t->generation, __ATOMIC_SEQ_CST) == gen) pthread_cond_wait(&t->cv, &t->mu);
    __atomic_sub_fetch(&t->sleepers, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&t->mu);
}

/* All `expected` threads wait here; each gets the status as it was when the last one arrived (not
 * as it is when it wakes: another thread may have gone on and failed a step since, and a thread
 * that stopped on that would leave the others waiting at the next meeting). */
static int meet(team *t) {
    const long gen = __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE); /* moves only once all have come */
    if (__atomic_add_fetch(&t->arrived, 1, __ATOMIC_ACQ_REL) >= __atomic_load_n(&t->expected, __ATOMIC_ACQUIRE)) {
        const int said = __atomic_load_n(&t->status, __ATOMIC_ACQUIRE);
        __atomic_store_n(&t->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->said, said, __ATOMIC_RELAXED);
        __atomic_store_n(&t->generation, gen + 1, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&t->sleepers, __ATOMIC_SEQ_CST)) {
            pthread_mutex_lock(&t->mu);
            pthread_cond_broadcast(&t->cv);
            pthread_mutex_unlock(&t->mu);
        }
        return said;
    }
    /* A while on the core before sleeping: a step's share ends within microseconds of the others',
     * and waking a sleeping thread (an idle virtual CPU) can take longer than that. */
    for (long spin = 0; spin < TF_SPIN && __atomic_load_n(&t->generation, __ATOMIC_ACQUIRE) == gen; spin++)
        TF_PAUSE();
    if (__atomic_load_n(&t->generation, __ATOMIC_ACQUIRE) == gen) sleep_on(t, gen);
    return __atomic_load_n(&t->said, __ATOMIC_ACQUIRE);
}

/* Every thread walks every step: a shared one after a meeting, its share; any other the caller's
 * thread alone, after a meeting that ends the shared ones before it. */
static void walk(team *t, int id) {
    int after_shared = 0;
    cursor c;
    cursor_at(&c, t->steps, t->count);
    for (const tf_step *step; (step = next_step(&c)) != NULL;) {
        const split s = split_of(step, t->inputs, t->threads);
        if (s.by != TF_SPLIT_NONE) {
            if (meet(t)) return;
            const int status = share_of(t->arena, t->weights, step, t->inputs, s, id, t->threads);
            if (status) fail(t, status); /* said at the next meeting, or after the last step */
            after_shared = 1;
            continue;
        }
        if (after_shared && meet(t)) return;
        after_shared = 0;
        if (id == 0 && !__atomic_load_n(&t->status, __ATOMIC_ACQUIRE)) {
            const int status = run_step(t->arena, t->weights, t->indices, step, t->inputs, t->outputs);
            if (status) fail(t, status); /* the caller's thread runs nothing more */
        }
    }
    if (id == 0 && c.bad) fail(t, -1); /* every thread stopped at the same row: no one is left waiting */
}

static void *worker(void *arg) {
    member *m = (member *)arg;
    meet(m->t); /* the start: every thread is made, and `threads` says how many */
    walk(m->t, m->id);
    return NULL;
}

/* 1 when the steps ran on `threads` threads (their status in *status); 0 when no team could be
 * set up (the caller runs them on its own). */
static int run_threads(float *arena, const float *weights, const int32_t *indices, const tf_step *steps, long count,
                       const tf_source *inputs, const tf_sink *outputs, int threads, int *status) {
    team t;
    pthread_t made[TF_MAX_THREADS];
    member members[TF_MAX_THREADS];
    t.arena = arena, t.weights = weights, t.indices = indices, t.steps = steps, t.count = count;
    t.inputs = inputs, t.outputs = outputs, t.arrived = 0, t.generation = 0, t.sleepers = 0, t.status = 0, t.said = 0;
    t.threads = threads;
    t.expected = (long)TF_MAX_THREADS + 1; /* no meeting ends before the count is known */
    if (pthread_mutex_init(&t.mu, NULL)) return 0;
    if (pthread_cond_init(&t.cv, NULL)) {
        pthread_mutex_destroy(&t.mu);
        return 0;
    }
    int n = 1;
    for (; n < threads; n++) {
        members[n].t = &t;
        members[n].id = n;
        if (pthread_create(&made[n], NULL, worker, &members[n])) break; /* fewer threads: still right */
    }
    /* Before the first meeting ends, no thread reads `threads`; every thread reads it after. */
    __atomic_store_n(&t.threads, n, __ATOMIC_RELAXED);
    __atomic_store_n(&t.expected, (long)n, __ATOMIC_RELEASE);
    meet(&t);
    walk(&t, 0);
    for (int k = 1; k < n; k++) pthread_join(made[k], NULL);
    pthread_cond_destroy(&t.cv);
    pthread_mutex_destroy(&t.mu);
    *status = t.status;
    return 1;
}
#endif

int tf_run(float *arena, const float *weights, const int32_t *indices, const tf_step *steps, long count,
           const tf_source *inputs, const tf_sink *outputs, int threads) {
#if TF_THREADS
    if (threads > TF_MAX_THREADS) threads = TF_MAX_THREADS;
    cursor scan;
    cursor_at(&scan, steps, count);
    for (const tf_step *step; threads > 1 && (step = next_step(&scan)) != NULL;) {
        int status;
        if (split_of(step, inputs, threads).by != TF_SPLIT_NONE) {
            if (run_threads(arena, weights, indices, steps, count, inputs, outputs, threads, &status)) return status;
            break;
        }
    }
#endif
    (void)threads;
    cursor c;
    cursor_at(&c, steps, count);
    for (const tf_step *step; (step = next_step(&c)) != NULL;) {
        const int status = run_step(arena, weights, indices, step, inputs, outputs);
        if (status) return status;
    }
    return c.bad ? -1 : 0;
}

int tf_threads(void) {
#if TF_THREADS
    return TF_MAX_THREADS;
#else
    return 1;
#endif
}

void tf_read(const float *arena, const tf_view *v, long first, long count, float *dst) {
    for (long i = 0; i < count; i++) dst[i] = *at((float *)arena, v, first + i);
}

void tf_read_int8(const float *arena, const tf_view *v, long first, long count, int8_t *dst) {
    for (long i = first; i < first + count; i++) {
        const long w = i % v->w, h = i / v->w % v->h, c = i / (v->w * v->h) % v->c, n = i / (v->w * v->h * v->c);
        dst[i - first] = *q8((float *)arena, v->off + n * v->sn + c * v->sc + h * v->sh + w * v->sw);
    }
}

/* count items of `item` bytes, contiguous in src, to dst `stride` items apart (a channels-last view):
 * inlined with a constant item, a copy of one word each rather than a memcpy call each (a 224 x 224
 * image's input step took 0.3 ms, 1% of resnet18's run). */
static inline void strided_items(char *dst, const char *src, long count, long stride, size_t item) {
    for (long i = 0; i < count; i++) memcpy(dst + (size_t)(i * stride) * item, src + (size_t)i * item, item);
}

int tf_tensor_rows(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                   void *dst, long sn, long sc, long sh, long sw) {
    const tf_tensor *t = (const tf_tensor *)ctx;
    const size_t item = (size_t)t->item;
    if (t->nhwc) { /* channels-last: a row's columns [w0, w1) are one run of (w1 - w0) * c values */
        for (long n = n0; n < n1; n++)
        for (long h = h0; h < h1; h++)
        for (long w = w0; w < w1; w++) {
            const char *src = (const char *)t->x + (size_t)(((n * t->h + h) * t->w + w) * t->c) * item;
            char *out = (char *)dst + (size_t)((n - n0) * sn + (h - h0) * sh + (w - w0) * sw) * item;
            if (sc == 1) memcpy(out, src, (size_t)t->c * item);
            else for (long c = 0; c < t->c; c++) memcpy(out + (size_t)(c * sc) * item, src + (size_t)c * item, item);
        }
        return 0;
    }
    for (long n = n0; n < n1; n++)
    for (long c = 0; c < t->c; c++)
    for (long h = h0; h < h1; h++) {
        const char *src = (const char *)t->x + (size_t)(((n * t->c + c) * t->h + h) * t->w) * item;
        char *out = (char *)dst + (size_t)((n - n0) * sn + c * sc + (h - h0) * sh) * item;
        if (sw == 1) memcpy(out, src + (size_t)w0 * item, (size_t)(w1 - w0) * item);
        else if (item == 4) strided_items(out, src + (size_t)w0 * 4, w1 - w0, sw, 4);
        else strided_items(out, src + (size_t)w0 * item, w1 - w0, sw, item);
    }
    return 0;
}

int tf_tensor_store(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                    const void *src, long sn, long sc, long sh, long sw) {
    const tf_store *t = (const tf_store *)ctx;
    const size_t item = (size_t)t->item;
    for (long n = n0; n < n1; n++)
    for (long c = 0; c < t->c; c++)
    for (long h = h0; h < h1; h++) {
        char *dst = (char *)t->y + (size_t)(((n * t->c + c) * t->h + h) * t->w) * item;
        const char *in = (const char *)src + (size_t)((n - n0) * sn + c * sc + (h - h0) * sh) * item;
        if (sw == 1) memcpy(dst + (size_t)w0 * item, in, (size_t)(w1 - w0) * item);
        else for (long w = w0; w < w1; w++) memcpy(dst + (size_t)w * item, in + (size_t)((w - w0) * sw) * item, item);
    }
    return 0;
}

int tf_simd(void) {
#if !TF_SIMD
    return 0;
#elif defined(__AVX512F__)
    return 16;
#elif defined(__AVX2__)
    return 8;
#else
    return 4;
#endif
}
