/* F32 GEMM for training with NEON FMAs (baseline ARMv8-A Advanced SIMD, kernels.h): the driver, its
 * blocking and packing are sgemm_driver.h's (op(b) rows by its plain copy); here are the tile and its
 * micro-kernel. A tile of ROWS x COLUMNS outputs lives in 24 q-register accumulators over a whole depth
 * block (FMA latency 4 at 2 to 4 per cycle needs 8 to 16 independent chains), leaving 8 of the 32
 * registers for a row of op(b) (four) and the ROWS values of op(a) at one k (two, multiplied by element):
 * a_pack holds ROW_LANES values per k, so that the rows of one k are two vector loads. */
#include <arm_neon.h>
#include <stdbool.h>
#include <string.h>

#include "math_neon.h"
#include "paths.h"
#include "sgemm_driver.h"

enum {
    ROWS = 6,              /* rows of op(a) per tile */
    ROW_LANES = 8,         /* a_pack values per k: rows 0-3, rows 4-5, two lanes unused */
    COLUMNS = 16,          /* columns per tile */
    VECTORS = COLUMNS / 4, /* q registers per tile row */
};
_Static_assert(COLUMNS == NEON_ROW_COLUMNS, "load_columns and store_columns (math_neon.h) move tile rows");
_Static_assert(ROWS == NEON_TILE_ROWS, "fma_rows (math_neon.h) multiplies the tile's rows");

/* One tile: c[rows][count] = (load ? c : 0) + a_pack[depth][ROW_LANES] . b_panel [depth][COLUMNS].
 * Always inlined with a constant `rows` so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, float const *b,
                                                       size_t depth, float *c, size_t c_stride, size_t count,
                                                       bool load) {
    float32x4_t sum[ROWS][VECTORS];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
        load_columns(sum[r], load ? c + r * c_stride : NULL, count);
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROW_LANES, b += COLUMNS) {
        float32x4_t a_low = vld1q_f32(a), a_high = vld1q_f32(a + 4);
#pragma GCC unroll 4
        for (size_t v = 0; v < VECTORS; ++v)
            fma_rows(rows, sum, v, vld1q_f32(b + 4 * v), a_low, a_high);
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r)
        store_columns(c + r * c_stride, count, sum[r]);
}

static sgemm_path_t const path = {
    .rows = ROWS, .row_lanes = ROW_LANES, .columns = COLUMNS, .pack_b_row = NULL, .tile = tile};

void kernel_sgemm_neon(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    sgemm_drive(&path, s, n_begin, n_end);
}
