/* BF16 GEMM with AVX512-BF16: `vdpbf16ps` multiplies pairs of BF16 values and adds both products to
 * one F32 lane, so weights are packed with consecutive k values side by side, and activations are
 * rounded to BF16 (like PyTorch's bf16 matmul) and broadcast a pair at a time.
 *
 * Blocking, for y[m, n] = x[m, k] . w[n, k]^T:
 *   - a tile of ROWS x COLUMNS = 14 x 32 outputs lives in 28 zmm accumulators over a whole depth
 *     block: `vdpbf16ps` issues 2 per cycle with a latency of about 6, so at least 12 independent
 *     chains are needed, and each step of the loop (2 weight loads, 14 broadcasts) feeds 28 of them;
 *   - the activations of the tile's rows over one depth block are rounded into `a_block`
 *     [ROWS][DEPTH] BF16 (21 KiB, in L1), every row at a constant offset from one pointer, and reused
 *     by every tile of the column block; the next block's activations are prefetched meanwhile;
 *   - the packed weights of a column block (up to BLOCK_BYTES) stream from L3 through the tiles of each
 *     row block in one sequential run; wide blocks round each row of x fewer times.
 * Measured variants at m = 512 on a Zen 5 EPYC, one thread, k = 768 and 3072: 14 x 32 is kept;
 * 12 x 32, 10 x 32 and 8 x 32 were up to 4% slower (fewer chains per broadcast), 6 x 64 3-6%
 * slower (4 weight loads per step); column blocks sized to stay in L2 were 2-10% slower (x rounded
 * again for every block); panels stored whole over k instead of per depth block were 15% slower at
 * k = 3072 (a new stream at every tile).
 * Each output is the same chain of `vdpbf16ps` over the k pairs in order, whatever tile, block or
 * thread computes it, so splitting the columns between threads never changes a bit.
 * Stack: about 80 KiB (a_block, and the partial sums of a column block when k > DEPTH). */
#include <immintrin.h>
#include <stdbool.h>

#include "math_avx512.h"
#include "paths.h"

enum {
    ROWS = 14,        /* rows of x per tile */
    COLUMNS = 32,     /* outputs per tile row: two zmm of F32 */
    VECTORS = 2,      /* COLUMNS / 16 */
    DEPTH = 768,      /* k values per depth block (a multiple of 32, for the rounding loop) */
    BLOCK_MAX = 1024, /* columns per column block at most */
};

#define BLOCK_BYTES (4u * 1024u * 1024u) /* packed weights per column block at most */

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

/* The panel of `column` in the depth block at k0, of `pairs` pairs, in a packed [n, k]. */
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

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH / 2] pairs times one panel's `pairs` pairs
 * [pairs][COLUMNS]. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS]
 * and come back for the next one. Always inlined with a constant `rows` so the accumulators stay in
 * registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, uint32_t const *a, uint32_t const *b,
                                                       size_t pairs, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    __m512 sum[ROWS][VECTORS];
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < VECTORS; ++v)
            sum[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + r * COLUMNS + 16 * v);
#pragma GCC unroll 2
    for (size_t p = 0; p < pairs; ++p, b += COLUMNS) {
        __m512bh w[VECTORS];
#pragma GCC unroll 2
        for (size_t v = 0; v < VECTORS; ++v)
            w[v] = (__m512bh)_mm512_load_si512(b + 16 * v);
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r) {
            __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r * (DEPTH / 2) + p]);
#pragma GCC unroll 2
            for (size_t v = 0; v < VECTORS; ++v)
                sum[r][v] = _mm512_dpbf16_ps(sum[r][v], x, w[v]);
        }
    }
    if (!last) {
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
            for (size_t v = 0; v < VECTORS; ++v)
                _mm512_store_ps(partial + r * COLUMNS + 16 * v, sum[r][v]);
        return;
    }
    /* y = residual + epilogue(sum + bias), with g's fields read once (stores to y may alias them) */
    float const *bias = g->bias, *residual = g->residual;
    float *y = g->y + row * g->y_stride + column;
    size_t y_stride = g->y_stride, residual_stride = g->residual_stride;
    bool gelu = g->epilogue == KERNEL_EPILOGUE_GELU;
    if (residual) residual += row * residual_stride + column;
    __mmask16 masks[VECTORS];
    __m512 biases[VECTORS];
    for (size_t v = 0; v < VECTORS; ++v) {
        masks[v] = columns_mask(column + 16 * v, g->n);
        biases[v] = bias ? _mm512_maskz_loadu_ps(masks[v], bias + column + 16 * v) : _mm512_setzero_ps();
    }
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 2
        for (size_t v = 0; v < VECTORS; ++v) {
            __m512 value = sum[r][v];
            if (bias) value = _mm512_add_ps(value, biases[v]);
            if (gelu) value = gelu_ps(value);
            if (residual)
                value = _mm512_add_ps(
                    value, _mm512_maskz_loadu_ps(masks[v], residual + r * residual_stride + 16 * v));
            _mm512_mask_storeu_ps(y + r * y_stride + 16 * v, masks[v], value);
        }
}

/* The same tile for any `rows`, each count compiled on its own. */
static void tile_rows(size_t rows, uint32_t const *a, uint32_t const *b, size_t pairs, float *partial,
                      bool first, bool last, kernel_gemm_t const *g, size_t row, size_t column) {
    switch (rows) {
#define TILE_CASE(count)                                                                                     \
    case count:                                                                                              \
        tile(count, a, b, pairs, partial, first, last, g, row, column);                                      \
        break;
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
        TILE_CASE(7)
        TILE_CASE(8)
        TILE_CASE(9)
        TILE_CASE(10)
        TILE_CASE(11)
        TILE_CASE(12)
        TILE_CASE(13)
        TILE_CASE(14)
#undef TILE_CASE
    default:
        break;
    }
}

/* ---- Activations ---------------------------------------------------------------------------------- */

/* a_block[r] = BF16 pairs of x[row + r][k0, k0 + depth), zero-padded to a multiple of 32 values. */
static void load_rows(uint32_t *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
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

/* Walks the lines of x[row, row + rows)[k0, k0 + depth) a share per tile, fetching them, so that the
 * next depth block's activations arrive while this block's tiles compute instead of stalling
 * `load_rows` on L3 or memory (3-5% at k = 3072, where x is 6 MiB). */
typedef struct prefetcher {
    char const *row_start; /* the row being fetched, at k0 */
    size_t row_bytes;      /* x_stride in bytes */
    size_t row_lines;      /* lines per row, one more than whole ones: a row may start mid-line */
    size_t line, rows_left, per_tile;
} prefetcher_t;

static prefetcher_t prefetcher_make(kernel_gemm_t const *g, size_t row, size_t rows, size_t k0, size_t depth,
                                    size_t tiles) {
    if (!rows) return (prefetcher_t){0}; /* the last block: nothing next */
    size_t size = g->x_bf16 ? sizeof(uint16_t) : sizeof(float);
    char const *x = g->x_bf16 ? (char const *)g->x_bf16 : (char const *)g->x;
    prefetcher_t p = {.row_start = x + (row * g->x_stride + k0) * size,
                      .row_bytes = g->x_stride * size,
                      .row_lines = depth * size / 64 + 1,
                      .rows_left = rows};
    p.per_tile = (rows * p.row_lines + tiles - 1) / tiles;
    return p;
}

static void prefetcher_step(prefetcher_t *p) {
    for (size_t i = 0; i < p->per_tile && p->rows_left; ++i) {
        _mm_prefetch(p->row_start + p->line * 64, _MM_HINT_T0);
        if (++p->line < p->row_lines) continue;
        p->line = 0;
        p->row_start += p->row_bytes;
        --p->rows_left;
    }
}

/* ---- Driver ------------------------------------------------------------------------------------- */

void kernel_gemm_avx512bf16(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) uint32_t a_block[ROWS * (DEPTH / 2)];
    _Alignas(64) float partial[BLOCK_MAX * ROWS];
    if (n_begin >= n_end) return;
    /* Column blocks of equal width (in whole panels) at most BLOCK_BYTES of weights each. */
    size_t panel_bytes = pairs_of(g->k) * COLUMNS * sizeof(uint32_t);
    size_t widest = panel_bytes ? BLOCK_BYTES / panel_bytes * COLUMNS : BLOCK_MAX;
    widest = widest < COLUMNS ? COLUMNS : widest > BLOCK_MAX ? BLOCK_MAX : widest;
    size_t blocks = (n_end - n_begin + widest - 1) / widest;
    size_t block = (panels_of(n_end - n_begin) + blocks - 1) / blocks * COLUMNS;
    uint32_t const *w = g->w;
    for (size_t n0 = n_begin; n0 < n_end; n0 += block) {
        size_t n1 = n_end - n0 < block ? n_end : n0 + block, tiles = panels_of(n1 - n0);
        for (size_t row = 0; row < g->m; row += ROWS) {
            size_t rows = g->m - row < ROWS ? g->m - row : ROWS;
            size_t k0 = 0;
            do { /* at least once, so that k = 0 still writes residual + epilogue(bias) */
                size_t depth = g->k - k0 < DEPTH ? g->k - k0 : DEPTH;
                bool first = k0 == 0, last = k0 + depth == g->k;
                load_rows(a_block, g, row, rows, k0, depth);
                size_t next_row = last ? row + ROWS : row, next_k0 = last ? 0 : k0 + depth;
                size_t next_rows = next_row >= g->m ? 0 : g->m - next_row < ROWS ? g->m - next_row : ROWS;
                size_t next_depth = g->k - next_k0 < DEPTH ? g->k - next_k0 : DEPTH;
                prefetcher_t prefetcher = prefetcher_make(g, next_row, next_rows, next_k0, next_depth, tiles);
                for (size_t column = n0; column < n1; column += COLUMNS) {
                    uint32_t const *b = panel_at(w, g->n, k0, pairs_of(depth), column);
                    tile_rows(rows, a_block, b, pairs_of(depth), partial + (column - n0) * ROWS, first, last,
                              g, row, column);
                    prefetcher_step(&prefetcher);
                }
                k0 += depth;
            } while (k0 < g->k);
        }
    }
}
