/* BF16-weight GEMM with F32 FMAs, compiled for AVX2 (kernel_gemm_avx2) and for AVX-512 on CPUs without
 * AVX512-BF16 (kernel_gemm_avx512), written once over the vector primitives of math_avx2.h / math_avx512.h:
 * weights are widened to F32 on the fly (a BF16 is the high half of an F32), activations stay F32.
 *
 * The driver (blocking, column blocks, partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS outputs (COLUMNS: two vectors of F32) lives in 2 ROWS accumulators over a
 *     whole depth block: with AVX2, 12 ymm (FMA latency 4 or 5 at 2 per cycle needs 8 to 10 independent
 *     chains), leaving 4 of the 16 registers for two weight vectors, one broadcast and the widening mask;
 *     with AVX-512, 24 zmm (latency 4 at 2 per cycle needs 8 or more; the rest hides the widening);
 *   - the activations of the tile's rows over one depth block are copied into `a_block` [ROWS][DEPTH] F32
 *     (12 KiB with AVX2, 18 KiB with AVX-512, in L1), so that every row is at a constant offset from one
 *     pointer, and reused by every tile of the column block.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <immintrin.h>
#include <stdbool.h>

#include "gemm_driver.h"

#if defined(__AVX512F__)
#include "math_avx512.h"
#define PATH_GEMM(name) kernel_##name##_avx512

enum {
    ROWS = 12,   /* rows of x per tile */
    DEPTH = 384, /* k values per depth block (a multiple of 16, for the copy loop) */
};
#else
#include "math_avx2.h"
#define PATH_GEMM(name) kernel_##name##_avx2

enum {
    ROWS = 6,    /* rows of x per tile */
    DEPTH = 512, /* k values per depth block (a multiple of 8: a_block rows stay 32-byte aligned) */
};
#endif

#include "gemm_epilogue.h"
#include "paths.h"

enum {
    LANES = sizeof(vfloat) / sizeof(float), /* F32 lanes of a vector */
    COLUMNS = 2 * LANES,                    /* outputs per tile row: two vectors of F32 */
};

/* ---- Packing ----------------------------------------------------------------------------------- */

/* gemm_pack_halves (gemm_driver.h): [depth][LANES] uint32 per panel of COLUMNS columns, lane i of row k
 * pairing columns c0 + i and c0 + LANES + i, so that one shift and one mask widen a row of the panel into
 * two vectors of F32. */
size_t PATH_GEMM(gemm_packed_size)(size_t n, size_t k) {
    return gemm_panels_of(n, COLUMNS) * k * COLUMNS * sizeof(uint16_t);
}

void PATH_GEMM(gemm_pack)(void *packed, uint16_t const *w, size_t n, size_t k) {
    gemm_pack_halves(packed, w, n, k, COLUMNS, DEPTH);
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* One tile: `rows` (<= ROWS) rows of a_block [ROWS][DEPTH] times one panel's `depth` rows [depth][LANES]
 * uint32. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come
 * back for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    float const *a = a_block;
    int32_t const *b = panel;
    vfloat sum[ROWS][2];
#pragma GCC unroll 14
    for (size_t r = 0; r < rows; ++r) {
        sum[r][0] = first ? vf_zero() : vf_load(partial + r * COLUMNS);
        sum[r][1] = first ? vf_zero() : vf_load(partial + r * COLUMNS + LANES);
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, b += LANES) {
        vint pairs = vi_load(b);
        vfloat w0 = vf_of_low_halves(pairs), w1 = vf_of_high_halves(pairs);
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r) {
            vfloat x = vf_broadcast(a + r * DEPTH + i);
            sum[r][0] = vf_fmadd(x, w0, sum[r][0]);
            sum[r][1] = vf_fmadd(x, w1, sum[r][1]);
        }
    }
    if (!last) {
#pragma GCC unroll 14
        for (size_t r = 0; r < rows; ++r) {
            vf_store(partial + r * COLUMNS, sum[r][0]);
            vf_store(partial + r * COLUMNS + LANES, sum[r][1]);
        }
        return;
    }
    gemm_epilogue(rows, sum, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

#if defined(__AVX512F__)
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
#else
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
#endif

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .load_rows = load_rows, .tile = tile};

void PATH_GEMM(gemm)(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(sizeof(vfloat)) float a_block[ROWS * DEPTH];
    _Alignas(sizeof(vfloat)) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
