/* BF16-weight GEMM with AVX2 F32 FMAs: weights are widened to F32 on the fly (a BF16 is the high half
 * of an F32), activations stay F32.
 *
 * The driver (blocking, column blocks, partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 12 ymm accumulators over a whole depth block (FMA
 *     latency 4 or 5 at 2 per cycle needs 8 to 10 independent chains), leaving 4 of the 16 registers
 *     for two weight vectors, one broadcast and the widening mask;
 *   - the activations of the tile's rows over one depth block are copied into `a_block`
 *     [ROWS][DEPTH] F32 (12 KiB, in L1), so that every row is at a constant offset from one pointer,
 *     and reused by every tile of the column block.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>

#include "gemm_driver.h"
#include "math_avx2.h"
#include "gemm_epilogue.h"
#include "paths.h"

enum {
    ROWS = 6,     /* rows of x per tile */
    COLUMNS = 16, /* outputs per tile row: two ymm of F32 */
    DEPTH = 512,  /* k values per depth block (a multiple of 8: a_block rows stay 32-byte aligned) */
};

/* ---- Packing ----------------------------------------------------------------------------------- */

/* gemm_pack_halves (gemm_driver.h): [depth][8] uint32 per panel of COLUMNS columns, lane i of row k
 * pairing columns c0 + i and c0 + 8 + i, so that one shift and one mask widen a row of the panel into
 * two vectors of F32. */
size_t kernel_gemm_packed_size_avx2(size_t n, size_t k) {
    return gemm_panels_of(n, COLUMNS) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_avx2(void *packed, uint16_t const *w, size_t n, size_t k) {
    gemm_pack_halves(packed, w, n, k, COLUMNS, DEPTH);
}

/* ---- Epilogue ---------------------------------------------------------------------------------- */

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH] times one panel's `depth` rows [depth][8]
 * uint32. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come
 * back for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    float const *a = a_block;
    uint32_t const *b = panel;
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
    gemm_epilogue(rows, sum, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

/* a_block [ROWS][DEPTH]: a_block[r] = x[row + r][k0, k0 + depth) in F32. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = (float *)a_block + r * DEPTH;
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

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .load_rows = load_rows, .tile = tile};

void kernel_gemm_avx2(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(32) float a_block[ROWS * DEPTH];
    _Alignas(32) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
