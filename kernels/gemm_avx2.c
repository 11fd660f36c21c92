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
 *   - a column block of packed weights is sized to stay in the caches while every row block of x
 *     walks over it.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>

#include "paths.h"

enum {
    ROWS = 6,        /* rows of x per tile */
    COLUMNS = 16,    /* outputs per tile row: two ymm of F32 */
    DEPTH = 512,     /* k values per depth block (a multiple of 8, for the copy loop) */
    BLOCK_MAX = 512, /* columns per column block at most */
};

/* Bytes of packed weights per column block: past L2, they come from L3 at a rate the FMAs hide. */
#define BYTES_PER_BLOCK (1024u * 1024u)

/* ---- Packing ----------------------------------------------------------------------------------- */

/* Panel p holds columns [p * COLUMNS, (p + 1) * COLUMNS) as [k][8] uint32: lane i of row k pairs
 * w[c0 + i][k] (low half) with w[c0 + 8 + i][k] (high half), so that one shift and one mask widen a
 * row of the panel into two vectors of F32. Columns past n are zero. */
static size_t panels_of(size_t n) {
    return (n + COLUMNS - 1) / COLUMNS;
}

size_t kernel_gemm_packed_size_avx2(size_t n, size_t k) {
    return panels_of(n) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_avx2(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint32_t *out = packed;
    for (size_t panel = 0; panel < panels_of(n); ++panel)
        for (size_t i = 0; i < k; ++i)
            for (size_t lane = 0; lane < 8; ++lane, ++out) {
                size_t low = panel * COLUMNS + lane, high = low + 8;
                *out = (low < n ? w[low * k + i] : 0u) | (high < n ? (uint32_t)w[high * k + i] << 16 : 0u);
            }
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* exp(t) for t in [-87, 88] (clamped): 2^i * e^f with |f| <= ln2 / 2, e^f by its Taylor series to
 * degree 6 (relative error below 2e-7), 2^i built in the exponent field (i stays in [-126, 127]). */
static inline __m256 exp_ps(__m256 t) {
    t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 i = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(1.44269504f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_fnmadd_ps(i, _mm256_set1_ps(0.693145752f), t); /* ln2 in two parts (Cody-Waite) */
    f = _mm256_fnmadd_ps(i, _mm256_set1_ps(1.42860677e-6f), f);
    __m256 p = _mm256_set1_ps(1.0f / 720.0f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
}

/* 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation near 0. */
static inline __m256 gelu_ps(__m256 x) {
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u = _mm256_mul_ps(x, _mm256_fmadd_ps(x2, _mm256_set1_ps(0.0356774081f), _mm256_set1_ps(0.797884561f)));
    __m256 e = exp_ps(_mm256_mul_ps(u, _mm256_set1_ps(-2.0f)));
    return _mm256_div_ps(x, _mm256_add_ps(e, _mm256_set1_ps(1.0f)));
}

/* Lanes [0, count) set, for masked loads and stores of the last columns. */
static inline __m256i columns_mask(size_t column, size_t n) {
    int count = column >= n ? 0 : n - column >= 8 ? 8 : (int)(n - column);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* y = residual + epilogue(sum + bias) for 8 outputs of one row, `mask` selecting those below n. */
static inline void store_outputs(kernel_gemm_t const *g, size_t row, size_t column, __m256i mask, __m256 sum) {
    if (g->bias) sum = _mm256_add_ps(sum, _mm256_maskload_ps(g->bias + column, mask));
    if (g->epilogue == KERNEL_EPILOGUE_GELU) sum = gelu_ps(sum);
    if (g->residual)
        sum = _mm256_add_ps(sum, _mm256_maskload_ps(g->residual + row * g->residual_stride + column, mask));
    _mm256_maskstore_ps(g->y + row * g->y_stride + column, mask, sum);
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
    __m256i mask0 = columns_mask(column, g->n), mask1 = columns_mask(column + 8, g->n);
    for (size_t r = 0; r < rows; ++r) {
        store_outputs(g, row + r, column, mask0, sum[r][0]);
        store_outputs(g, row + r, column + 8, mask1, sum[r][1]);
    }
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, float const *a, uint32_t const *b, size_t depth, float *partial, bool first,
                      bool last, kernel_gemm_t const *g, size_t row, size_t column) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count: tile(count, a, b, depth, partial, first, last, g, row, column); break;
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
#undef TILE_CASE
    default: break;
    }
}

/* ---- Driver ------------------------------------------------------------------------------------- */

/* a_block[r] = x[row + r][k0, k0 + depth) in F32. */
static void load_rows(float *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0, size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = a_block + r * DEPTH;
        size_t i = 0;
        if (g->x_bf16) {
            uint16_t const *from = g->x_bf16 + (row + r) * g->x_stride + k0;
            for (; i + 8 <= depth; i += 8) {
                __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((__m128i const *)(from + i)));
                _mm256_store_ps(to + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
            }
            for (; i < depth; ++i) to[i] = bf16_to_f32(from[i]);
        } else {
            float const *from = g->x + (row + r) * g->x_stride + k0;
            for (; i + 8 <= depth; i += 8) _mm256_store_ps(to + i, _mm256_loadu_ps(from + i));
            for (; i < depth; ++i) to[i] = from[i];
        }
    }
}

void kernel_gemm_avx2(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(32) float a_block[ROWS * DEPTH];
    _Alignas(32) float partial[BLOCK_MAX * ROWS];
    size_t panel_bytes = g->k * COLUMNS * sizeof(uint16_t);
    size_t block = panel_bytes ? BYTES_PER_BLOCK / panel_bytes * COLUMNS : BLOCK_MAX;
    block = block < COLUMNS ? COLUMNS : block > BLOCK_MAX ? BLOCK_MAX : block;
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
                    uint32_t const *b = w + (column / COLUMNS * g->k + k0) * 8;
                    tile_rows(rows, a_block, b, depth, partial + (column - n0) * ROWS, first, last, g, row, column);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
