/* BF16-weight GEMM with AVX2 F32 FMAs: weights are widened to F32 on the fly (a BF16 is the high half
 * of an F32), activations stay F32.
 *
 * Blocking, for y[m, n] = x[m, k] . w[n, k]^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 12 ymm accumulators over a whole depth block (FMA
 *     latency 4 or 5 at 2 per cycle needs 8 to 10 independent chains), leaving 4 of the 16 registers
 *     for two weight vectors, one broadcast and the widening mask;
 *   - the activations of the tile's rows over one depth block are copied into `a_block`
 *     [ROWS][DEPTH] F32 (12 KiB, in L1), so that every row is at a constant offset from one pointer,
 *     and reused by every tile of the column block;
 *   - the packed weights of a column block (up to BLOCK_BYTES) stream from L3 through the tiles of each
 *     row block in one sequential run; wide blocks copy each row of x fewer times.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>

#include "math_avx2.h"
#include "paths.h"

enum {
    ROWS = 6,         /* rows of x per tile */
    COLUMNS = 16,     /* outputs per tile row: two ymm of F32 */
    DEPTH = 512,      /* k values per depth block (a multiple of 8: a_block rows stay 32-byte aligned) */
    BLOCK_MAX = 1024, /* columns per column block at most */
};

#define BLOCK_BYTES (4u * 1024u * 1024u) /* packed weights per column block at most */

/* ---- Packing ----------------------------------------------------------------------------------- */

/* For each depth block of DEPTH k values (the last one shorter), for each panel of COLUMNS columns:
 * [depth][8] uint32, lane i of row k pairing w[c0 + i][k] (low half) with w[c0 + 8 + i][k] (high
 * half), so that one shift and one mask widen a row of the panel into two vectors of F32. Columns past
 * n are zero. The panels of one depth block follow each other, so that the tiles of a row block read
 * one sequential stream. */
static size_t panels_of(size_t n) {
    return (n + COLUMNS - 1) / COLUMNS;
}

/* The panel of `column` in the depth block at k0, of `depth` rows, in a packed [n, k]. */
static uint32_t const *panel_at(uint32_t const *packed, size_t n, size_t k0, size_t depth, size_t column) {
    return packed + (k0 * panels_of(n) + column / COLUMNS * depth) * 8;
}

size_t kernel_gemm_packed_size_avx2(size_t n, size_t k) {
    return panels_of(n) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_avx2(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint32_t *out = packed;
    for (size_t k0 = 0; k0 < k; k0 += DEPTH) {
        size_t depth = k - k0 < DEPTH ? k - k0 : DEPTH;
        for (size_t panel = 0; panel < panels_of(n); ++panel)
            for (size_t i = k0; i < k0 + depth; ++i)
                for (size_t lane = 0; lane < 8; ++lane, ++out) {
                    size_t low = panel * COLUMNS + lane, high = low + 8;
                    *out =
                        (low < n ? w[low * k + i] : 0u) | (high < n ? (uint32_t)w[high * k + i] << 16 : 0u);
                }
    }
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* Lanes [0, count) set, for masked loads and stores of the last columns. */
static inline __m256i columns_mask(size_t column, size_t n) {
    int count = column >= n ? 0 : n - column >= 8 ? 8 : (int)(n - column);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH] times one panel's `depth` rows [depth][8]
 * uint32. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come
 * back for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, uint32_t const *b,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    __m256 sum[ROWS][2];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        sum[r][0] = first ? _mm256_setzero_ps() : _mm256_load_ps(partial + r * COLUMNS);
        sum[r][1] = first ? _mm256_setzero_ps() : _mm256_load_ps(partial + r * COLUMNS + 8);
    }
    __m256i const high_half = _mm256_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, b += 8) {
        __m256i pairs = _mm256_load_si256((__m256i const *)b);
        __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
        __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(pairs, high_half));
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r) {
            __m256 x = _mm256_broadcast_ss(a + r * DEPTH + i);
            sum[r][0] = _mm256_fmadd_ps(x, w0, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(x, w1, sum[r][1]);
        }
    }
    if (!last) {
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r) {
            _mm256_store_ps(partial + r * COLUMNS, sum[r][0]);
            _mm256_store_ps(partial + r * COLUMNS + 8, sum[r][1]);
        }
        return;
    }
    /* y = residual + epilogue(sum + bias), with g's fields read once (stores to y may alias them) */
    float const *bias = g->bias, *residual = g->residual;
    float *y = g->y + row * g->y_stride + column;
    size_t y_stride = g->y_stride, residual_stride = g->residual_stride;
    bool gelu = g->epilogue == KERNEL_EPILOGUE_GELU;
    if (residual) residual += row * residual_stride + column;
    __m256i masks[2];
    __m256 biases[2];
    for (size_t v = 0; v < 2; ++v) {
        masks[v] = columns_mask(column + 8 * v, g->n);
        biases[v] = bias ? _mm256_maskload_ps(bias + column + 8 * v, masks[v]) : _mm256_setzero_ps();
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < 2; ++v) {
            __m256 value = sum[r][v];
            if (bias) value = _mm256_add_ps(value, biases[v]);
            if (gelu) value = gelu_ps(value);
            if (residual)
                value = _mm256_add_ps(value,
                                      _mm256_maskload_ps(residual + r * residual_stride + 8 * v, masks[v]));
            _mm256_maskstore_ps(y + r * y_stride + 8 * v, masks[v], value);
        }
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, float const *a, uint32_t const *b, size_t depth, float *partial,
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

/* a_block[r] = x[row + r][k0, k0 + depth) in F32. */
static void load_rows(float *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = a_block + r * DEPTH;
        size_t i = 0;
        if (g->x_bf16) {
            uint16_t const *from = g->x_bf16 + (row + r) * g->x_stride + k0;
            for (; i + 8 <= depth; i += 8) {
                __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((__m128i const *)(from + i)));
                _mm256_store_ps(to + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
            }
            for (; i < depth; ++i)
                to[i] = bf16_to_f32(from[i]);
        } else {
            float const *from = g->x + (row + r) * g->x_stride + k0;
            for (; i + 8 <= depth; i += 8)
                _mm256_store_ps(to + i, _mm256_loadu_ps(from + i));
            for (; i < depth; ++i)
                to[i] = from[i];
        }
    }
}

void kernel_gemm_avx2(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(32) float a_block[ROWS * DEPTH];
    _Alignas(32) float partial[BLOCK_MAX * ROWS];
    if (n_begin >= n_end) return;
    /* Column blocks of equal width (in whole panels) at most BLOCK_BYTES of weights each. */
    size_t panel_bytes = g->k * COLUMNS * sizeof(uint16_t);
    size_t widest = panel_bytes ? BLOCK_BYTES / panel_bytes * COLUMNS : BLOCK_MAX;
    widest = widest < COLUMNS ? COLUMNS : widest > BLOCK_MAX ? BLOCK_MAX : widest;
    size_t blocks = (n_end - n_begin + widest - 1) / widest;
    size_t block = (panels_of(n_end - n_begin) + blocks - 1) / blocks * COLUMNS;
    uint32_t const *w = g->w;
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
                    uint32_t const *b = panel_at(w, g->n, k0, depth, column);
                    tile_rows(rows, a_block, b, depth, partial + (column - n0) * ROWS, first, last, g, row,
                              column);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
