/* Depthwise convolution (one filter per channel) over channels-last views, bias and a clamp
 * (ReLU, ReLU6, Clip) fused. oneDNN costs about 20 us a call besides its arithmetic; a band of
 * a few rows has less arithmetic than that. Built and loaded by ops/native.py. */
typedef struct {
    const float *x; float *y; const float *w; const float *b;
    long n, c, ih, iw, oh, ow;
    long xs_n, xs_h, xs_w, ys_n, ys_h, ys_w; /* element strides; channels are unit-stride */
    long kh, kw, sh, sw, pt, pl;             /* kernel, stride, top and left zero padding */
    float lo, hi;                            /* output clamp */
} dw_args;

/* w is (kh * kw) x c: the taps of every channel, one row per tap. */
void depthwise(const dw_args *a) {
    const long c = a->c;
    for (long n = 0; n < a->n; n++)
    for (long oy = 0; oy < a->oh; oy++)
    for (long ox = 0; ox < a->ow; ox++) {
        float *restrict out = a->y + n * a->ys_n + oy * a->ys_h + ox * a->ys_w;
        for (long k = 0; k < c; k++) out[k] = a->b[k];
        for (long ky = 0; ky < a->kh; ky++) {
            long iy = oy * a->sh + ky - a->pt;
            if (iy < 0 || iy >= a->ih) continue;
            for (long kx = 0; kx < a->kw; kx++) {
                long ix = ox * a->sw + kx - a->pl;
                if (ix < 0 || ix >= a->iw) continue;
                const float *restrict in = a->x + n * a->xs_n + iy * a->xs_h + ix * a->xs_w;
                const float *restrict tap = a->w + (ky * a->kw + kx) * c;
                for (long k = 0; k < c; k++) out[k] += in[k] * tap[k];
            }
        }
        const float lo = a->lo, hi = a->hi;
        for (long k = 0; k < c; k++) { /* NaN passes through, as torch's clamp */
            float v = out[k];
            v = v < lo ? lo : v;
            out[k] = v > hi ? hi : v;
        }
    }
}
