/* F32 GEMM for training with AVX2 FMAs: c[m, n] (+)= op(a)[m, k] . op(b)[k, n] (kernels.h).
 *
 * Blocking, BLIS-style:
 *   - a tile of ROWS x COLUMNS outputs lives in 12 ymm accumulators over a whole depth block (FMA latency
 *     4 or 5 at 2 per cycle needs 8 to 10 independent chains), leaving 4 of the 16 registers for two rows
 *     of op(b) and the broadcast of op(a);
 *   - for each column block (BLOCK columns) and depth block (DEPTH values of k), op(b) is packed into
 *     `b_pack` [BLOCK / COLUMNS panels][DEPTH][COLUMNS] (128 KiB, in L2), whatever its layout, and streams
 *     through the tiles of every row block;
 *   - for each row block, op(a) is packed into `a_pack` [DEPTH][ROWS] (3 KiB, in L1), so that the ROWS
 *     values of one k are adjacent, whether a is stored [m, k] or [k, m].
 * Partial sums between depth blocks are kept in c itself. Each output is one chain of FMAs over k in
 * ascending order, started from 0 (or from the old c when accumulating), whatever tile, block or thread
 * computes it: splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "paths.h"

enum {
    ROWS = 6,     /* rows of op(a) per tile */
    COLUMNS = 16, /* columns per tile: two ymm */
    DEPTH = 128,  /* k values per depth block */
    BLOCK = 256,  /* columns per column block: a multiple of COLUMNS */
};

/* Lanes [0, count) set, count = the columns of [column, column + 8) below n, for maskload and maskstore. */
static inline __m256i columns_mask(size_t column, size_t n) {
    int count = column >= n ? 0 : n - column >= 8 ? 8 : (int)(n - column);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- Packing ----------------------------------------------------------------------------------- */

/* a_pack[i][r] = op(a)[row + r][k0 + i] for r < rows, i < depth. */
static void pack_a(float *a_pack, kernel_sgemm_t const *s, size_t row, size_t rows, size_t k0, size_t depth) {
    if (s->a_transposed) {
        for (size_t i = 0; i < depth; ++i)
            memcpy(a_pack + i * ROWS, s->a + (k0 + i) * s->a_stride + row, rows * sizeof(float));
        return;
    }
    for (size_t r = 0; r < rows; ++r) {
        float const *from = s->a + (row + r) * s->a_stride + k0;
        for (size_t i = 0; i < depth; ++i)
            a_pack[i * ROWS + r] = from[i];
    }
}

/* b_pack[panel][i][j] = op(b)[k0 + i][n0 + panel * COLUMNS + j] for columns [n0, n1), zero past n1. */
static void pack_b(float *b_pack, kernel_sgemm_t const *s, size_t n0, size_t n1, size_t k0, size_t depth) {
    for (size_t column = n0; column < n1; column += COLUMNS, b_pack += depth * COLUMNS) {
        size_t width = n1 - column < COLUMNS ? n1 - column : COLUMNS;
        if (!s->b_transposed) {
            __m256i low = columns_mask(column, n1), high = columns_mask(column + 8, n1);
            for (size_t i = 0; i < depth; ++i) {
                float const *from = s->b + (k0 + i) * s->b_stride + column;
                _mm256_store_ps(b_pack + i * COLUMNS, _mm256_maskload_ps(from, low));
                _mm256_store_ps(b_pack + i * COLUMNS + 8, _mm256_maskload_ps(from + 8, high));
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

/* One tile: c[rows][COLUMNS] (columns masked) = (load ? c : 0) + a_pack[depth][ROWS] . b_panel
 * [depth][COLUMNS]. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, float const *b,
                                                       size_t depth, float *c, size_t c_stride, __m256i low,
                                                       __m256i high, bool load) {
    __m256 sum[ROWS][2];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        sum[r][0] = load ? _mm256_maskload_ps(c + r * c_stride, low) : _mm256_setzero_ps();
        sum[r][1] = load ? _mm256_maskload_ps(c + r * c_stride + 8, high) : _mm256_setzero_ps();
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROWS, b += COLUMNS) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r) {
            __m256 x = _mm256_broadcast_ss(a + r);
            sum[r][0] = _mm256_fmadd_ps(x, b0, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(x, b1, sum[r][1]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        _mm256_maskstore_ps(c + r * c_stride, low, sum[r][0]);
        _mm256_maskstore_ps(c + r * c_stride + 8, high, sum[r][1]);
    }
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, float const *a, float const *b, size_t depth, float *c, size_t c_stride,
                      __m256i low, __m256i high, bool load) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count:                                                                                              \
        tile(count, a, b, depth, c, c_stride, low, high, load);                                              \
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

void kernel_sgemm_avx2(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    _Alignas(32) float b_pack[DEPTH * BLOCK];
    _Alignas(32) float a_pack[DEPTH * ROWS];
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
                for (size_t column = n0; column < n1; column += COLUMNS)
                    tile_rows(rows, a_pack, b_pack + (column - n0) * depth, depth,
                              s->c + row * s->c_stride + column, s->c_stride, columns_mask(column, n1),
                              columns_mask(column + 8, n1), load);
            }
            k0 += depth;
        } while (k0 < s->k);
    }
}
