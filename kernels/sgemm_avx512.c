/* F32 GEMM for training with AVX-512 FMAs (kernels.h): the driver, its blocking and packing are
 * sgemm_driver.h's; here are the tile, its micro-kernel and the packing of op(b) rows with masked loads.
 * A tile of ROWS x COLUMNS outputs lives in 24 zmm accumulators over a whole depth block (FMA latency 4 at
 * 2 per cycle needs 8 or more independent chains), leaving registers for two rows of op(b) and the
 * broadcast of op(a). */
#include <immintrin.h>
#include <stdbool.h>

#include "math_avx512.h"
#include "paths.h"
#include "sgemm_driver.h"

enum {
    ROWS = 12,    /* rows of op(a) per tile */
    COLUMNS = 32, /* columns per tile: two zmm */
};

/* to[0, COLUMNS) = from[0, width), zero past width. */
static void pack_b_row(float *to, float const *from, size_t width) {
    _mm512_store_ps(to, _mm512_maskz_loadu_ps(columns_mask(0, width), from));
    _mm512_store_ps(to + 16, _mm512_maskz_loadu_ps(columns_mask(16, width), from + 16));
}

/* One tile: c[rows][width] = (load ? c : 0) + a_pack[depth][ROWS] . b_panel[depth][COLUMNS], the columns
 * past width masked. */
static inline __attribute__((always_inline)) void tile(size_t rows, float const *a, float const *b,
                                                       size_t depth, float *c, size_t c_stride, size_t width,
                                                       bool load) {
    __mmask16 low = columns_mask(0, width), high = columns_mask(16, width);
    __m512 sum[ROWS][2];
#pragma GCC unroll 12
    for (size_t r = 0; r < rows; ++r) {
        sum[r][0] = load ? _mm512_maskz_loadu_ps(low, c + r * c_stride) : _mm512_setzero_ps();
        sum[r][1] = load ? _mm512_maskz_loadu_ps(high, c + r * c_stride + 16) : _mm512_setzero_ps();
    }
#pragma GCC unroll 2
    for (size_t i = 0; i < depth; ++i, a += ROWS, b += COLUMNS) {
        __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (size_t r = 0; r < rows; ++r) {
            __m512 x = _mm512_set1_ps(a[r]);
            sum[r][0] = _mm512_fmadd_ps(x, b0, sum[r][0]);
            sum[r][1] = _mm512_fmadd_ps(x, b1, sum[r][1]);
        }
    }
#pragma GCC unroll 12
    for (size_t r = 0; r < rows; ++r) {
        _mm512_mask_storeu_ps(c + r * c_stride, low, sum[r][0]);
        _mm512_mask_storeu_ps(c + r * c_stride + 16, high, sum[r][1]);
    }
}

static sgemm_path_t const path = {
    .rows = ROWS, .row_lanes = ROWS, .columns = COLUMNS, .pack_b_row = pack_b_row, .tile = tile};

void kernel_sgemm_avx512(kernel_sgemm_t const *s, size_t n_begin, size_t n_end) {
    sgemm_drive(&path, s, n_begin, n_end);
}
