/* BF16-weight GEMM with AVX-512 F32 FMAs, for CPUs without AVX512-BF16: weights are widened to F32
 * on the fly (a BF16 is the high half of an F32), activations stay F32.
 *
 * The driver (blocking, column blocks, partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 24 zmm accumulators over a whole depth block (FMA
 *     latency 4 at 2 per cycle needs 8 or more independent chains; the rest hides the widening);
 *   - the activations of the tile's rows over one depth block are copied into `a_block`
 *     [ROWS][DEPTH] F32 (18 KiB, in L1), so that every row is at a constant offset from one pointer,
 *     and reused by every tile of the column block.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>

#include "gemm_driver.h"
#include "math_avx512.h"
#include "gemm_epilogue.h"
#include "paths.h"

enum {
    ROWS = 12,    /* rows of x per tile */
    COLUMNS = 32, /* outputs per tile row: two zmm of F32 */
    DEPTH = 384,  /* k values per depth block (a multiple of 16, for the copy loop) */
};

/* ---- Packing ----------------------------------------------------------------------------------- */

/* gemm_pack_halves (gemm_driver.h): [depth][16] uint32 per panel of COLUMNS columns, lane i of row k
 * pairing columns c0 + i and c0 + 16 + i, so that one shift and one mask widen a row of the panel into
 * two vectors of F32. */
size_t kernel_gemm_packed_size_avx512(size_t n, size_t k) {
    return gemm_panels_of(n, COLUMNS) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_avx512(void *packed, uint16_t const *w, size_t n, size_t k) {
    gemm_pack_halves(packed, w, n, k, COLUMNS, DEPTH);
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH] times one panel's `depth` rows [depth][16]
 * uint32. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come
 * back for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    float const *a = a_block;
    uint32_t const *b = panel;
    __m512 sum[ROWS][2];
#pragma GCC unroll 12
    for (size_t r = 0; r < rows; ++r) {
        sum[r][0] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + r * COLUMNS);
        sum[r][1] = first ? _mm512_setzero_ps() : _mm512_load_ps(partial + r * COLUMNS + 16);
    }
    __m512i const high_half = _mm512_set1_epi32((int)0xffff0000u);
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, b += 16) {
        __m512i pairs = _mm512_load_si512(b);
        __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
        __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half));
#pragma GCC unroll 12
        for (size_t r = 0; r < rows; ++r) {
            __m512 x = _mm512_set1_ps(a[r * DEPTH + i]);
            sum[r][0] = _mm512_fmadd_ps(x, w0, sum[r][0]);
            sum[r][1] = _mm512_fmadd_ps(x, w1, sum[r][1]);
        }
    }
    if (!last) {
#pragma GCC unroll 12
        for (size_t r = 0; r < rows; ++r) {
            _mm512_store_ps(partial + r * COLUMNS, sum[r][0]);
            _mm512_store_ps(partial + r * COLUMNS + 16, sum[r][1]);
        }
        return;
    }
    gemm_epilogue(rows, sum, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

/* a_block [ROWS][DEPTH]: a_block[r] = x[row + r][k0, k0 + depth) in F32. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = (float *)a_block + r * DEPTH;
        for (size_t i = 0; i < depth; i += 16, to += 16) {
            size_t left = depth - i;
            __mmask16 mask = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            __m512 values;
            if (g->x_bf16) {
                __m256i bf16 = _mm256_maskz_loadu_epi16(mask, g->x_bf16 + (row + r) * g->x_stride + k0 + i);
                values = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
            } else {
                values = _mm512_maskz_loadu_ps(mask, g->x + (row + r) * g->x_stride + k0 + i);
            }
            _mm512_store_ps(to, values);
        }
    }
}

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .load_rows = load_rows, .tile = tile};

void kernel_gemm_avx512(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(64) float a_block[ROWS * DEPTH];
    _Alignas(64) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
