/* I8 GEMM with AVX512-VNNI: `vpdpbusd` multiplies four u8 activations by four s8 weights and adds the four
 * products to one int32 lane, exactly (the sums stay far from 2^31 for k <= KERNEL_I8_DEPTH_MAX), 64
 * multiply-adds an instruction where `vdpbf16ps` does 32.
 *
 * The micro-kernel is gemm_i8_x86.h's, the driver gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 14 x 32 outputs lives in 28 zmm accumulators over a whole depth block,
 *     as in gemm_avx512bf16.c: each group of four k loads two vectors of weights (32 columns of four
 *     bytes) and broadcasts four activation bytes per row, for 28 `vpdpbusd`;
 *   - the activations, quantized per row before the GEMM (quantize_rows), are copied as they are into
 *     `a_block` [ROWS][DEPTH] bytes (14 KiB, in L1) and reused by every tile of the column block.
 * Stack: about 72 KiB (a_block, and the partial sums of a column block when k > DEPTH). */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "gemm_driver.h"
#include "math_avx512.h"
#include "gemm_epilogue.h"
#include "paths.h"

enum {
    ROWS = 14,    /* rows of x per tile */
    COLUMNS = 32, /* outputs per tile row: two zmm of int32 */
    GROUP = 4,    /* k values per int32 lane and step */
    DEPTH = 1024, /* k values per depth block */
};

#define PATH_I8(name) kernel_##name##_avx512vnni

/* A group of a panel, [32][4] int8: columns 0-15, then 16-31. */
static inline void load_weights(vint w[2], int8_t const *group) {
    w[0] = _mm512_load_si512(group);
    w[1] = _mm512_load_si512(group + 64);
}

static inline vint dot(vint acc, vint x, vint w) {
    return _mm512_dpbusd_epi32(acc, x, w);
}

#define LOAD_ROWS load_rows_u8
#include "gemm_i8_x86.h"
