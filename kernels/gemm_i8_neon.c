/* I8 GEMM with NEON: activations as s8 (x_u8 - 128) times s8 weights, four products summed into each int32
 * lane. Compiled twice: with GEMM_I8_SDOT for the dot product extension (armv8.2-a+dotprod:
 * kernel_gemm_i8_neondot), one SDOT per four products a lane; and for baseline ARMv8-A (kernel_gemm_i8_neon),
 * where SMULL and two pairwise additions compute the same exact sums. The epilogue takes 128 times the
 * weights' sums back out with the zero point (gemm_epilogue_neon.h).
 *
 * The driver (blocking, column blocks, int32 partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 6 x 16 outputs lives in 24 q-register accumulators over a whole depth
 *     block, leaving 8 of the 32 registers for the weights of one group of four k (four registers of four
 *     columns each) and the activations (two);
 *   - the activations of the tile's rows over one depth block are copied transposed into `a_block`
 *     [DEPTH / 4][8][4] s8: one group of four k of rows 0-3, then of rows 4-5 (two lanes unused), so that
 *     SDOT by element multiplies a row's group with four columns' groups. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "gemm_driver.h"
#include "gemm_epilogue_neon.h"
#include "math_neon.h"
#include "paths.h"

enum {
    ROWS = 6,              /* rows of x per tile */
    ROW_LANES = 8,         /* a_block groups per k group: rows 0-3, rows 4-5, two unused */
    COLUMNS = 16,          /* outputs per tile row */
    VECTORS = COLUMNS / 4, /* q registers of int32 per tile row */
    GROUP = 4,             /* k values per int32 lane and step */
    DEPTH = 1024,          /* k values per depth block */
};
_Static_assert(COLUMNS == NEON_ROW_COLUMNS && ROWS == NEON_TILE_ROWS, "gemm_epilogue_neon.h's tile");

#if defined(GEMM_I8_SDOT)
#define PATH_I8(name) kernel_##name##_neondot

/* acc[i] += the four products of w's group i with the group in lane `lane` of x. */
#define DOT_LANE(acc, w, x, lane) vdotq_laneq_s32(acc, w, x, lane)
#else
#define PATH_I8(name) kernel_##name##_neon

/* SDOT by element without the extension: the group broadcast, SMULL into 16-bit products (each at most
 * 2^14), then pairs added into 32 bits and pairs of those: the four products of each lane, exactly. */
static inline int32x4_t dot(int32x4_t acc, int8x16_t w, int8x16_t x) {
    int16x8_t low = vmull_s8(vget_low_s8(w), vget_low_s8(x)), high = vmull_high_s8(w, x);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(low), vpaddlq_s16(high)));
}

#define DOT_LANE(acc, w, x, lane)                                                                            \
    dot(acc, w, vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), lane)))
#endif

/* ---- Packing ----------------------------------------------------------------------------------- */

static gemm_path_t const path;

size_t PATH_I8(gemm_i8_packed_size)(size_t n, size_t k) {
    return gemm_i8_packed_size(&path, n, k);
}

void PATH_I8(gemm_i8_pack)(void *packed, int8_t const *w, float const *scales, size_t n, size_t k) {
    gemm_pack_i8(&path, packed, w, scales, n, k);
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* acc[r][v] += w (four columns' groups) times row r's group, for the tile's `rows` rows: lane r of x_low,
 * then lane r - 4 of x_high (lane numbers are immediates: one line per row). */
static inline __attribute__((always_inline)) void dot_rows(size_t rows, int32x4_t acc[ROWS][VECTORS],
                                                           size_t v, int8x16_t w, int8x16_t x_low,
                                                           int8x16_t x_high) {
    acc[0][v] = DOT_LANE(acc[0][v], w, x_low, 0);
    if (rows > 1) acc[1][v] = DOT_LANE(acc[1][v], w, x_low, 1);
    if (rows > 2) acc[2][v] = DOT_LANE(acc[2][v], w, x_low, 2);
    if (rows > 3) acc[3][v] = DOT_LANE(acc[3][v], w, x_low, 3);
    if (rows > 4) acc[4][v] = DOT_LANE(acc[4][v], w, x_high, 0);
    if (rows > 5) acc[5][v] = DOT_LANE(acc[5][v], w, x_high, 1);
}

/* A tile row's int32 partial sums [COLUMNS] from `from`, or zeros where it is NULL (before the first depth
 * block), and back: as load_columns and store_columns (math_neon.h) move the F32 ones. */
static inline void load_sums(int32x4_t v[VECTORS], int32_t const *from) {
#pragma GCC unroll 4
    for (size_t i = 0; i < VECTORS; ++i)
        v[i] = from ? vld1q_s32(from + 4 * i) : vdupq_n_s32(0);
}

static inline void store_sums(int32_t *to, int32x4_t const v[VECTORS]) {
#pragma GCC unroll 4
    for (size_t i = 0; i < VECTORS; ++i)
        vst1q_s32(to + 4 * i, v[i]);
}

/* One tile: `rows` (<= ROWS) rows of a_block times one panel's groups of `depth` k values [groups][16][4]
 * s8. int32 partial sums of a depth block that is not the last go to `partial` [ROWS][COLUMNS] and come
 * back for the next one. Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    int8_t const *a = a_block, *b = panel;
    int32_t *sums = (int32_t *)(void *)partial;
    int32x4_t acc[ROWS][VECTORS];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
        load_sums(acc[r], first ? NULL : sums + r * COLUMNS);
#pragma GCC unroll 2
    for (size_t p = 0; p < (depth + GROUP - 1) / GROUP; ++p, a += ROW_LANES * GROUP, b += COLUMNS * GROUP) {
        int8x16_t x_low = vld1q_s8(a), x_high = vld1q_s8(a + 16);
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            dot_rows(rows, acc, v, vld1q_s8(b + 16 * v), x_low, x_high);
    }
    if (!last) {
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r)
            store_sums(sums + r * COLUMNS, acc[r]);
        return;
    }
    gemm_epilogue_neon_i8(&path, rows, acc, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

/* a_block [DEPTH / 4][ROW_LANES][4] s8: group p of row r at (p * ROW_LANES + r) * 4, x_u8 - 128, zero past
 * depth up to the group's end. The lanes of rows past `rows` are never multiplied. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        int8_t *to = (int8_t *)a_block + r * GROUP;
        uint8_t const *from = g->x_u8 + (row + r) * g->x_stride + k0;
        for (size_t i = 0; i < (depth + GROUP - 1) / GROUP * GROUP; ++i)
            to[i / GROUP * ROW_LANES * GROUP + i % GROUP] = i < depth ? (int8_t)(from[i] ^ 0x80u) : 0;
    }
}

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .group = GROUP, .load_rows = load_rows, .tile = tile};

void PATH_I8(gemm_i8)(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(16) int8_t a_block[DEPTH * ROW_LANES];
    _Alignas(16) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
