/* Our own kernels over channels-last views (channels unit-stride; rows, columns and samples any
 * stride), built and loaded by ops/native.py:
 * - convolutions with bias and a clamp (ReLU, ReLU6, Clip) fused: depthwise (one filter per
 *   channel) and dense (groups 1, 1x1 included). oneDNN costs about 20 us a call besides its
 *   arithmetic, and torch's matrix product reaches 30-45 GMAC/s on a tile's small products where
 *   a register-blocked kernel reaches 50-120;
 * - max and average pooling, and a per-channel scale and shift, with the clamp fused;
 * - a copy (clamped too), a move (overlapping), a channel shuffle and a sum of such views;
 * - run_calls: a run of such calls, made by one call from Python (the executor batches a plan's
 *   consecutive native steps: no Python between them). */
#include <string.h>

typedef struct {
    const float *x; float *y; const float *w; const float *b;
    long n, c, ih, iw, oh, ow;               /* c: output channels */
    long cin;                                /* input channels (dense) */
    long xs_n, xs_h, xs_w, ys_n, ys_h, ys_w; /* element strides; channels are unit-stride */
    long kh, kw, sh, sw, pt, pl;             /* kernel, stride, top and left zero padding */
    float lo, hi;                            /* output clamp */
    long xs_c;                               /* input channel stride (copy; 1 elsewhere) */
    long ws_n, ws_h, ws_w;                   /* the second operand's strides (add) */
    long groups;                             /* channel groups (shuffle) */
} conv_args;

typedef float v16 __attribute__((vector_size(64)));
typedef int i16 __attribute__((vector_size(64)));

/* m <= 16 floats; a constant 16 is one vector load or store. */
static inline v16 load(const float *p, long m) {
    v16 v = {0};
    if (m == 16) memcpy(&v, p, 64); else memcpy(&v, p, m * sizeof(float));
    return v;
}

static inline void store(float *p, v16 v, long m) {
    if (m == 16) memcpy(p, &v, 64); else memcpy(p, &v, m * sizeof(float));
}

static inline v16 clamp16(v16 v, v16 lo, v16 hi) { /* NaN passes through, as torch's clamp */
    const i16 below = v < lo, above = v > hi;
    const i16 r = ((i16)lo & below) | ((i16)v & ~below);
    return (v16)(((i16)hi & above) | (r & ~above));
}

static void clamp(float *restrict out, long c, float lo, float hi) {
    for (long k = 0; k < c; k++) {
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

/* Channels [k0, k0 + 16) of one output row; with `three`, a 3x3 kernel whose interior pixels
 * take constant taps (the weights held in registers). */
static inline __attribute__((always_inline)) void dw_row(const conv_args *a, long n, long oy, long k0, int three) {
    const long m = 16;
    const long c = a->c;
    const v16 lo = a->lo - (v16){0}, hi = a->hi - (v16){0}, bias = load(a->b + k0, m);
    v16 w[9];
    if (three) for (int t = 0; t < 9; t++) w[t] = load(a->w + t * c + k0, m);
    for (long ox = 0; ox < a->ow; ox++) {
        const taps t = taps_of(a, oy, ox);
        const float *base = input_pixel(a, n, t.iy, t.ix) + k0;
        v16 acc = bias;
        if (three && t.y0 == 0 && t.x0 == 0 && t.y1 == 3 && t.x1 == 3) {
            for (int ky = 0; ky < 3; ky++)
                for (int kx = 0; kx < 3; kx++) acc += load(base + ky * a->xs_h + kx * a->xs_w, m) * w[ky * 3 + kx];
        } else {
            for (long ky = t.y0; ky < t.y1; ky++)
                for (long kx = t.x0; kx < t.x1; kx++)
                    acc += load(base + ky * a->xs_h + kx * a->xs_w, m) * load(a->w + (ky * a->kw + kx) * c + k0, m);
        }
        store(a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w + k0, clamp16(acc, lo, hi), m);
    }
}

/* One output row of channels [k0, c), fewer than 16: per pixel, a channel loop per tap. */
static void dw_tail(const conv_args *a, long n, long oy, long k0) {
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
        clamp(out + k0, c - k0, a->lo, a->hi);
    }
}

/* w is (kh * kw) x c: the taps of every channel, one row per tap. Row by row, 16 channels at a
 * time, so a 3x3 block's weights stay in registers along the row. */
void depthwise(const conv_args *a) {
    const int three = a->kh == 3 && a->kw == 3;
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long k0 = 0; k0 < a->c; k0 += 16) {
        if (a->c - k0 < 16) dw_tail(a, n, oy, k0);
        else if (three) dw_row(a, n, oy, k0, 1);
        else dw_row(a, n, oy, k0, 0);
    }
}

/* dense: w is panels of 16 output channels, (ceil(c / 16), kh * kw * cin, 16), zero padded; b is
 * padded to the panels. PIXELS output pixels with the same taps (xp: each one's input pixel at
 * tap (0, 0), which may lie in the padding; yp: its output) times two panels are accumulated in
 * registers, one broadcast input value and two weight vectors per tap and input channel. */
#define PIXELS 6

static inline __attribute__((always_inline)) void dense_block(
        const conv_args *a, const float **xp, float **yp, int r, int two, int pointwise, long j, const taps *t) {
    const long cin = a->cin, rows = a->kh * a->kw * cin;
    const float *w0 = a->w + j * rows * 16, *w1 = w0 + rows * 16;
    v16 acc0[PIXELS], acc1[PIXELS];
    const v16 b0 = load(a->b + j * 16, 16), b1 = two ? load(a->b + j * 16 + 16, 16) : b0;
    for (int i = 0; i < r; i++) { acc0[i] = b0; acc1[i] = b1; }
    for (long ky = pointwise ? 0 : t->y0; ky < (pointwise ? 1 : t->y1); ky++)
    for (long kx = pointwise ? 0 : t->x0; kx < (pointwise ? 1 : t->x1); kx++) {
        const long off = ky * a->xs_h + kx * a->xs_w, row = (ky * a->kw + kx) * cin;
        for (long k = 0; k < cin; k++) {
            v16 u0, u1;
            memcpy(&u0, w0 + (row + k) * 16, 64);
            if (two) memcpy(&u1, w1 + (row + k) * 16, 64);
            for (int i = 0; i < r; i++) {
                const float xv = xp[i][off + k];
                acc0[i] += xv * u0;
                if (two) acc1[i] += xv * u1;
            }
        }
    }
    const v16 lo = a->lo - (v16){0}, hi = a->hi - (v16){0};
    const long left = a->c - j * 16, m0 = left < 16 ? left : 16, m1 = left - 16 < 16 ? left - 16 : 16;
    for (int i = 0; i < r; i++) {
        store(yp[i] + j * 16, clamp16(acc0[i], lo, hi), m0);
        if (two) store(yp[i] + j * 16 + 16, clamp16(acc1[i], lo, hi), m1);
    }
}

static void dense_pixels(const conv_args *a, const float **xp, float **yp, int r, const taps *t, long j0, long j1) {
    const int pointwise = a->kh == 1 && a->kw == 1 && t->y0 == 0 && t->y1 == 1 && t->x0 == 0 && t->x1 == 1; /* not in the padding */
    for (long j = j0; j < j1; j += 2) {
        const int two = j + 1 < j1;
        switch ((r * 2 + two) * 2 + pointwise) { /* each block shape compiled apart: constant loop bounds */
#define BLOCK(n) \
        case (n * 2) * 2: dense_block(a, xp, yp, n, 0, 0, j, t); break; \
        case (n * 2 + 1) * 2: dense_block(a, xp, yp, n, 1, 0, j, t); break; \
        case (n * 2) * 2 + 1: dense_block(a, xp, yp, n, 0, 1, j, t); break; \
        case (n * 2 + 1) * 2 + 1: dense_block(a, xp, yp, n, 1, 1, j, t); break;
        BLOCK(1) BLOCK(2) BLOCK(3) BLOCK(4) BLOCK(5) BLOCK(6)
        }
    }
}

/* Weight bytes of the panels one pass over the pixels uses: they stay in L2 while every pixel
 * reads them (one pass over all panels would read a large layer's whole weight from memory again
 * for every PIXELS pixels: 3x3 512->512 on 7x7, 9.4 MB, nine times). */
#define PASS_BYTES (256 * 1024)

/* Output pixels in order, PIXELS at a time while their taps are the same (interior pixels), in
 * passes over a few panels of output channels each. */
void dense(const conv_args *a) {
    const float *xp[PIXELS];
    float *yp[PIXELS];
    const long panels = (a->c + 15) / 16, panel_bytes = a->kh * a->kw * a->cin * 16 * (long)sizeof(float);
    const long fit = PASS_BYTES / panel_bytes, chunk = fit < 2 ? 2 : fit - fit % 2;
    for (long j0 = 0; j0 < panels; j0 += chunk) {
        const long j1 = j0 + chunk < panels ? j0 + chunk : panels;
        taps t0 = {0};
        int r = 0;
        for (long n = 0; n < a->n; n++)
        for (long oy = 0; oy < a->oh; oy++)
        for (long ox = 0; ox < a->ow; ox++) {
            const taps t = taps_of(a, oy, ox);
            if (r && (r == PIXELS || t.x0 != t0.x0 || t.x1 != t0.x1 || t.y0 != t0.y0 || t.y1 != t0.y1)) {
                dense_pixels(a, xp, yp, r, &t0, j0, j1);
                r = 0;
            }
            t0 = t;
            xp[r] = input_pixel(a, n, t.iy, t.ix);
            yp[r++] = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        }
        if (r) dense_pixels(a, xp, yp, r, &t0, j0, j1);
    }
}

/* y = x over n x oh x ow pixels of c channels (x's channels xs_c apart: an NCHW input too). */
void copy(const conv_args *a) {
    const long bytes = a->c * sizeof(float);
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++) {
        const float *in = a->x + n * a->xs_n + oy * a->xs_h;
        float *out = a->y + n * a->ys_n + oy * a->ys_h;
        if (a->xs_c != 1)
            for (long ox = 0; ox < a->ow; ox++)
                for (long k = 0; k < a->c; k++) out[ox * a->ys_w + k] = in[ox * a->xs_w + k * a->xs_c];
        else if (a->xs_w == a->c && a->ys_w == a->c) memcpy(out, in, bytes * a->ow);
        else for (long ox = 0; ox < a->ow; ox++) memcpy(out + ox * a->ys_w, in + ox * a->xs_w, bytes);
    }
}

/* copy, then the clamp (a concatenation's part with its ReLU fused). */
void copy_clamp(const conv_args *a) {
    copy(a);
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) clamp(a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w, a->c, a->lo, a->hi);
}

/* Max pooling (w NULL) or average pooling (w: per output pixel of the view, oh x ow, the inverse
 * of its divisor) over the taps of each output pixel that read the input view (padding and
 * ceil-mode overhang never count), then the clamp; 16 channels at a time. A NaN tap gives NaN, as
 * torch's maximum does. */
void pool(const conv_args *a) {
    const v16 lo = a->lo - (v16){0}, hi = a->hi - (v16){0}, none = -__builtin_inff() - (v16){0};
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        const taps t = taps_of(a, oy, ox);
        const float *base = input_pixel(a, n, t.iy, t.ix);
        float *out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        for (long k0 = 0; k0 < a->c; k0 += 16) {
            const long m = a->c - k0 < 16 ? a->c - k0 : 16;
            v16 acc = a->w ? (v16){0} : none;
            for (long ky = t.y0; ky < t.y1; ky++)
                for (long kx = t.x0; kx < t.x1; kx++) {
                    const v16 v = load(base + ky * a->xs_h + kx * a->xs_w + k0, m);
                    if (a->w) {
                        acc += v;
                    } else {
                        const i16 take = (v > acc) | (v != v);
                        acc = (v16)(((i16)v & take) | ((i16)acc & ~take));
                    }
                }
            if (a->w) acc *= a->w[oy * a->ow + ox];
            store(out + k0, clamp16(acc, lo, hi), m);
        }
    }
}

/* y = x where the two overlap within one buffer (the same strides: y is x moved): pixels in
 * the order of their addresses, upwards when y lies below x, so every one is read before it is
 * overwritten. */
void move(const conv_args *a) {
    const long bytes = a->c * sizeof(float), pixels = a->n * a->oh * a->ow;
    const int up = a->y < a->x;
    for (long i = 0; i < pixels; i++) {
        const long p = up ? i : pixels - 1 - i, ox = p % a->ow, oy = p / a->ow % a->oh, n = p / (a->ow * a->oh);
        memmove(a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w, a->x + n * a->xs_n + oy * a->xs_h + ox * a->xs_w, bytes);
    }
}

/* y = x with its channels shuffled over n x oh x ow pixels: y's channel j * groups + i is x's
 * channel i * (c / groups) + j (ShuffleNet's reshape, transpose, reshape). */
void shuffle(const conv_args *a) {
    const long g = a->groups, per = a->c / g;
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        const float *in = a->x + n * a->xs_n + oy * a->xs_h + ox * a->xs_w;
        float *out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        for (long i = 0; i < g; i++)
            for (long j = 0; j < per; j++) out[j * g + i] = in[i * per + j];
    }
}

/* y = clamp(x * w + b), w and b one value per channel (an inference batch normalization, its
 * ReLU fused), over n x oh x ow pixels of c channels; y may be x exactly (in place). */
void scale_shift(const conv_args *a) {
    const v16 lo = a->lo - (v16){0}, hi = a->hi - (v16){0};
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        const float *x = a->x + n * a->xs_n + oy * a->xs_h + ox * a->xs_w;
        float *y = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        for (long k0 = 0; k0 < a->c; k0 += 16) {
            const long m = a->c - k0 < 16 ? a->c - k0 : 16;
            store(y + k0, clamp16(load(x + k0, m) * load(a->w + k0, m) + load(a->b + k0, m), lo, hi), m);
        }
    }
}

/* y = clamp(x + w) over n x oh x ow pixels of c channels. y may be x or w exactly (in place). */
void add(const conv_args *a) {
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        const float *x = a->x + n * a->xs_n + oy * a->xs_h + ox * a->xs_w;
        const float *w = a->w + n * a->ws_n + oy * a->ws_h + ox * a->ws_w;
        float *y = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        for (long k = 0; k < a->c; k++) y[k] = x[k] + w[k];
        clamp(y, a->c, a->lo, a->hi);
    }
}

typedef struct { void (*kernel)(const conv_args *); const conv_args *args; } call;

void run_calls(const call *calls, long n) {
    for (long i = 0; i < n; i++) calls[i].kernel(calls[i].args);
}
