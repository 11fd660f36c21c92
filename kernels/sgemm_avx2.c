/* F32 GEMM for training with AVX2 FMAs (kernels.h): the driver, its blocking and packing are
 * sgemm_driver.h's; here are the tile, its micro-kernel and the packing of op(b) rows with masked loads.
 * A tile of ROWS x COLUMNS outputs lives in 12 ymm accumulators over a whole depth block (FMA latency 4 or
 * 5 at 2 per cycle needs 8 to 10 independent chains), leaving 4 of the 16 registers for two rows of op(b)
 * and the broadcast of op(a). */
#include <immintrin.h>
#include <stdbool.h>

#include "math_avx2.h"
#include "paths.h"
#include "sgemm_driver.h"

enum {
    ROWS = 6,     /* rows of op(a) per tile */
    COLUMNS = 16, /* columns per tile: two ymm */
};

/* to[0, COLUMNS) = from[0, width), zero past width. */
static void pack_b_row(float *to, float const *from, size_t width) {
    _mm256_store_ps(to, _mm256_maskload_ps(from, columns_mask(0, width)));
    _mm256_store_ps(to + 8, _mm256_maskload_ps(from + 8, columns_mask(8, width)));
}

/* One tile: c[rows][width] = (load ? c : 0) + a_pack[depth][ROWS] . b_panel[depth][COLUMNS], the columns
 * past width masked. A whole tile (width = COLUMNS) needs no masks: held across the depth loop, they
 * would take two of the 16 ymm registers and push accumulators out to the stack. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, float const *b,
                                                       size_t depth, float *c, size_t c_stride, size_t width,
                                                       bool load) {
    bool whole = width == COLUMNS;
    __m256 sum[ROWS][2];
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        float const *from = c + r * c_stride;
        if (!load) {
            sum[r][0] = sum[r][1] = _mm256_setzero_ps();
        } else if (whole) {
            sum[r][0] = _mm256_loadu_ps(from), sum[r][1] = _mm256_loadu_ps(from + 8);
        } else {
            sum[r][0] = _mm256_maskload_ps(from, columns_mask(0, width));
            sum[r][1] = _mm256_maskload_ps(from + 8, columns_mask(8, width));
        }
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROWS, b += COLUMNS) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (size_t r = 0; r < rows; ++r) {
            __m256 x = _mm256_broadcast_ss(a + r);
            sum[r][0] = _mm256_fmadd_ps(x, b0, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(x, b1, sum[r][1]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < rows; ++r) {
        float *to = c + r * c_stride;
        if (whole) {
            _mm256_storeu_ps(to, sum[r][0]), _mm256_storeu_ps(to + 8, sum[r][1]);
            continue;
        }
        _mm256_maskstore_ps(to, columns_mask(0, width), sum[r][0]);
        _mm256_maskstore_ps(to + 8, columns_mask(8, width), sum[r][1]);
    }
}

static sgemm_path_t const path = {
    .rows = ROWS, .row_lanes = ROWS, .columns = COLUMNS, .pack_b_row = pack_b_row, .tile = tile};

void kernel_sgemm_avx2(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    sgemm_drive(&path, s, n_begin, n_end);
}
