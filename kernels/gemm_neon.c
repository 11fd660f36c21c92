/* BF16-weight GEMM with NEON F32 FMAs (baseline ARMv8-A Advanced SIMD): weights are widened to F32 on the
 * fly (a BF16 is the high half of an F32: one SHLL by 16), activations stay F32.
 *
 * The driver (blocking, column blocks, partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS outputs lives in 24 q-register accumulators over a whole depth block (FMA
 *     latency 4 at 2 to 4 per cycle needs 8 to 16 independent chains), leaving 8 of the 32 registers for
 *     the weights of one k (two loaded, four widened) and the activations of one k (two);
 *   - the activations of the tile's rows over one depth block are copied transposed into `a_block`
 *     [DEPTH][8] F32 (16 KiB, in L1): the 6 rows of one k are two vector loads, each row then multiplied
 *     by element (FMLA v.s[lane]); scalar broadcasts would need 6 registers and spill accumulators. The
 *     block is reused by every tile of the column block.
 * Each output is the same chain of FMAs over k in order, whatever tile, block or thread computes it,
 * so splitting the columns between threads never changes a bit. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "gemm_driver.h"
#include "gemm_epilogue_neon.h"
#include "math_neon.h"
#include "paths.h"

enum {
    ROWS = 6,              /* rows of x per tile */
    ROW_LANES = 8,         /* a_block values per k: rows 0-3, rows 4-5, two lanes unused */
    COLUMNS = 16,          /* outputs per tile row */
    VECTORS = COLUMNS / 4, /* q registers of F32 per tile row */
    DEPTH = 512,           /* k values per depth block */
};
_Static_assert(COLUMNS == NEON_ROW_COLUMNS, "load_columns and store_columns (math_neon.h) move tile rows");
_Static_assert(ROWS == NEON_TILE_ROWS, "fma_rows (math_neon.h) multiplies the tile's rows");

/* ---- Packing ----------------------------------------------------------------------------------- */

/* For each depth block of DEPTH k values (the last one shorter), for each panel of COLUMNS columns:
 * [depth][COLUMNS] BF16, lane c of row k holding w[c0 + c][k], so that two loads and four SHLLs give a
 * row of the panel as four vectors of F32. Columns past n are zero. The panels of one depth block follow
 * each other, so that the tiles of a row block read one sequential stream. */
static size_t panels_of(size_t n) {
    return (n + COLUMNS - 1) / COLUMNS;
}

size_t kernel_gemm_packed_size_neon(size_t n, size_t k) {
    return panels_of(n) * k * COLUMNS * sizeof(uint16_t);
}

void kernel_gemm_pack_neon(void *packed, uint16_t const *w, size_t n, size_t k) {
    uint16_t *out = packed;
    for (size_t k0 = 0; k0 < k; k0 += DEPTH) {
        size_t depth = k - k0 < DEPTH ? k - k0 : DEPTH;
        for (size_t panel = 0; panel < panels_of(n); ++panel)
            for (size_t i = k0; i < k0 + depth; ++i)
                for (size_t lane = 0; lane < COLUMNS; ++lane, ++out) {
                    size_t column = panel * COLUMNS + lane;
                    *out = column < n ? w[column * k + i] : 0u;
                }
    }
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* A BF16 vector widened to F32: the 4 low halves, or the 4 high halves. */
static inline float32x4_t widen_low(uint16x8_t halves) {
    return vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(halves), 16));
}

static inline float32x4_t widen_high(uint16x8_t halves) {
    return vreinterpretq_f32_u32(vshll_high_n_u16(halves, 16));
}

/* One tile: `rows` (<= ROWS) rows of a_block [depth][ROW_LANES] times one panel's `depth` rows [depth][16]
 * BF16. Partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come back
 * for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    float const *a = a_block;
    uint16_t const *b = panel;
    float32x4_t sum[ROWS][VECTORS];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
        load_columns(sum[r], first ? NULL : partial + r * COLUMNS, COLUMNS);
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROW_LANES, b += COLUMNS) {
        float32x4_t x_low = vld1q_f32(a), x_high = vld1q_f32(a + 4);
        uint16x8_t low = vld1q_u16(b), high = vld1q_u16(b + 8);
        fma_rows(rows, sum, 0, widen_low(low), x_low, x_high);
        fma_rows(rows, sum, 1, widen_high(low), x_low, x_high);
        fma_rows(rows, sum, 2, widen_low(high), x_low, x_high);
        fma_rows(rows, sum, 3, widen_high(high), x_low, x_high);
    }
    if (!last) {
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r)
            store_columns(partial + r * COLUMNS, COLUMNS, sum[r]);
        return;
    }
    gemm_epilogue_neon(rows, sum, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

/* a_block [DEPTH][ROW_LANES]: a_block[i][r] = x[row + r][k0 + i] in F32, for i < depth and r < rows: a
 * strided copy, a few stores per k against the 24 FMAs per k of every tile of the column block. The other
 * lanes are loaded with the rows but never multiplied. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        float *to = (float *)a_block + r;
        if (g->x_bf16) {
            uint16_t const *from = g->x_bf16 + (row + r) * g->x_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                to[i * ROW_LANES] = bf16_to_f32(from[i]);
        } else {
            float const *from = g->x + (row + r) * g->x_stride + k0;
            for (size_t i = 0; i < depth; ++i)
                to[i * ROW_LANES] = from[i];
        }
    }
}

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .load_rows = load_rows, .tile = tile};

void kernel_gemm_neon(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(16) float a_block[DEPTH * ROW_LANES];
    _Alignas(16) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
