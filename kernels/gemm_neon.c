/* BF16-weight GEMM with NEON F32 FMAs (baseline ARMv8-A Advanced SIMD): weights are widened to F32 on the
 * fly (a BF16 is the high half of an F32: one SHLL by 16), activations stay F32.
 *
 * Blocking, for y[m, n] = x[m, k] . w[n, k]^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 24 q-register accumulators over a whole depth block (FMA
 *     latency 4 at 2 to 4 per cycle needs 8 to 16 independent chains), leaving 8 of the 32 registers for
 *     the weights of one k (two loaded, four widened) and the activations of one k (two);
 *   - the activations of the tile's rows over one depth block are copied transposed into `a_block`
 *     [DEPTH][8] F32 (16 KiB, in L1): the 6 rows of one k are two vector loads, each row then multiplied
 *     by element (FMLA v.s[lane]); scalar broadcasts would need 6 registers and spill accumulators. The
 *     block is reused by every tile of the column block;
 *   - the packed weights of a column block (up to BLOCK_BYTES) stream through the tiles of each row
 *     block in one sequential run; wide blocks copy each row of x fewer times.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "math_neon.h"
#include "paths.h"

enum {
    ROWS = 6,              /* rows of x per tile */
    ROW_LANES = 8,         /* a_block values per k: rows 0-3, rows 4-5, two lanes unused */
    COLUMNS = 16,          /* outputs per tile row */
    VECTORS = COLUMNS / 4, /* q registers of F32 per tile row */
    DEPTH = 512,           /* k values per depth block */
    BLOCK_MAX = 1024,      /* columns per column block at most */
};

#define BLOCK_BYTES (4u * 1024u * 1024u) /* packed weights per column block at most */

/* ---- Packing ----------------------------------------------------------------------------------- */

/* For each depth block of DEPTH k values (the last one shorter), for each panel of COLUMNS columns:
 * [depth][COLUMNS] BF16, lane c of row k holding w[c0 + c][k], so that two loads and four SHLLs give a
 * row of the panel as four vectors of F32. Columns past n are zero. The panels of one depth block follow
 * each other, so that the tiles of a row block read one sequential stream. */
static size_t panels_of(size_t n) {
    return (n + COLUMNS - 1) / COLUMNS;
}

/* The panel of `column` in the depth block at k0, of `depth` rows, in a packed [n, k]. */
static uint16_t const *panel_at(uint16_t const *packed, size_t n, size_t k0, size_t depth, size_t column) {
    return packed + (k0 * panels_of(n) + column / COLUMNS * depth) * COLUMNS;
}

size_t kernel_gemm_packed_size_neon(size_t n, size_t k) {
    return panels_of(n) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_neon(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint16_t *out = packed;
    for (size_t k0 = 0; k0 < k; k0 += DEPTH) {
        size_t depth = k - k0 < DEPTH ? k - k0 : DEPTH;
        for (size_t panel = 0; panel < panels_of(n); ++panel)
            for (size_t i = k0; i < k0 + depth; ++i)
                for (size_t lane = 0; lane < COLUMNS; ++lane, ++out) {
                    size_t column = panel * COLUMNS + lane;
                    *out = column < n ? w[column * k + i] : 0u;
                }
    }
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* v = from[0, count) as vectors of F32, zero past count (count <= COLUMNS): NEON has no masked loads. */
static inline void load_columns(float32x4_t v[VECTORS], float const *from, size_t count) {
    float padded[COLUMNS];
    if (count < COLUMNS) {
        memset(padded, 0, sizeof padded);
        memcpy(padded, from, count * sizeof(float));
        from = padded;
    }
#pragma GCC unroll 4
    for (size_t i = 0; i < VECTORS; ++i)
        v[i] = vld1q_f32(from + 4 * i);
}

/* to[0, count) = the first count lanes of v (count <= COLUMNS). */
static inline void store_columns(float *to, size_t count, float32x4_t const v[VECTORS]) {
    float padded[COLUMNS];
    float *into = count < COLUMNS ? padded : to;
#pragma GCC unroll 4
    for (size_t i = 0; i < VECTORS; ++i)
        vst1q_f32(into + 4 * i, v[i]);
    if (count < COLUMNS) memcpy(to, padded, count * sizeof(float));
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* A BF16 vector widened to F32: the 4 low halves, or the 4 high halves. */
static inline float32x4_t widen_low(uint16x8_t halves) {
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(halves), 16));
}

static inline float32x4_t widen_high(uint16x8_t halves) {
    return vreinterpretq_f32_u32(vshll_high_n_u16(halves, 16));
}

/* sum[r][v] += w * x[r] for the tile's rows, x[r] being lane r of x_low, then lane r - 4 of x_high
 * (lane numbers are immediates: one line per row). */
static inline __attribute__((always_inline)) void fma_rows(size_t rows, float32x4_t sum[ROWS][VECTORS],
                                                           size_t v, float32x4_t w, float32x4_t x_low,
                                                           float32x4_t x_high) {
    sum[0][v] = vfmaq_laneq_f32(sum[0][v], w, x_low, 0);
    if (rows > 1) sum[1][v] = vfmaq_laneq_f32(sum[1][v], w, x_low, 1);
    if (rows > 2) sum[2][v] = vfmaq_laneq_f32(sum[2][v], w, x_low, 2);
    if (rows > 3) sum[3][v] = vfmaq_laneq_f32(sum[3][v], w, x_low, 3);
    if (rows > 4) sum[4][v] = vfmaq_laneq_f32(sum[4][v], w, x_high, 0);
    if (rows > 5) sum[5][v] = vfmaq_laneq_f32(sum[5][v], w, x_high, 1);
}

/* One tile: `rows` (<= ROWS) rows of a_block [depth][ROW_LANES] times one panel's `depth` rows [depth][16]
 * BF16. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come back
 * for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, uint16_t const *b,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    float32x4_t sum[ROWS][VECTORS];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            sum[r][v] = first ? vdupq_n_f32(0.0f) : vld1q_f32(partial + r * COLUMNS + 4 * v);
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROW_LANES, b += COLUMNS) {
        float32x4_t x_low = vld1q_f32(a), x_high = vld1q_f32(a + 4);
        uint16x8_t low = vld1q_u16(b), high = vld1q_u16(b + 8);
        fma_rows(rows, sum, 0, widen_low(low), x_low, x_high);
        fma_rows(rows, sum, 1, widen_high(low), x_low, x_high);
        fma_rows(rows, sum, 2, widen_low(high), x_low, x_high);
        fma_rows(rows, sum, 3, widen_high(high), x_low, x_high);
    }
    if (!last) {
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
            for (size_t v = 0; v < VECTORS; ++v)
                vst1q_f32(partial + r * COLUMNS + 4 * v, sum[r][v]);
        return;
    }
    /* y = residual + epilogue(sum + bias), with g's fields read once (stores to y may alias them) */
    float const *bias = g->bias, *residual = g->residual;
    float *y = g->y + row * g->y_stride + column;
    size_t y_stride = g->y_stride, residual_stride = g->residual_stride;
    size_t count = g->n - column < COLUMNS ? g->n - column : COLUMNS;
    bool gelu = g->epilogue == KERNEL_EPILOGUE_GELU;
    if (residual) residual += row * residual_stride + column;
    float32x4_t biases[VECTORS];
    if (bias)
        load_columns(biases, bias + column, count);
    else
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            biases[v] = vdupq_n_f32(0.0f);
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        float32x4_t values[VECTORS];
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v) {
            values[v] = sum[r][v];
            if (bias) values[v] = vaddq_f32(values[v], biases[v]);
            if (gelu) values[v] = gelu_ps(values[v]);
        }
        if (residual) {
            float32x4_t residuals[VECTORS];
            load_columns(residuals, residual + r * residual_stride, count);
#pragma GCC unroll 4
            for (size_t v = 0; v < VECTORS; ++v)
                values[v] = vaddq_f32(values[v], residuals[v]);
        }
        store_columns(y + r * y_stride, count, values);
    }
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, float const *a, uint16_t const *b, size_t depth, float *partial,
                      bool first, bool last, kernel_gemm_t const *g, size_t row, size_t column) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count:                                                                                              \
        tile(count, a, b, depth, partial, first, last, g, row, column);                                      \
        break;
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
#undef TILE_CASE
    default:
        break;
    }
}

/* ---- Driver ------------------------------------------------------------------------------------- */

/* a_block[i][r] = x[row + r][k0 + i] in F32, for i < depth and r < rows: a strided copy, a few stores
 * per k against the 24 FMAs per k of every tile of the column block. The other lanes are loaded with
 * the rows but never multiplied. */
static void load_rows(float *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = a_block + r;
        if (g->x_bf16) {
            uint16_t const *from = g->x_bf16 + (row + r) * g->x_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                to[i * ROW_LANES] = bf16_to_f32(from[i]);
        } else {
            float const *from = g->x + (row + r) * g->x_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                to[i * ROW_LANES] = from[i];
        }
    }
}

void kernel_gemm_neon(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(16) float a_block[DEPTH * ROW_LANES];
    _Alignas(16) float partial[BLOCK_MAX * ROWS];
    if (n_begin >= n_end) return;
    /* Column blocks of equal width (in whole panels) at most BLOCK_BYTES of weights each. */
    size_t panel_bytes = g->k * COLUMNS * sizeof(uint16_t);
    size_t widest = panel_bytes ? BLOCK_BYTES / panel_bytes * COLUMNS : BLOCK_MAX;
    widest = widest < COLUMNS ? COLUMNS : widest > BLOCK_MAX ? BLOCK_MAX : widest;
    size_t blocks = (n_end - n_begin + widest - 1) / widest;
    size_t block = (panels_of(n_end - n_begin) + blocks - 1) / blocks * COLUMNS;
    uint16_t const *w = g->w;
    for (size_t n0 = n_begin; n0 < n_end; n0 += block) {
        size_t n1 = n_end - n0 < block ? n_end : n0 + block;
        for (size_t row = 0; row < g->m; row += ROWS) {
            size_t rows = g->m - row < ROWS ? g->m - row : ROWS;
            size_t k0 = 0;
            do { /* at least once, so that k = 0 still writes residual + epilogue(bias) */
                size_t depth = g->k - k0 < DEPTH ? g->k - k0 : DEPTH;
                load_rows(a_block, g, row, rows, k0, depth);
                bool first = k0 == 0, last = k0 + depth == g->k;
                for (size_t column = n0; column < n1; column += COLUMNS) {
                    uint16_t const *b = panel_at(w, g->n, k0, depth, column);
                    tile_rows(rows, a_block, b, depth, partial + (column - n0) * ROWS, first, last, g, row,
                              column);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
