/* BF16 GEMM with AVX512-BF16: `vdpbf16ps` multiplies pairs of BF16 values and adds both products to
 * one F32 lane, so weights are packed with consecutive k values side by side, and activations are
 * rounded to BF16 (like PyTorch's bf16 matmul) and broadcast a pair at a time.
 *
 * The driver (blocking, column blocks, partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 14 x 32 outputs lives in 28 zmm accumulators over a whole depth
 *     block: `vdpbf16ps` issues 2 per cycle with a latency of about 6, so at least 12 independent
 *     chains are needed, and each step of the loop (2 weight loads, 14 broadcasts) feeds 28 of them;
 *   - the activations of the tile's rows over one depth block are rounded into `a_block`
 *     [ROWS][DEPTH] BF16 (21 KiB, in L1), every row at a constant offset from one pointer, and reused
 *     by every tile of the column block; the next block's activations are prefetched meanwhile.
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

#include "gemm_driver.h"
#include "math_avx512.h"
#include "gemm_epilogue.h"
#include "paths.h"

enum {
    ROWS = 14,    /* rows of x per tile */
    COLUMNS = 32, /* outputs per tile row: two zmm of F32 */
    VECTORS = 2,  /* COLUMNS / 16 */
    DEPTH = 768,  /* k values per depth block (a multiple of 32, for the rounding loop) */
};

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

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH / 2] pairs times one panel's pairs of `depth`
 * k values [pairs][COLUMNS]. Partial sums of a depth block that is not the last go to `partial`
 * [ROWS][COLUMNS] and come back for the next one. Always inlined with a constant `rows` so the accumulators
 * stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    uint32_t const *a = a_block, *b = panel;
    size_t pairs = pairs_of(depth);
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
    gemm_epilogue(rows, sum, g, row, column);
}

/* ---- Activations ---------------------------------------------------------------------------------- */

/* a_block [ROWS][DEPTH / 2]: a_block[r] = BF16 pairs of x[row + r][k0, k0 + depth), zero-padded to a
 * multiple of 32 values. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        uint32_t *to = (uint32_t *)a_block + r * (DEPTH / 2);
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

/* ---- Driver ------------------------------------------------------------------------------------- */

static gemm_path_t const path = {.rows = ROWS,
                                 .columns = COLUMNS,
                                 .depth = DEPTH,
                                 .pairs = true,
                                 .prefetch = true,
                                 .load_rows = load_rows,
                                 .tile = tile};

void kernel_gemm_avx512bf16(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) uint32_t a_block[ROWS * (DEPTH / 2)];
    _Alignas(64) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
