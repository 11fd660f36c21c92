/* I8 GEMM with the I8 matrix multiply extension (armv8.6-a+i8mm): SMMLA multiplies a 2 x 8 block of s8
 * activations (x_u8 - 128) by the transpose of a 2 x 8 block of s8 weights into a 2 x 2 block of int32,
 * 32 products an instruction where SDOT does 16. The epilogue takes 128 times the weights' sums back out
 * with the zero point (gemm_epilogue_neon.h).
 *
 * The driver (blocking, column blocks, int32 partial sums) is gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 4 x 16 outputs lives in 16 q registers over a whole depth block, each the
 *     2 x 2 block of one pair of rows and one pair of columns; a group of eight k loads two registers of
 *     activations (two pairs of rows) and eight of weights (eight pairs of columns) for 16 SMMLA;
 *   - the activations of the tile's rows over one depth block are copied into `a_block` [DEPTH / 8][4][8]
 *     s8 (a pair of rows' group in one register) and reused by every tile of the column block;
 *   - before the epilogue, the 2 x 2 blocks are taken apart into rows of 16 columns. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "gemm_driver.h"
#include "gemm_epilogue_neon.h"
#include "math_neon.h"
#include "paths.h"

enum {
    ROWS = 4,              /* rows of x per tile: two pairs */
    COLUMNS = 16,          /* outputs per tile row: eight pairs */
    VECTORS = COLUMNS / 4, /* q registers of int32 per tile row, in the epilogue */
    GROUP = 8,             /* k values per SMMLA */
    DEPTH = 1024,          /* k values per depth block */
};
_Static_assert(COLUMNS == NEON_ROW_COLUMNS && ROWS <= NEON_TILE_ROWS, "gemm_epilogue_neon.h's tile");

/* ---- Packing ----------------------------------------------------------------------------------- */

static gemm_path_t const path;

size_t kernel_gemm_i8_packed_size_neoni8mm(size_t n, size_t k) {
    return gemm_i8_packed_size(&path, n, k);
}

/* gemm_pack_i8 with groups of eight: [16][8] s8 per group, a pair of columns' groups in one register. */
void kernel_gemm_i8_pack_neoni8mm(void *packed, int8_t const *w, float const *scales, size_t n, size_t k) {
    gemm_pack_i8(&path, packed, w, scales, n, k);
}

/* ---- Microkernel -------------------------------------------------------------------------------- */

/* The blocks of a pair of rows as two rows of 16 columns: row 2p from the first halves (64 bits) of
 * column pairs 2v and 2v + 1, row 2p + 1 from their second halves. */
static inline __attribute__((always_inline)) void rows_of(size_t rows, int32x4_t const blocks[2][COLUMNS / 2],
                                                          int32x4_t acc[ROWS][VECTORS]) {
#pragma GCC unroll 4
    for (size_t r = 0; r < rows; ++r)
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v) {
            int64x2_t left = vreinterpretq_s64_s32(blocks[r / 2][2 * v]),
                      right = vreinterpretq_s64_s32(blocks[r / 2][2 * v + 1]);
            acc[r][v] = vreinterpretq_s32_s64(r % 2 ? vtrn2q_s64(left, right) : vtrn1q_s64(left, right));
        }
}

/* One tile: `rows` (<= ROWS) rows of a_block times one panel's groups of `depth` k values [groups][16][8]
 * s8. The int32 blocks of a depth block that is not the last go to `partial` as they are and come back for
 * the next one. Always inlined with a constant `rows` so the blocks stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, void const *a_block, void const *panel,
                                                       size_t depth, float *partial, bool first, bool last,
                                                       kernel_gemm_t const *g, size_t row, size_t column) {
    size_t const pairs = (rows + 1) / 2;
    int8_t const *a = a_block, *b = panel;
    int32_t *sums = (int32_t *)(void *)partial;
    int32x4_t blocks[2][COLUMNS / 2];
#pragma GCC unroll 2
    for (size_t p = 0; p < pairs; ++p)
#pragma GCC unroll 8
        for (size_t j = 0; j < COLUMNS / 2; ++j)
            blocks[p][j] = first ? vdupq_n_s32(0) : vld1q_s32(sums + (p * COLUMNS / 2 + j) * 4);
    for (size_t s = 0; s < (depth + GROUP - 1) / GROUP; ++s, a += ROWS * GROUP, b += COLUMNS * GROUP) {
        int8x16_t x[2] = {vld1q_s8(a), vld1q_s8(a + 16)};
#pragma GCC unroll 8
        for (size_t j = 0; j < COLUMNS / 2; ++j) {
            int8x16_t w = vld1q_s8(b + 16 * j);
#pragma GCC unroll 2
            for (size_t p = 0; p < pairs; ++p)
                blocks[p][j] = vmmlaq_s32(blocks[p][j], x[p], w);
        }
    }
    if (!last) {
#pragma GCC unroll 2
        for (size_t p = 0; p < pairs; ++p)
#pragma GCC unroll 8
            for (size_t j = 0; j < COLUMNS / 2; ++j)
                vst1q_s32(sums + (p * COLUMNS / 2 + j) * 4, blocks[p][j]);
        return;
    }
    int32x4_t acc[ROWS][VECTORS];
    rows_of(rows, blocks, acc);
    gemm_epilogue_neon_i8(&path, rows, acc, g, row, column);
}

/* ---- Activations -------------------------------------------------------------------------------- */

/* a_block [DEPTH / 8][ROWS][8] s8: group s of row r at (s * ROWS + r) * 8, x_u8 - 128, zero past depth up to
 * the group's end and in the row that completes an odd count's last pair. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    size_t grouped = (depth + GROUP - 1) / GROUP * GROUP;
    for (size_t r = 0; r < (rows + 1) / 2 * 2; ++r) {
        int8_t *to = (int8_t *)a_block + r * GROUP;
        uint8_t const *from = r < rows ? g->x_u8 + (row + r) * g->x_stride + k0 : NULL;
        for (size_t i = 0; i < grouped; ++i)
            to[i / GROUP * ROWS * GROUP + i % GROUP] = from && i < depth ? (int8_t)(from[i] ^ 0x80u) : 0;
    }
}

static gemm_path_t const path = {
    .rows = ROWS, .columns = COLUMNS, .depth = DEPTH, .group = GROUP, .load_rows = load_rows, .tile = tile};

void kernel_gemm_i8_neoni8mm(kernel_gemm_t const *g, size_t n_begin, size_t n_end) {
    _Alignas(16) int8_t a_block[DEPTH * ROWS];
    _Alignas(16) float partial[GEMM_BLOCK_MAX * ROWS];
    gemm_drive(&path, g, n_begin, n_end, a_block, partial);
}
