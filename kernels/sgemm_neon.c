/* F32 GEMM for training with NEON FMAs (baseline ARMv8-A Advanced SIMD): c[m, n] (+)= op(a)[m, k] .
 * op(b)[k, n] (kernels.h).
 *
 * Blocking, BLIS-style:
 *   - a tile of ROWS x COLUMNS outputs lives in 24 q-register accumulators over a whole depth block (FMA
 *     latency 4 at 2 to 4 per cycle needs 8 to 16 independent chains), leaving 8 of the 32 registers for
 *     a row of op(b) (four) and the ROWS values of op(a) at one k (two, multiplied by element);
 *   - for each column block (BLOCK columns) and depth block (DEPTH values of k), op(b) is packed into
 *     `b_pack` [BLOCK / COLUMNS panels][DEPTH][COLUMNS] (128 KiB), whatever its layout, and streams
 *     through the tiles of every row block;
 *   - for each row block, op(a) is packed into `a_pack` [DEPTH][ROW_LANES] (4 KiB, in L1), so that the
 *     rows of one k are two vector loads, whether a is stored [m, k] or [k, m].
 * Partial sums between depth blocks are kept in c itself. Each output is one chain of FMAs over k in
 * ascending order, started from 0 (or from the old c when accumulating), whatever tile, block or thread
 * computes it: splitting the columns between threads never changes a bit. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "paths.h"

enum {
    ROWS = 6,              /* rows of op(a) per tile */
    ROW_LANES = 8,         /* a_pack values per k: rows 0-3, rows 4-5, two lanes unused */
    COLUMNS = 16,          /* columns per tile */
    VECTORS = COLUMNS / 4, /* q registers per tile row */
    DEPTH = 128,           /* k values per depth block */
    BLOCK = 256,           /* columns per column block: a multiple of COLUMNS */
};

/* ---- Packing ----------------------------------------------------------------------------------- */

/* a_pack[i][r] = op(a)[row + r][k0 + i] for r < rows, i < depth; the other lanes zero. */
static void pack_a(float *a_pack, kernel_sgemm_t const *s, size_t row, size_t rows, size_t k0, size_t depth) {
    memset(a_pack, 0, depth * ROW_LANES * sizeof(float));
    if (s->a_transposed) {
        for (size_t i = 0; i < depth; ++i)
            memcpy(a_pack + i * ROW_LANES, s->a + (k0 + i) * s->a_stride + row, rows * sizeof(float));
        return;
    }
    for (size_t r = 0; r < rows; ++r) {
        float const *from = s->a + (row + r) * s->a_stride + k0;
        for (size_t i = 0; i < depth; ++i)
            a_pack[i * ROW_LANES + r] = from[i];
    }
}

/* b_pack[panel][i][j] = op(b)[k0 + i][n0 + panel * COLUMNS + j] for columns [n0, n1), zero past n1. */
static void pack_b(float *b_pack, kernel_sgemm_t const *s, size_t n0, size_t n1, size_t k0, size_t depth) {
    for (size_t column = n0; column < n1; column += COLUMNS, b_pack += depth * COLUMNS) {
        size_t width = n1 - column < COLUMNS ? n1 - column : COLUMNS;
        if (!s->b_transposed) {
            for (size_t i = 0; i < depth; ++i) {
                float *to = b_pack + i * COLUMNS;
                memcpy(to, s->b + (k0 + i) * s->b_stride + column, width * sizeof(float));
                memset(to + width, 0, (COLUMNS - width) * sizeof(float));
            }
            continue;
        }
        for (size_t j = 0; j < COLUMNS; ++j) {
            float const *from = s->b + (column + j) * s->b_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                b_pack[i * COLUMNS + j] = j < width ? from[i] : 0.0f;
        }
    }
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

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

/* sum[r][v] += b * a[r] for the tile's rows, a[r] being lane r of a_low, then lane r - 4 of a_high
 * (lane numbers are immediates: one line per row). */
static inline __attribute__((always_inline)) void fma_rows(size_t rows, float32x4_t sum[ROWS][VECTORS],
                                                           size_t v, float32x4_t b, float32x4_t a_low,
                                                           float32x4_t a_high) {
    sum[0][v] = vfmaq_laneq_f32(sum[0][v], b, a_low, 0);
    if (rows > 1) sum[1][v] = vfmaq_laneq_f32(sum[1][v], b, a_low, 1);
    if (rows > 2) sum[2][v] = vfmaq_laneq_f32(sum[2][v], b, a_low, 2);
    if (rows > 3) sum[3][v] = vfmaq_laneq_f32(sum[3][v], b, a_low, 3);
    if (rows > 4) sum[4][v] = vfmaq_laneq_f32(sum[4][v], b, a_high, 0);
    if (rows > 5) sum[5][v] = vfmaq_laneq_f32(sum[5][v], b, a_high, 1);
}

/* One tile: c[rows][count] = (load ? c : 0) + a_pack[depth][ROW_LANES] . b_panel [depth][COLUMNS].
 * Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, float const *b,
                                                       size_t depth, float *c, size_t c_stride, size_t count,
                                                       bool load) {
    float32x4_t sum[ROWS][VECTORS];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        if (load) {
            load_columns(sum[r], c + r * c_stride, count);
            continue;
        }
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            sum[r][v] = vdupq_n_f32(0.0f);
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROW_LANES, b += COLUMNS) {
        float32x4_t a_low = vld1q_f32(a), a_high = vld1q_f32(a + 4);
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            fma_rows(rows, sum, v, vld1q_f32(b + 4 * v), a_low, a_high);
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
        store_columns(c + r * c_stride, count, sum[r]);
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, float const *a, float const *b, size_t depth, float *c, size_t c_stride,
                      size_t count, bool load) {
    switch (rows) {
#define TILE_CASE(rows_)                                                                                     \
    case rows_:                                                                                              \
        tile(rows_, a, b, depth, c, c_stride, count, load);                                                  \
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

void kernel_sgemm_neon(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    _Alignas(16) float b_pack[DEPTH * BLOCK];
    _Alignas(16) float a_pack[DEPTH * ROW_LANES];
    for (size_t n0 = n_begin; n0 < n_end; n0 += BLOCK) {
        size_t n1 = n_end - n0 < BLOCK ? n_end : n0 + BLOCK;
        size_t k0 = 0;
        do { /* at least once, so that k = 0 still writes c = (accumulate ? c : 0) */
            size_t depth = s->k - k0 < DEPTH ? s->k - k0 : DEPTH;
            bool load = k0 > 0 || s->accumulate;
            pack_b(b_pack, s, n0, n1, k0, depth);
            for (size_t row = 0; row < s->m; row += ROWS) {
                size_t rows = s->m - row < ROWS ? s->m - row : ROWS;
                pack_a(a_pack, s, row, rows, k0, depth);
                for (size_t column = n0; column < n1; column += COLUMNS) {
                    size_t count = n1 - column < COLUMNS ? n1 - column : COLUMNS;
                    tile_rows(rows, a_pack, b_pack + (column - n0) * depth, depth,
                              s->c + row * s->c_stride + column, s->c_stride, count, load);
                }
            }
            k0 += depth;
        } while (k0 < s->k);
    }
}
