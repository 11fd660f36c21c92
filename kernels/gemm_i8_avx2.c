/* I8 GEMM with AVX2, for CPUs without a VNNI dot product: `vpmaddwd` multiplies pairs of s16 and adds
 * each pair's products into one int32 lane, exactly, so activations are widened to s16 (0..255) when
 * copied into the tile's block and weights are sign-extended from the packed bytes as they are loaded;
 * 16 multiply-adds in two instructions (with the `vpaddd`), where the BF16 path's FMA does 8 in one and
 * widens its weights too.
 *
 * The micro-kernel is gemm_i8_x86.h's, the driver gemm_driver.h's; here, for y = x . w^T:
 *   - a tile of ROWS x COLUMNS = 6 x 16 outputs lives in 12 ymm accumulators, leaving two registers for
 *     the weights of one pair of k, one for the broadcast pair of a row and one for its products;
 *   - a_block [ROWS][DEPTH] s16 (12 KiB, in L1), reused by every tile of the column block. */
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
    GROUP = 2,    /* k values per int32 lane and step */
    DEPTH = 1024, /* k values per depth block */
};

#define PATH_I8(name) kernel_##name##_avx2

/* A group of a panel, [16][2] int8: columns 0-7, then 8-15, each pair widened to two s16. */
static inline void load_weights(vint w[2], int8_t const *group) {
    w[0] = _mm256_cvtepi8_epi16(_mm_load_si128((__m128i const *)group));
    w[1] = _mm256_cvtepi8_epi16(_mm_load_si128((__m128i const *)(group + 16)));
}

static inline vint dot(vint acc, vint x, vint w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(x, w));
}

/* a_block [ROWS][DEPTH] s16: a_block[r] = x_u8[row + r][k0, k0 + depth) widened, zero up to an even count. */
static void load_rows(void *a_block, kernel_gemm_t const *g, size_t row, size_t rows, size_t k0,
                      size_t depth) {
    for (size_t r = 0; r < rows; ++r) {
        int16_t *to = (int16_t *)a_block + r * DEPTH;
        uint8_t const *from = g->x_u8 + (row + r) * g->x_stride + k0;
        size_t i = 0;
        for (; i + 16 <= depth; i += 16)
            _mm256_store_si256((__m256i *)(to + i),
                               _mm256_cvtepu8_epi16(_mm_loadu_si128((__m128i const *)(from + i))));
        for (; i < depth; ++i)
            to[i] = from[i];
        if (depth % 2) to[depth] = 0;
    }
}

#define LOAD_ROWS load_rows
#include "gemm_i8_x86.h"
