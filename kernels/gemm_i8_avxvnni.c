/* I8 GEMM with AVX-VNNI (256-bit, VEX: Alder Lake and later without AVX-512): `vpdpbusd` on ymm multiplies
 * four u8 activations by four s8 weights and adds the four products to one int32 lane, exactly.
 *
 * The micro-kernel is gemm_i8_x86.h's, the driver gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 6 x 16 outputs lives in 12 ymm accumulators over a whole depth block,
 *     leaving 3 of the 16 registers VEX encodes for two vectors of weights and one broadcast;
 *   - the activations, quantized per row before the GEMM, are copied as they are into `a_block`
 *     [ROWS][DEPTH] bytes (6 KiB) and reused by every tile of the column block.
 * Compiled twice: for AVX-VNNI (kernel_gemm_i8_avxvnni), and with GEMM_I8_EVEX for AVX512-VNNI with
 * AVX512-VL, where the same intrinsic's instruction is EVEX-encoded (kernel_gemm_i8_avxvnni_evex), so that
 * CPUs with AVX-512 but without AVX-VNNI (Zen 4) check this code against the scalar path. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "gemm_driver.h"
#include "math_avx2.h"
#include "gemm_epilogue.h"
#include "paths.h"

enum {
    ROWS = 6,     /* rows of x per tile */
    COLUMNS = 16, /* outputs per tile row: two ymm of int32 */
    GROUP = 4,    /* k values per int32 lane and step */
    DEPTH = 1024, /* k values per depth block */
};

/* A group of a panel, [16][4] int8: columns 0-7, then 8-15. */
static inline void load_weights(vint w[2], int8_t const *group) {
    w[0] = _mm256_load_si256((__m256i const *)group);
    w[1] = _mm256_load_si256((__m256i const *)(group + 32));
}

#if defined(GEMM_I8_EVEX)
#define PATH_I8(name) kernel_##name##_avxvnni_evex

static inline vint dot(vint acc, vint x, vint w) {
    return _mm256_dpbusd_epi32(acc, x, w);
}
#else
#define PATH_I8(name) kernel_##name##_avxvnni

static inline vint dot(vint acc, vint x, vint w) {
    return _mm256_dpbusd_avx_epi32(acc, x, w);
}
#endif

#define LOAD_ROWS load_rows_u8
#include "gemm_i8_x86.h"
