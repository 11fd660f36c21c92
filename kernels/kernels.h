/* Compute kernels behind one dispatch table, chosen once per process and kept for it: the path
 * UFORM_KERNELS=scalar|avx2|avxvnni|avx512|avx512vnni|avx512bf16|amx|neon|neondot|neoni8mm names when this
 * CPU and build run it, else the fastest one by a fixed rule (kernels_rule): the newest path the CPU runs
 * (amx first, where the CPU has the tiles and the kernel grants them), unless a measured exception for its
 * vendor names a faster one (on Intel CPUs with AVX512-BF16 and no usable AMX, the avx512vnni path, whose
 * F32 FMA GEMM outruns vdpbf16ps there). The rule reads the CPU's vendor and features only, never a timing,
 * so that every process on one machine computes the same bits; kernels_reason says why the path was taken,
 * kernels_amx_state why the tiles are or are not used, and `uform info` prints them.
 *
 * The scalar path defines the numbers: every other path is tested against it, within the tolerances
 * written next to each function below. Every kernel is deterministic: for the same inputs it gives the
 * same bits whatever range of the work a thread is handed (ranges split at KERNEL_GEMM_TILE columns).
 *
 * Conventions: matrices are row-major with explicit strides in elements; weights are BF16 stored
 * `[out, in]` as in checkpoints, and a linear layer computes `x W^T + b`. BF16 values are uint16_t. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "uform.h"

/* GEMM work is split between threads at multiples of this many output columns, so that each column
 * is always computed by the same code whatever the thread count. */
#define KERNEL_GEMM_TILE 64

/* The activation a GEMM applies to x w^T + bias before adding the residual. Each path computes it within
 * 1e-6 |x| + 1e-7 of the exact function (the scalar path with libm's tanhf, erff and expf; the SIMD paths
 * with their own vector exp and erf), well inside the GEMM's tolerance below. */
typedef enum kernel_epilogue {
    KERNEL_EPILOGUE_NONE = 0,
    KERNEL_EPILOGUE_GELU,       /* tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) */
    KERNEL_EPILOGUE_GELU_ERF,   /* exact GELU, PyTorch's nn.GELU() default: 0.5x(1 + erf(x / sqrt 2)) */
    KERNEL_EPILOGUE_GELU_QUICK, /* CLIP's quick_gelu: x sigmoid(1.702x) = x / (1 + exp(-1.702x)) */
} kernel_epilogue_t;

/* y[m, n] = residual[m, n] + epilogue(x[m, k] . w[n, k]^T + bias[n])
 * - x: F32 activations, or BF16 when `x_bf16` is set (then `x` is NULL), row stride `x_stride`;
 * - w: weights packed by the same path's `gemm_pack` (its layout is the path's own business);
 * - bias: F32 [n] or NULL; residual: F32 with row stride `residual_stride`, or NULL; it may be `y`;
 * - y: F32, row stride `y_stride`, never overlapping x.
 * Paths may round F32 activations to BF16 before multiplying (avx512bf16 and amx do), like PyTorch's bf16,
 * and flush denormal products and sums to zero (amx's tiles do).
 * Tolerance against scalar: |y - y_scalar| <= 1e-2 * (|bias| + sum_k |x w|) + 1e-6 per element. */
typedef struct kernel_gemm {
    size_t m, n, k;
    float const *x;
    uint16_t const *x_bf16;
    size_t x_stride;
    void const *w; /* packed */
    float const *bias;
    float const *residual;
    size_t residual_stride;
    float *y;
    size_t y_stride;
    kernel_epilogue_t epilogue;
    /* The I8 GEMM's activations (`gemm_i8`, which reads neither x nor x_bf16): x_u8 [m, x_stride] as
     * `quantize_rows` writes them, with each row's scale and zero point. */
    uint8_t const *x_u8;
    float const *x_scales;
    int32_t const *x_zeros;
} kernel_gemm_t;

/* ---- I8 weights and activations ------------------------------------------------------------------
 * A linear layer with I8 weights computes
 *     y[r, c] = residual + epilogue(S[r, c] * (x_scales[r] * w_scales[c]) + bias[c]),
 *     S[r, c] = sum_k (x_u8[r, k] - x_zeros[r]) * w[c, k]                      (exact, in int32)
 * from weights quantized per output row (kernel_quantize_weights: symmetric, w ~ q * scale) and
 * activations quantized per row on the fly (quantize_rows: asymmetric, x ~ (q - zero) * scale). S is
 * exact in int32 on every path for k <= KERNEL_I8_DEPTH_MAX: |x_u8 - zero| <= 255 and |w| <= 128 bound it
 * by 2^15 k. With unit scales, no bias and no epilogue every path writes the scalar path's bits; otherwise
 * the F32 steps may round differently (an FMA where scalar multiplies then adds, the vector GELUs):
 * |y - y_scalar| <= 1e-5 * (|S x_scale w_scale| + |bias|) + 1e-6, per element (the activation's
 * own tolerance within). */
#define KERNEL_I8_DEPTH_MAX 65536

/* Per output row of a BF16 weight [k]: scale = max|w| / 127, q = round(w / scale) half away from zero
 * (as the I8 output conversion), a zero row all 0 with scale 0, a row holding a NaN or an infinity all 0
 * with scale NaN (so that every output it makes is NaN, as the BF16 weight would make it). The scalar
 * reference; kernels_t.quantize_weights is the path's, bitwise equal to it, so that a checkpoint quantized
 * ahead and a model quantized at load hold the same bytes on every path. */
void kernel_quantize_weights(int8_t *q, float *scale, uint16_t const *w, size_t k);

/* Rotary positions on one head's vector of 64: pairs (i, i + 32) rotated by p * 10000^(-2i/64). The heads
 * of the text towers, and the only width the attention backward pass takes. */
#define KERNEL_HEAD 64

/* The widest head the forward attention takes. */
#define KERNEL_HEAD_MAX 256

/* Attention over a batch of items packed end to end, for one head of `head` values.
 * - q, k, v: F32 rows of `head` at row stride `stride`; item i owns rows [offsets[i], offsets[i + 1]);
 * - out: F32 rows of `head` at row stride `out_stride`; nothing past a row's `head` values is read or
 *   written;
 * - head: the width of every head, 1 to KERNEL_HEAD_MAX (KERNEL_HEAD in the text towers, which the SIMD paths
 *   compile a version of their own for);
 * - causal: row r of an item attends to rows <= r of that item; else to every row of the item;
 * - scale: the scores' factor, 1/sqrt(head) in the towers.
 * The softmax is computed online over tiles of keys (no [L, L] matrix is formed). The SIMD paths keep a block
 * of queries' state on the calling thread's stack: up to 48 KiB of it.
 * Paths may round the products' operands to BF16 (kernel_attention_rounds; avx512bf16 and amx do), as
 * PyTorch's bf16 attention does: q scale (scaled in F32), k, v and the softmax weights exp(score - max),
 * to nearest even; scores, softmax and sums stay F32.
 * Tolerance: 1e-4 relative to max|v| per element against scalar; a path that rounds, 2^-8 relative to
 * max|v| against attention in double over the rounded q scale, k and v (the weights' rounding, 2^-9 of
 * each, is what it leaves).
 * - scratch: NULL, or scratch_bytes of the calling thread's own memory, 64-byte aligned (callers give
 *   kernel_attention_scratch_bytes of their longest item, up to KERNEL_ATTENTION_SCRATCH). A path that
 *   rounds converts the keys and values of an item without a causal mask once into it where they fit,
 *   instead of once for every two blocks of queries; the outputs are the same bits either way. The other
 *   paths never touch it.
 * - bias: NULL, or the head's bias by relative position (MPNet's), finite: bias[r - c] is added, in F32 on
 *   every path (a path that rounds leaves it unrounded), to the scaled score of query row r and key row c,
 *   both counted from the item's first row, before the causal mask and the softmax (the tolerances'
 *   references in double add it too). It is read for r - c from -(rows - 1) to
 *   rows - 1 + KERNEL_ATTENTION_BIAS_LANES - 1 (rows: the item's; the SIMD paths read it for the lanes of a
 *   last block's queries past the item too, and ignore what they read there), so a table for a batch whose
 *   longest item has L rows holds 2 L + KERNEL_ATTENTION_BIAS_LANES - 2 entries, `bias` at its L-th. */
#define KERNEL_ATTENTION_SCRATCH (256u << 10) /* items of up to 1,024 rows at heads of 64 */
#define KERNEL_ATTENTION_BIAS_LANES 16        /* the most queries a path's block holds */
typedef struct kernel_attention {
    float const *q, *k, *v;
    size_t stride;
    float *out;
    size_t out_stride;
    size_t head;
    size_t const *offsets;
    size_t items;
    bool causal;
    float scale;
    void *scratch;
    size_t scratch_bytes;
    float const *bias;
} kernel_attention_t;

/* The scratch an attention that rounds takes for the keys and values of an item of `rows` rows: rows of
 * the head's width rounded up to 16 BF16, round_up(rows, 16) of keys and 2 ceil(rows / 2) of values. */
static inline size_t kernel_attention_scratch_bytes(size_t rows, size_t head) {
    return ((rows + 15) / 16 * 16 + 2 * ((rows + 1) / 2)) * ((head + 15) / 16 * 16) * sizeof(uint16_t);
}

/* ---- Training (F32 throughout: the trainer keeps F32 master weights and computes in F32) ---------- */

/* c[m, n] = (accumulate ? c : 0) + op(a)[m, k] . op(b)[k, n], all F32, row-major:
 * - op(a) is a[m, k] at row stride a_stride, or, when a_transposed, a stored [k, m] (element (i, p) at
 *   a[p * a_stride + i]);
 * - op(b) is b[k, n] at row stride b_stride, or, when b_transposed, b stored [n, k] (element (p, j) at
 *   b[j * b_stride + p]);
 * - c never overlaps a or b.
 * The three products of a linear layer y = x W^T (W [n, k]) are: forward a = x, b = W transposed;
 * dx = dy W: a = dy, b = W; dW += dy^T x: a = dy transposed, b = x, accumulate (kernel_sgemm_linear).
 * Every path sums over k in ascending blocks in its own fixed order; the same path gives the same bits
 * whatever the column range a thread is handed (ranges split at KERNEL_GEMM_TILE). The SIMD paths pack
 * blocks of a and b on the calling thread's stack: up to 140 KiB of it.
 * Tolerance against scalar: |c - c_scalar| <= 1e-5 * sum_p |a b| + 1e-6 per element (plus |c| before
 * the call when accumulating). */
typedef struct kernel_sgemm {
    size_t m, n, k;
    float const *a;
    size_t a_stride;
    bool a_transposed;
    float const *b;
    size_t b_stride;
    bool b_transposed;
    float *c;
    size_t c_stride;
    bool accumulate;
} kernel_sgemm_t;

/* The three products of a linear layer y [m, n] = x [m, k] . W [n, k]^T over dense rows, as sgemm's operands
 * (above). */
typedef enum kernel_linear_product {
    KERNEL_LINEAR_FORWARD, /* y [m, n] = x . W^T: a = x, b = W (transposed) */
    KERNEL_LINEAR_DX,      /* dx [m, k] = dy . W: a = dy, b = W */
    KERNEL_LINEAR_DW,      /* dW [n, k] += dy^T . x: a = dy (transposed), b = x, accumulated */
} kernel_linear_product_t;

/* The sgemm of `product` for a layer of m rows, n outputs and k inputs: c is y, dx or dW. */
static inline kernel_sgemm_t kernel_sgemm_linear(kernel_linear_product_t product, size_t m, size_t n,
                                                 size_t k, float const *a, float const *b, float *c) {
    /* c's rows and columns, the depth, and a's row stride: y [m, n] over k from x [m, k]; dx [m, k] over n
     * from dy [m, n]; dW [n, k] over m from dy [m, n] read transposed. */
    size_t const shapes[][4] = {{m, n, k, k}, {m, k, n, n}, {n, k, m, n}};
    size_t const *shape = shapes[product];
    bool forward = product == KERNEL_LINEAR_FORWARD, dw = product == KERNEL_LINEAR_DW;
    return (kernel_sgemm_t){.m = shape[0],
                            .n = shape[1],
                            .k = shape[2],
                            .a = a,
                            .a_stride = shape[3],
                            .a_transposed = dw,
                            .b = b,
                            .b_stride = k,
                            .b_transposed = forward,
                            .c = c,
                            .c_stride = shape[1],
                            .accumulate = dw};
}

/* The backward pass of one head of kernel_attention_t, for heads of KERNEL_HEAD only (the forward's `head`
 * must be KERNEL_HEAD: every row here holds KERNEL_HEAD values), for the items [item_begin, item_end): with
 * the forward's q, k, v (rotary already applied), its output `out` and the gradient `d_out` of the output,
 * writes (overwrites) d_q, d_k, d_v (F32 rows of KERNEL_HEAD at the same strides as q, k, v) for the
 * rows of those items. It recomputes the probabilities row by row (no [L, L] matrix is formed):
 * P = softmax(scale q k^T) (masked when causal), dV = P^T dO, dS = P * (dO v^T - rowsum(dO * O)),
 * dQ = scale dS k, dK = scale dS^T q. Items are independent, so threads split them freely. The forward
 * it differentiates has no bias (kernel_attention_t.bias NULL).
 * Tolerance against scalar: 1e-4 relative to the largest |d| of d_q, d_k and d_v over the same item (d_q
 * and d_k of an item of one row are exactly 0 in exact arithmetic, and only rounding noise on every path). */
typedef struct kernel_attention_backward {
    float const *q, *k, *v;
    size_t stride;
    float const *out, *d_out;
    size_t out_stride;
    float *d_q, *d_k, *d_v;
    size_t const *offsets;
    size_t items;
    bool causal;
    float scale;
} kernel_attention_backward_t;

/* Zeroes d_k and d_v of the rows [first, end) of one item: every path then accumulates them. */
static inline void kernel_attention_backward_clear(kernel_attention_backward_t const *attention, size_t first,
                                                   size_t end) {
    for (size_t row = first; row < end; ++row) {
        memset(attention->d_k + row * attention->stride, 0, KERNEL_HEAD * sizeof(float));
        memset(attention->d_v + row * attention->stride, 0, KERNEL_HEAD * sizeof(float));
    }
}

typedef struct kernels {
    /* "scalar", "avx2", "avxvnni" (avx2 with AVX-VNNI's 256-bit I8 GEMM), "avx512", "avx512vnni" (avx512 with
     * AVX512-VNNI's I8 GEMM), "avx512bf16" (with avx512vnni's I8 GEMM: CPUs with AVX512-BF16 have
     * AVX512-VNNI), "amx" (avx512bf16's other kernels with its GEMM and I8 GEMM on AMX's tiles, where Linux
     * grants them: kernels_amx_state), "neon" (every AArch64 CPU), "neondot" (neon with the dot product's I8
     * GEMM, SDOT) or "neoni8mm" (neondot with the I8 matrix multiply's, SMMLA) */
    char const *name;

    /* GEMM over output columns [n_begin, n_end), n_begin a multiple of KERNEL_GEMM_TILE. */
    void (*gemm)(kernel_gemm_t const *gemm, size_t n_begin, size_t n_end);
    /* Bytes `gemm_pack` writes for a [n, k] weight, and the packing itself (any alignment of `w`;
     * `packed` 64-byte aligned). */
    size_t (*gemm_packed_size)(size_t n, size_t k);
    void (*gemm_pack)(void *packed, uint16_t const *w, size_t n, size_t k);

    /* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of n (strides in elements).
     * y may be x. Tolerance: 1e-5 relative. */
    void (*rmsnorm)(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                    size_t rows, size_t n, float eps);

    /* y[r] = (x[r] - mean) / sqrt(var + eps) * weight + bias, for `rows` rows of n (strides in elements),
     * with the row's mean and biased variance computed as PyTorch's nn.LayerNorm does, in two passes: the
     * mean, then var = mean((x - mean)^2) (both summed in double on every path). bias may be NULL (none); y
     * may be x. Tolerance: 1e-5 relative to |(x - mean) / sqrt(var + eps) * weight| + |bias|, per element
     * (the output itself may cancel to far less). */
    void (*layernorm)(float *y, size_t y_stride, float const *x, size_t x_stride, float const *weight,
                      float const *bias, size_t rows, size_t n, float eps);

    /* Rotates `heads` consecutive head vectors of 64 in place, at `position`. Tolerance: 1e-5 absolute
     * for |x| <= 1 (angles are computed in double, then rounded to F32, on every path). */
    void (*rope)(float *x, size_t heads, size_t position);

    /* One head of attention over every item of the batch. */
    void (*attention)(kernel_attention_t const *attention, size_t item_begin, size_t item_end);
    /* The path's attention in F32: `attention` itself, or where `attention` rounds its products' operands to
     * BF16 (kernel_attention_t, kernel_attention_rounds) the F32 one beside it. The training forward takes
     * it, since its backward pass recomputes the attention in F32. */
    void (*attention_f32)(kernel_attention_t const *attention, size_t item_begin, size_t item_end);

    /* In place: x = softmax(x) over n values, computed as exp(x - max) / sum. Tolerance 1e-6 absolute. */
    void (*softmax)(float *x, size_t n);

    /* Scales x to unit L2 norm (a zero vector stays zero). Tolerance 1e-6 relative. */
    void (*normalize)(float *x, size_t n);

    /* Writes n F32 values as `scalar`: BF16 and F16 round to nearest even; I8 is per row with
     * scale = max|x| / 127 (0 for a zero row) and q = round(x / scale) half away from zero, the scale
     * stored in *scale. Bitwise equal to scalar on every path. */
    void (*convert)(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale);

    /* BF16 -> F32 and F32 -> BF16 (round to nearest even, NaN kept quiet) of n values. Exact. */
    void (*bf16_to_f32)(float *out, uint16_t const *x, size_t n);
    void (*f32_to_bf16)(uint16_t *out, float const *x, size_t n);

    /* ---- I8 weights (see kernel_gemm_t) ---- */

    /* kernel_quantize_weights, bitwise: a row of a BF16 weight quantized at a model's load. */
    void (*quantize_weights)(int8_t *q, float *scale, uint16_t const *w, size_t k);

    /* Activations per row, asymmetric, for gemm_i8: with lo = min(0, min x) and hi = max(0, max x) over
     * the row's k values, inv = 255 / (hi - lo), zero = rint(-lo inv), q = clamp(rint(x inv) + zero, 0, 255)
     * (rint: to nearest even), scale = (hi - lo) / 255. A row of zeros has q, zero and scale 0; a row
     * holding a NaN or an infinity has q and zero 0 and scale NaN, so that its outputs are NaN as the
     * BF16 GEMM's would be. q [rows, q_stride] takes k values per row. Bitwise equal to scalar on every
     * path. */
    void (*quantize_rows)(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                          size_t x_stride, size_t rows, size_t k);

    /* The I8 GEMM over output columns [n_begin, n_end), n_begin a multiple of KERNEL_GEMM_TILE, with
     * gemm->w packed by gemm_i8_pack and k <= KERNEL_I8_DEPTH_MAX. */
    void (*gemm_i8)(kernel_gemm_t const *gemm, size_t n_begin, size_t n_end);
    /* Bytes gemm_i8_pack writes for an I8 weight [n, k] with its n scales, and the packing itself (any
     * alignment of w and scales; `packed` 64-byte aligned). */
    size_t (*gemm_i8_packed_size)(size_t n, size_t k);
    void (*gemm_i8_pack)(void *packed, int8_t const *w, float const *scales, size_t n, size_t k);

    /* ---- Training ---- */

    /* F32 GEMM over output columns [n_begin, n_end), n_begin a multiple of KERNEL_GEMM_TILE. */
    void (*sgemm)(kernel_sgemm_t const *sgemm, size_t n_begin, size_t n_end);

    /* The backward pass of rmsnorm over `rows` rows of n, for y = x / r * weight with
     * r = sqrt(mean(x^2) + eps): dx = (weight * dy) / r - x * sum(weight * dy * x) / (n * r^3), and
     * d_weight[j] += sum over the rows of dy[j] * x[j] / r (accumulated, rows in ascending order).
     * dx may be dy. Tolerance: 1e-5 relative to the largest |weight * dy| / r of the row (dx itself may
     * cancel to far less); d_weight 1e-5 relative to its sum of |terms| (|d_weight| before the call plus
     * sum |dy x / r|). */
    void (*rmsnorm_backward)(float *dx, size_t dx_stride, float *d_weight, float const *dy, size_t dy_stride,
                             float const *x, size_t x_stride, float const *weight, size_t rows, size_t n,
                             float eps);

    /* dx = dy * gelu'(x) for the tanh GELU above, over n values; dx may be dy. Tolerance 1e-6 relative to
     * |dy| (|gelu'| <= 1.13; gelu' itself crosses 0 near x = -0.75). */
    void (*gelu_backward)(float *dx, float const *dy, float const *x, size_t n);

    /* Forward GELU in place over n values (the training forward keeps the pre-activation): on the scalar
     * path bitwise the scalar GEMM epilogue's. Tolerance 1e-6 relative to |x|, plus 1e-7. */
    void (*gelu)(float *x, size_t n);

    /* The transpose of `rope`: rotates `heads` head vectors of 64 in place by -angle at `position`
     * (the gradient of a rotated vector back to the unrotated one). Same tolerance as rope. */
    void (*rope_backward)(float *x, size_t heads, size_t position);

    /* One head of the attention backward pass, over items [item_begin, item_end). */
    void (*attention_backward)(kernel_attention_backward_t const *attention, size_t item_begin,
                               size_t item_end);
} kernels_t;

/* Whether a path's attention rounds its products' operands to BF16 (kernel_attention_t): it is not the
 * path's F32 attention. */
static inline bool kernel_attention_rounds(kernels_t const *path) {
    return path->attention != path->attention_f32;
}

/* The table this process uses: chosen once, on first use (thread-safe). */
kernels_t const *kernels_active(void);

/* Why kernels_active took its table: "UFORM_KERNELS" when the variable named it, else the rule's reason
 * (with the refused name appended when UFORM_KERNELS named a path this CPU or build does not run). A static
 * string; chooses the table first when no call has. */
char const *kernels_reason(void);

/* The CPU as kernels_rule reads it: its vendor, and the names of the built paths it runs that
 * kernels_active may choose, newest first (the build's order), NULL-terminated. */
typedef enum kernels_vendor {
    KERNELS_VENDOR_OTHER = 0,
    KERNELS_VENDOR_INTEL,
    KERNELS_VENDOR_AMD,
} kernels_vendor_t;

typedef struct kernels_cpu {
    kernels_vendor_t vendor;
    char const *const *runs;
} kernels_cpu_t;

/* This CPU's vendor, from CPUID (KERNELS_VENDOR_OTHER off x86-64). */
kernels_vendor_t kernels_cpu_vendor(void);

/* The path kernels_active takes on `cpu` without UFORM_KERNELS, one of cpu->runs (NULL when it is empty),
 * and in *reason why (a static string): the first of cpu->runs, unless a measured exception for the
 * vendor names a faster one the CPU runs. A pure function of `cpu`, for tests over CPUs this one is not. */
char const *kernels_rule(kernels_cpu_t const *cpu, char const **reason);

/* A path by name, when this CPU and build can run it; NULL otherwise (the scalar path never is). For tests
 * that compare each path against scalar, and benchmarks. The names are kernels_t.name's, and
 * "avxvnni_evex": the avxvnni path's I8 GEMM compiled a second time for AVX512-VNNI with AVX512-VL (the same
 * instruction, EVEX-encoded), as a path whose other kernels are avx512's, so that CPUs with AVX512-VNNI but
 * without AVX-VNNI check that code (tests/kernels/test_gemm_i8.c); kernels_active never chooses it, nor
 * does UFORM_KERNELS name it. */
kernels_t const *kernels_named(char const *name);

/* The scalar path, which every build and CPU runs. */
kernels_t const *kernels_scalar(void);

/* The amx path (kernels/gemm_amx.c) needs the CPU's tiles, the OS's saving of them (XCR0) and Linux's
 * permission for this process (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once before any
 * tile instruction); each thread configures its tiles on its first GEMM and releases them when it ends. Its
 * GEMMs are also built over an emulation of the tile instructions, which tests/kernels/test_gemm_amx.c
 * compares with scalar on CPUs without AMX.
 * Why the amx path runs or not, for people to read: "amx: enabled", "amx: not on this CPU (...)" naming
 * what the CPU lacks, "amx: not enabled by the OS (...)", or "amx: refused by the kernel (errno N: ...)"
 * when Linux denied this process the tiles (then kernels_active falls back to the next path). The first
 * call, or the first choice of a path, asks the kernel for them (once per process); thread-safe. A static
 * string. */
char const *kernels_amx_state(void);

/* Scalar helpers every path shares. */

/* quantize_rows' numbers of one row from its lo = min(0, min x) and hi = max(0, max x), and whether every
 * value was finite: false for a row written as zeros (its scale 0, or NaN when not finite); else the
 * multiplier inv, the zero point and the scale. */
static inline bool kernel_quantize_range(float lo, float hi, bool finite, float *inv, int32_t *zero,
                                         float *scale) {
    *inv = 255.0f / (hi - lo);
    *zero = 0;
    *scale = finite ? 0.0f : __builtin_nanf("");
    if (!finite || !(*inv <= 3.40282347e+38f)) return false; /* a range too small to divide by */
    *zero = (int32_t)__builtin_rintf(-lo * *inv);
    *scale = (hi - lo) / 255.0f;
    return true;
}

/* One value of a row quantize_rows writes: clamp(rint(x inv) + zero, 0, 255). */
static inline uint8_t kernel_quantize_value(float x, float inv, int32_t zero) {
    int32_t value = (int32_t)__builtin_rintf(x * inv) + zero;
    return (uint8_t)(value < 0 ? 0 : value > 255 ? 255 : value);
}
static inline float bf16_to_f32(uint16_t value) {
    union {
        uint32_t bits;
        float value;
    } converted = {.bits = (uint32_t)value << 16};
    return converted.value;
}

/* kernel_quantize_weights' steps, shared by every path's: the scale from the largest of a row's BF16 bits
 * without their sign (magnitudes order as those integers do, and every pattern from the infinity's up is an
 * infinity or a NaN), false where the row is all 0 (a zero row, scale 0; a NaN or an infinity, scale NaN);
 * and one weight's round(w / divisor) half away from zero, clamped to [-127, 127], by integer steps (the
 * fraction ratio - trunc(ratio) is exact for |ratio| < 2^31). */
static inline bool kernel_weights_scale(uint16_t largest_bits, float *scale) {
    bool finite = largest_bits < 0x7f80u;
    *scale = finite ? bf16_to_f32(largest_bits) / 127.0f : __builtin_nanf("");
    return finite && largest_bits != 0;
}

static inline int8_t kernel_quantize_weight(uint16_t w, float divisor) {
    float ratio = bf16_to_f32(w) / divisor;
    int32_t whole = (int32_t)ratio;
    float fraction = ratio - (float)whole;
    int32_t value = whole + (fraction >= 0.5f) - (fraction <= -0.5f);
    return (int8_t)(value < -127 ? -127 : value > 127 ? 127 : value);
}

static inline uint16_t f32_to_bf16(float value) {
    union {
        float value;
        uint32_t bits;
    } converted = {.value = value};
    uint32_t bits = converted.bits;
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}
