/* tightfit kernels: portable C99 over strided views of one caller-owned arena.
 * No malloc, no stdio, no mutable global state: every kernel reads and writes only the arena and
 * the constant weights it is given, so two arenas run two independent inferences. */
#ifndef TF_KERNELS_H
#define TF_KERNELS_H

#include <stdint.h>
#include <stddef.h>

/* Weights and arena on 64-byte boundaries: vector loads then never straddle cache lines. */
#if defined(__GNUC__)
#define TF_ALIGNED __attribute__((aligned(64)))
#else
#define TF_ALIGNED
#endif

/* Offsets, sizes and strides in the step tables: 32 bits (the generator refuses an arena or weights
 * of 2^31 floats or more), which halves the tables a finely split plan holds in flash and memory. */
typedef int32_t tf_int;

/* A logical (N, C, H, W) block of the arena: `off` is its first element (floats from the arena's
 * start) and s* are element strides; any layout (NCHW, NHWC, a window, a tile) is a view. */
typedef struct { tf_int off, n, c, h, w, sn, sc, sh, sw; } tf_view;

enum { TF_ACT_RELU = 1, TF_ACT_LEAKYRELU, TF_ACT_CLIP, TF_ACT_SIGMOID, TF_ACT_TANH,
       TF_ACT_HARDSIGMOID, TF_ACT_HARDSWISH, TF_ACT_SILU,
       TF_ACT_MISH, TF_ACT_GELU, TF_ACT_GELU_TANH, TF_ACT_SOFTPLUS, TF_ACT_ELU, TF_ACT_SELU, /* selu: a alpha, b gamma */
       TF_ACT_SQRT, TF_ACT_EXP, TF_ACT_LOG, TF_ACT_NEG, TF_ACT_ABS, TF_ACT_RECIPROCAL, TF_ACT_ERF };
#define TF_MAX_ACTS 4
/* An activation chain applied in order after a layer (kind 0 ends it). Steps point to one (NULL:
 * none) rather than hold it: a finely tiled plan has thousands of steps and few chains. */
typedef struct { int kind[TF_MAX_ACTS]; float a[TF_MAX_ACTS], b[TF_MAX_ACTS]; } tf_acts;

/* Convolution kinds by weight layout: DENSE (groups 1, dilation 1): panels of 16 output
 * channels, (ceil(C_out/16), kh*kw*C_in, 16), bias padded to the panels; DEPTHWISE: taps
 * (kh*kw) x C; GROUPED: per group (kh*kw*C_in/g) x (C_out/g). */
enum { TF_CONV_DENSE, TF_CONV_DEPTHWISE, TF_CONV_GROUPED };
typedef struct {
    tf_view x, y;            /* the input window (without its zero padding) and the output */
    tf_int w, b;               /* weight and bias: float offsets in the weights */
    int kind;
    tf_int groups, kh, kw, sh, sw, dh, dw, pt, pl; /* pt, pl: zero rows / columns above and left of x */
    float lo, hi;            /* a clamp fused into the kernel (ReLU, ReLU6, Clip) */
    const tf_acts *act;      /* any other activations, after the clamp */
} tf_conv_args;

enum { TF_POOL_MAX, TF_POOL_AVG };
typedef struct {
    tf_view x, y;
    int kind, count_include_pad;
    tf_int kh, kw, sh, sw, dh, dw, pt, pl;  /* pt, pl: padding above and left of the window x */
    tf_int oy0, ox0;                        /* the output region's first row and column */
    tf_int in_h, in_w, pad_t, pad_l, pad_b, pad_r; /* the whole input and the layer's padding (averages) */
    const tf_acts *act;
} tf_pool_args;

enum { TF_GLOBAL_MEAN, TF_GLOBAL_MAX };
/* Mean or max over H x W (TF_STEP_GLOBAL) or over C at each pixel (TF_STEP_CHANNEL_REDUCE). */
typedef struct { tf_view x, y; int kind; const tf_acts *act; } tf_global_args;

typedef struct { tf_view x, y; tf_int w, b, in_features; const tf_acts *act; } tf_gemm_args; /* w: (out, in); b < 0: none */

/* An operand of an elementwise sum or product: a view (a dimension of size 1 broadcast), or a
 * constant of (1, c, h, w) in the weights, its rows and columns from (h0, w0). */
typedef struct { int is_const; tf_view v; tf_int w, c, h, w_, h0, w0; } tf_operand;
#define TF_MAX_OPERANDS 8
/* How operands combine, folded left to right: ((op0 f op1) f op2) ...; PRELU: op1 is the slope;
 * CLIP: op1 the lower bound, op2 the upper. */
enum { TF_ELT_SUM, TF_ELT_PRODUCT, TF_ELT_SUB, TF_ELT_DIV, TF_ELT_POW, TF_ELT_MIN, TF_ELT_MAX, TF_ELT_PRELU, TF_ELT_CLIP };
typedef struct { tf_view y; int fn, count; const tf_operand *op; const tf_acts *act; } tf_eltwise_args; /* op: count */

typedef struct { tf_view x, y; tf_int scale, shift; const tf_acts *act; } tf_affine_args; /* batch norm; scale < 0: copy */
/* (x - mean) / sqrt(var + eps) * scale[c] + bias[c]; CHANNEL_NORM: statistics over C at each pixel
 * (LayerNorm over channels), INSTANCE_NORM: over H x W of each sample and channel. */
typedef struct { tf_view x, y; tf_int scale, bias; float eps; const tf_acts *act; } tf_norm_args;
typedef struct { tf_view x, y; int log; } tf_softmax_args; /* over C at every pixel; log: LogSoftmax */
typedef struct { tf_view x, y; tf_int size; float alpha, beta, bias; } tf_lrn_args;
typedef struct { tf_view y; int count; const tf_view *x; const tf_acts *act; } tf_concat_args; /* x: count views */

enum { TF_PAD_CONSTANT, TF_PAD_EDGE, TF_PAD_REFLECT };
typedef struct { tf_view x, y; int mode; float value; tf_int oy0, ox0, iy0, ix0, in_h, in_w, t, l; } tf_pad_args;

typedef struct { tf_view x, y; tf_int rows, cols; } tf_resize_args; /* rows, cols: int offsets in the index table */
/* y = x in logical order (a reshape when the shapes differ; a transpose is x with permuted strides);
 * x and y may overlap in one buffer when they have the same shape and strides (a window shifted). */
typedef struct { tf_view x, y; } tf_copy_args;
typedef struct { tf_view x, y; tf_int groups; } tf_shuffle_args;

/* The model input arrives by parts: fill rows [h0, h1), columns [w0, w1) and samples [n0, n1) of
 * the (N, C, H, W) input into the view `dst` (its own origin) of the arena. */
typedef int (*tf_input_fn)(void *ctx, long n0, long n1, long h0, long h1, long w0, long w1,
                           float *dst, long sn, long sc, long sh, long sw);
typedef struct { tf_view y; tf_int n0, h0, w0; } tf_input_args;

/* Block moves (slice, split, concatenation along H or W, depth <-> space): x[i] to to[i] for each
 * of `count` pairs of views (negative strides walk backwards), then the activations over y. */
typedef struct { tf_view y; int count; const tf_view *x, *to; const tf_acts *act; } tf_moves_args;

/* Transposed convolution: weight (groups, kh, kw, C_in/g, C_out/g); y's first row and column are
 * padded output places (oy0, ox0) (output place + pad); x's first row and column are input places
 * (iy0, ix0). Input place i adds into padded output places i * s + k * d. */
typedef struct {
    tf_view x, y;
    tf_int w, b, groups, kh, kw, sh, sw, dh, dw, oy0, ox0, iy0, ix0;
    const tf_acts *act;
} tf_deconv_args;

/* Separable interpolation (linear, cubic): output row oy reads rows idx[rows + oy * taps + t] of x
 * with weights wts[row_w + oy * taps + t]; columns likewise. */
typedef struct { tf_view x, y; tf_int taps, rows, cols, row_w, col_w; } tf_interp_args;

enum { TF_STEP_CONV, TF_STEP_POOL, TF_STEP_GLOBAL, TF_STEP_GEMM, TF_STEP_SOFTMAX, TF_STEP_ELTWISE,
       TF_STEP_AFFINE, TF_STEP_LRN, TF_STEP_CONCAT, TF_STEP_PAD, TF_STEP_RESIZE, TF_STEP_COPY,
       TF_STEP_SHUFFLE, TF_STEP_INPUT, TF_STEP_MOVES, TF_STEP_DECONV, TF_STEP_INTERP,
       TF_STEP_CHANNEL_NORM, TF_STEP_INSTANCE_NORM, TF_STEP_CHANNEL_REDUCE };
typedef struct { int kind; const void *args; } tf_step;

/* Runs `count` steps; returns 0, or the input callback's non-zero status. */
int tf_run(float *arena, const float *weights, const int32_t *indices, const tf_step *steps, long count,
           tf_input_fn input, void *ctx);
/* Copies logical elements [first, first + count) of view v (N, C, H, W order) to dst. */
void tf_read(const float *arena, const tf_view *v, long first, long count, float *dst);

#endif
