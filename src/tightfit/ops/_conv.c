/* Small convolutions over channels-last views with bias and a clamp (ReLU, ReLU6, Clip) fused:
 * depthwise (one filter per channel) and dense (groups 1). oneDNN costs about 20 us a call
 * besides its arithmetic; a band of a few rows has less arithmetic than that. Built and loaded
 * by ops/native.py. */
#include <string.h>

typedef struct {
    const float *x; float *y; const float *w; const float *b;
    long n, c, ih, iw, oh, ow;               /* c: output channels */
    long cin;                                /* input channels (dense) */
    long xs_n, xs_h, xs_w, ys_n, ys_h, ys_w; /* element strides; channels are unit-stride */
    long kh, kw, sh, sw, pt, pl;             /* kernel, stride, top and left zero padding */
    float lo, hi;                            /* output clamp */
} conv_args;

static void clamp(float *restrict out, long c, float lo, float hi) {
    for (long k = 0; k < c; k++) { /* NaN passes through, as torch's clamp */
        float v = out[k];
        v = v < lo ? lo : v;
        out[k] = v > hi ? hi : v;
    }
}

/* The kernel taps of output pixel (oy, ox) that read the input, not its zero padding: rows
 * [y0, y1) and columns [x0, x1) of the kernel; tap (ky, kx) reads input pixel (iy + ky, ix + kx). */
typedef struct { long y0, y1, x0, x1, iy, ix; } taps;

static taps taps_of(const conv_args *a, long oy, long ox) {
    const long iy = oy * a->sh - a->pt, ix = ox * a->sw - a->pl;
    taps t = {iy < 0 ? -iy : 0, a->ih - iy < a->kh ? a->ih - iy : a->kh,
              ix < 0 ? -ix : 0, a->iw - ix < a->kw ? a->iw - ix : a->kw, iy, ix};
    return t;
}

static const float *input_pixel(const conv_args *a, long n, long y, long x) {
    return a->x + n * a->xs_n + y * a->xs_h + x * a->xs_w;
}

/* w is (kh * kw) x c: the taps of every channel, one row per tap. */
void depthwise(const conv_args *a) {
    const long c = a->c;
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        float *restrict out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        const taps t = taps_of(a, oy, ox);
        for (long k = 0; k < c; k++) out[k] = a->b[k];
        for (long ky = t.y0; ky < t.y1; ky++)
            for (long kx = t.x0; kx < t.x1; kx++) {
                const float *restrict in = input_pixel(a, n, t.iy + ky, t.ix + kx);
                const float *restrict tap = a->w + (ky * a->kw + kx) * c;
                for (long k = 0; k < c; k++) out[k] += in[k] * tap[k];
            }
        clamp(out, c, a->lo, a->hi);
    }
}

typedef float v8 __attribute__((vector_size(32))); /* 8 output channels in one register */

/* w is (kh * kw * cin) x c: per tap and input channel, its coefficient for every output channel.
 * Output channels are accumulated 16 at a time in two vector registers (a remainder below 16 in
 * a zero-padded block, written back only where it exists). */
void dense(const conv_args *a) {
    const long c = a->c, cin = a->cin;
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        float *restrict out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        const taps t = taps_of(a, oy, ox);
        for (long k0 = 0; k0 < c; k0 += 16) {
            const long m = c - k0 < 16 ? c - k0 : 16;
            v8 acc0 = {0}, acc1 = {0};
            for (long ky = t.y0; ky < t.y1; ky++)
                for (long kx = t.x0; kx < t.x1; kx++) {
                    const float *in = input_pixel(a, n, t.iy + ky, t.ix + kx);
                    const float *tap = a->w + (ky * a->kw + kx) * cin * c + k0;
                    for (long i = 0; i < cin; i++) {
                        float block[16] = {0};
                        const float *row = tap + i * c;
                        if (m == 16) memcpy(block, row, sizeof block); /* constant size: two vector loads */
                        else memcpy(block, row, m * sizeof(float));
                        v8 w0, w1;
                        memcpy(&w0, block, 32);
                        memcpy(&w1, block + 8, 32);
                        acc0 += in[i] * w0;
                        acc1 += in[i] * w1;
                    }
                }
            float sum[16];
            memcpy(sum, &acc0, 32);
            memcpy(sum + 8, &acc1, 32);
            for (long j = 0; j < m; j++) out[k0 + j] = sum[j] + a->b[k0 + j];
        }
        clamp(out, c, a->lo, a->hi);
    }
}
