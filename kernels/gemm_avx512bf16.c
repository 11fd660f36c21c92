/* BF16 GEMM with AVX512-BF16: `vdpbf16ps` multiplies pairs of BF16 values and adds both products to
 * one F32 lane, so weights are packed with consecutive k values side by side and activations are
 * rounded to BF16 (like PyTorch's bf16 matmul) and broadcast a pair at a time.
 *
 * Blocking, for y[m, n] = x[m, k] . w[n, k]^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 24 zmm accumulators over a whole depth block; the
 *     latency of `vdpbf16ps` (about 6 cycles, 2 per cycle) needs at least 12 independent chains;
 *   - the activations of the tile's rows over one depth block are converted into `a_block`
 *     [ROWS][DEPTH] BF16 (18 KiB, in L1) and reused by every tile of the column block;
 *   - a column block of packed weights [block, k] is sized to stay in L2 while every row block of x
 *     walks over it.
 * Each output is the same chain of `vdpbf16ps` over the k pairs in order, whatever tile, block or
 * thread computes it, so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "paths.h"
#ifndef UNROLL
#define UNROLL 2
#endif
#define DO_PRAGMA_(x) _Pragma(#x)
#define DO_PRAGMA(x) DO_PRAGMA_(x)

#ifndef ROWS
#define ROWS 12
#endif
#ifndef COLUMNS
#define COLUMNS 32
#endif
#ifndef DEPTH
#define DEPTH 768
#endif
#ifndef L2_BYTES_PER_BLOCK
#define L2_BYTES_PER_BLOCK (512u * 1024u)
#endif
#ifndef BLOCK_MAX
#define BLOCK_MAX 1024
#endif
#define VECTORS (COLUMNS / 16)

/* ---- Packing ----------------------------------------------------------------------------------- */

/* For each depth block of DEPTH k values (the last one shorter), for each panel of COLUMNS columns:
 * [pairs][COLUMNS] uint32, each the BF16 pair (w[c][2i], w[c][2i + 1]) with the even k in the low
 * half; columns past n and the k past an odd k are zero. The panels of one depth block follow each
 * other, so that the tiles of a row block read one sequential stream. */
static size_t pairs_of(size_t k) {
    return (k + 1) / 2;
}

static size_t panels_of(size_t n) {
    return (n + COLUMNS - 1) / COLUMNS;
}

/* The panel of `column` over the depth block at k0, of `pairs` pairs, in a packed [n, k]. */
static uint32_t const *panel_at(uint32_t const *packed, size_t n, size_t k0, size_t pairs, size_t column) {
    return packed + (k0 / 2 * panels_of(n) + column / COLUMNS * pairs) * COLUMNS;
}

size_t kernel_gemm_packed_size_avx512bf16(size_t n, size_t k) {
    return panels_of(n) * pairs_of(k) * COLUMNS * sizeof(uint32_t);
}

void kernel_gemm_pack_avx512bf16(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint32_t *out = packed;
    for (size_t k0 = 0; k0 < k; k0 += DEPTH) {
        size_t pairs = pairs_of(k - k0 < DEPTH ? k - k0 : DEPTH);
        for (size_t panel = 0; panel < panels_of(n); ++panel)
            for (size_t pair = 0; pair < pairs; ++pair)
                for (size_t c = 0; c < COLUMNS; ++c, ++out) {
                    size_t column = panel * COLUMNS + c, even = k0 + 2 * pair;
                    uint32_t low = column < n ? w[column * k + even] : 0;
                    uint32_t high = column < n && even + 1 < k ? w[column * k + even + 1] : 0;
                    *out = low | high << 16;
                }
    }
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* exp(t) for t in [-100, 100]: 2^i * e^f with |f| <= ln2 / 2, e^f by its Taylor series to degree 6
 * (relative error below 2e-7); `scalef` gives 0 and infinity past the F32 range. */
static inline __m512 exp_ps(__m512 t) {
    t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-100.0f)), _mm512_set1_ps(100.0f));
    __m512 i = _mm512_roundscale_ps(_mm512_mul_ps(t, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(i, _mm512_set1_ps(0.693145752f), t); /* ln2 split in two for Cody-Waite */
    f = _mm512_fnmadd_ps(i, _mm512_set1_ps(1.42860677e-6f), f);
    __m512 p = _mm512_set1_ps(1.0f / 720.0f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, i);
}

/* 0.5x(1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi)(x + 0.044715x^3): no cancellation near 0. */
static inline __m512 gelu_ps(__m512 x) {
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 u = _mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(0.0356774081f), _mm512_set1_ps(0.797884561f)));
    __m512 e = exp_ps(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)));
    return _mm512_div_ps(x, _mm512_add_ps(e, _mm512_set1_ps(1.0f)));
}

/* y = residual + epilogue(sum + bias) for 16 outputs of one row, `mask` selecting those below n. */
static inline void store_outputs(kernel_gemm_t const *g, size_t row, size_t column, __mmask16 mask, __m512 sum) {
    if (g->bias) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, g->bias + column));
    if (g->epilogue == KERNEL_EPILOGUE_GELU) sum = gelu_ps(sum);
    if (g->residual)
        sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(mask, g->residual + row * g->residual_stride + column));
    _mm512_mask_storeu_ps(g->y + row * g->y_stride + column, mask, sum);
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

static inline __mmask16 columns_mask(size_t column, size_t n) {
    return column >= n ? 0 : n - column >= 16 ? 0xffff : (__mmask16)((1u << (n - column)) - 1);
}

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH / 2] pairs times one panel's `pairs` pairs
 * [pairs][COLUMNS]. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS]
 * and come back for the next one. Always inlined with a constant `rows` so the accumulators stay in
 * registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, uint32_t const *a, uint32_t const *b,
                                                        size_t pairs, float *partial, bool first, bool last,
                                                        kernel_gemm_t const *g, size_t row, size_t column) {
    __m512 sum[ROWS][VECTORS];
#pragma GCC unroll 16
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            sum[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + r * COLUMNS + 16 * v);
DO_PRAGMA(GCC unroll UNROLL)
    for (size_t p = 0; p < pairs; ++p, b += COLUMNS) {
        __m512bh w[VECTORS];
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v) w[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
#pragma GCC unroll 16
        for (size_t r = 0; r < rows; ++r) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r * (DEPTH / 2) + p]);
#pragma GCC unroll 4
            for (size_t v = 0; v < VECTORS; ++v) sum[r][v] = _mm512_dpbf16_ps(sum[r][v], x, w[v]);
        }
    }
    if (!last) {
#pragma GCC unroll 16
        for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
            for (size_t v = 0; v < VECTORS; ++v) _mm512_store_ps(partial + r * COLUMNS + 16 * v, sum[r][v]);
        return;
    }
    __mmask16 masks[VECTORS];
    for (size_t v = 0; v < VECTORS; ++v) masks[v] = columns_mask(column + 16 * v, g->n);
    for (size_t r = 0; r < rows; ++r)
        for (size_t v = 0; v < VECTORS; ++v) store_outputs(g, row + r, column + 16 * v, masks[v], sum[r][v]);
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, uint32_t const *a, uint32_t const *b, size_t pairs, float *partial, bool first,
                      bool last, kernel_gemm_t const *g, size_t row, size_t column) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count: tile(count, a, b, pairs, partial, first, last, g, row, column); break;
#if ROWS >= 1
        TILE_CASE(1)
#endif
#if ROWS >= 2
        TILE_CASE(2)
#endif
#if ROWS >= 3
        TILE_CASE(3)
#endif
#if ROWS >= 4
        TILE_CASE(4)
#endif
#if ROWS >= 5
        TILE_CASE(5)
#endif
#if ROWS >= 6
        TILE_CASE(6)
#endif
#if ROWS >= 7
        TILE_CASE(7)
#endif
#if ROWS >= 8
        TILE_CASE(8)
#endif
#if ROWS >= 9
        TILE_CASE(9)
#endif
#if ROWS >= 10
        TILE_CASE(10)
#endif
#if ROWS >= 11
        TILE_CASE(11)
#endif
#if ROWS >= 12
        TILE_CASE(12)
#endif
#if ROWS >= 13
        TILE_CASE(13)
#endif
#if ROWS >= 14
        TILE_CASE(14)
#endif
#if ROWS >= 15
        TILE_CASE(15)
#endif
#if ROWS >= 16
        TILE_CASE(16)
#endif
#undef TILE_CASE
    default: break;
    }
}

/* ---- Driver ------------------------------------------------------------------------------------- */

/* a_block[r] = BF16 pairs of x[row + r][k0, k0 + depth), zero-padded to a multiple of 32 values. */
static void load_rows(uint32_t *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0, size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        uint32_t *to = a_block + r * (DEPTH / 2);
        for (size_t i = 0; i < depth; i += 32, to += 16) {
            size_t left = depth - i;
            __mmask32 mask = left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1);
            __m512i pairs;
            if (g->x_bf16) {
                pairs = _mm512_maskz_loadu_epi16(mask, g->x_bf16 + (row + r) * g->x_stride + k0 + i);
            } else {
                float const *from = g->x + (row + r) * g->x_stride + k0 + i;
                __m512 low = _mm512_maskz_loadu_ps((__mmask16)mask, from);
                __m512 high = _mm512_maskz_loadu_ps((__mmask16)(mask >> 16), from + 16);
                pairs = (__m512i)_mm512_cvtne2ps_pbh(high, low);
            }
            _mm512_store_si512(to, pairs);
        }
    }
}

void kernel_gemm_avx512bf16(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) uint32_t a_block[ROWS * (DEPTH / 2)];
    _Alignas(64) float partial[BLOCK_MAX * ROWS];
    size_t panel_bytes = pairs_of(g->k) * COLUMNS * sizeof(uint32_t);
    size_t block = panel_bytes ? L2_BYTES_PER_BLOCK / panel_bytes * COLUMNS : BLOCK_MAX;
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
                    uint32_t const *b = panel_at(w, g->n, k0, pairs_of(depth), column);
                    tile_rows(rows, a_block, b, pairs_of(depth), partial + (column - n0) * ROWS, first, last, g,
                              row, column);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
