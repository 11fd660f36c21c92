/* The AVX-512 (F, BW, DQ, VL) path of the non-GEMM kernels, 16 F32 lanes per vector. RMSNorm,
 * LayerNorm, softmax, normalize, GELU, their backward passes and attention are vector_driver.h's; here are
 * what it takes from the instruction set (the tail mask, the 16 x 16 transpose and the causal mask of
 * attention), the conversions, whose tails are handled with lane masks too, and the avx512bf16 path's
 * attention, the driver's with BF16 products.
 *
 * The loops marked `#pragma GCC unroll` run over a fixed number of vectors: unrolled, their arrays of
 * vectors stay in registers (gcc -O2 would keep them in memory). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "math_avx512.h"
#include "paths.h"

#define LANES 16

/* All lanes below `left` set (all when left >= 16), for masked loads and stores. */
static inline __mmask16 tail_mask(size_t left) {
    return left >= LANES ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}

/* ---- Attention: the parts vector_driver.h takes from the path ----------------------------------- */

/* In-register transpose of a 16 x 16 block held as 16 rows: interleave pairs of rows, then pairs of
 * pairs within 128-bit lanes, then exchange 128-bit lanes twice. */
static inline void transpose(__m512 rows[LANES]) {
    __m512 t[LANES];
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 2) {
        t[k] = _mm512_unpacklo_ps(rows[k], rows[k + 1]);
        t[k + 1] = _mm512_unpackhi_ps(rows[k], rows[k + 1]);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 4) {
        rows[k] = _mm512_shuffle_ps(t[k], t[k + 2], 0x44);
        rows[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], 0xee);
        rows[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        rows[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], 0xee);
    }
#pragma GCC unroll 16
    for (size_t k = 0; k < LANES; k += 8) {
#pragma GCC unroll 16
        for (size_t c = 0; c < 4; ++c) {
            t[k + c] = _mm512_shuffle_f32x4(rows[k + c], rows[k + 4 + c], 0x88);
            t[k + 4 + c] = _mm512_shuffle_f32x4(rows[k + c], rows[k + 4 + c], 0xdd);
        }
    }
#pragma GCC unroll 16
    for (size_t c = 0; c < LANES / 2; ++c) {
        rows[c] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0x88);
        rows[c + 8] = _mm512_shuffle_f32x4(t[c], t[c + 8], 0xdd);
    }
}

/* Causal attention (for vector_driver.h): query lane i of a block starting at row `first_query` sees key
 * `first_key + j` only when first_key + j <= first_query + i; the other scores become -inf. */
static void mask_future(float scores[][LANES], size_t count, size_t first_key, size_t first_query) {
    __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (size_t j = 0; j < count; ++j) {
        if (first_key + j <= first_query) continue;
        __mmask16 future =
            _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)(first_key + j - first_query)));
        _mm512_store_ps(scores[j],
                        _mm512_mask_mov_ps(_mm512_load_ps(scores[j]), future, _mm512_set1_ps(-INFINITY)));
    }
}

/* kernel_rmsnorm_avx512, kernel_attention_avx512, ...: the kernels vector_driver.h defines. */
#define PATH_KERNEL(name) kernel_##name##_avx512
#include "vector_driver.h"

/* ---- Attention with BF16 products: the avx512bf16 and amx paths' --------------------------------
 * vector_driver.h's attention with both of its products on AVX512-BF16's dot product (vdpbf16ps: each F32
 * lane adds two BF16 products): the blocks' scaled queries, each tile's keys and values and its softmax
 * weights are rounded to BF16 (to nearest even), as PyTorch's bf16 attention rounds them; the scores, the
 * online softmax and the sums stay F32. Pairs of BF16 values share a 32-bit lane: a vector of the queries
 * holds dims 2p and 2p + 1 of each of a block's queries side by side, and is multiplied by a key's dims 2p
 * and 2p + 1 broadcast; a vector of the weights holds keys 2p and 2p + 1 of each query side by side, and is
 * multiplied by those keys' values of one dim broadcast. A tile's keys (rows of BF16), then its values (per
 * pair of keys, per dim, the two values) take turns in one buffer of 8 KiB: tiles of 64 keys for heads to
 * 64 dims, fewer (a multiple of LANES) for wider ones. Where the caller gives scratch and the item has no
 * causal mask, the item's keys and values are converted once, all of them, into the scratch (at 577 rows,
 * 1.35x the speed of converting them for every pair of blocks on a Zen 5), and the tiles read them there.
 * Two blocks of queries share each tile's rounded keys and values where their state fits (heads to 128
 * dims), one block otherwise: 44 KiB of stack. Compiled for AVX512-BF16 by its functions' target attribute;
 * dispatch.c chooses it only where the CPU has AVX512-BF16. A relative-position bias
 * (kernel_attention_t.bias) is added to the F32 scores unrounded, as vector_driver.h adds it. */
#define BF16_TARGET      __attribute__((target("avx512bf16")))
#define BF16_TILE_VALUES 4096 /* BF16 values of the tile's buffer */
#define BF16_SCORE_GROUP 16   /* keys scored together: vdpbf16ps's latency wants more chains than FMA's */
_Static_assert(BF16_SCORE_GROUP == 16 && LANES == 16,
               "kernel_attention_scratch_bytes rounds rows and heads to 16");

/* The 32 BF16 of a and b, rounded to nearest even, alternating: a[0], b[0], a[1], b[1], ... */
static inline BF16_TARGET __m512i bf16_interleaved(__m512 a, __m512 b) {
    static uint16_t const order[2 * LANES] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                              8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(order), (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

/* sum + the dot products of the pairs in `pairs` with the 32-bit pair at `pair` broadcast: vdpbf16ps with
 * its broadcast embedded, one instruction where the compiler would load the broadcast apart. */
static inline BF16_TARGET __m512 dot_broadcast(__m512 sum, __m512bh pairs, void const *pair) {
    __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(sum) : "v"(pairs), "m"(*(uint32_t const *)pair));
    return sum;
}

/* A block's queries, scaled in F32 and rounded: pairs[p] holds dims 2p and 2p + 1 of each of the LANES
 * queries, zero past `rows` and past the head, to the next multiple of LANES dims. */
static inline __attribute__((always_inline)) BF16_TARGET void
load_query_pairs(__m512i pairs[], float const *q, size_t stride, size_t rows, float scale, size_t head) {
    _Alignas(VECTOR_ALIGN) float chunk[LANES][LANES];
    vfloat by = vf_set1(scale);
    for (size_t d = 0; d < head; d += LANES) {
        if (head - d >= LANES)
            load_queries_part(chunk, q + d, stride, rows, by, LANES);
        else
            load_queries_part(chunk, q + d, stride, rows, by, head - d);
        for (size_t i = 0; i < LANES; i += 2)
            pairs[(d + i) / 2] = bf16_interleaved(vf_load(chunk[i]), vf_load(chunk[i + 1]));
    }
}

/* The tile's `count` keys as rows of `padded` BF16 in `keys`, zero past the head, and rows of zeros to the
 * next multiple of BF16_SCORE_GROUP (scored, never read). */
static inline __attribute__((always_inline)) BF16_TARGET void
load_keys(uint16_t *keys, float const *k, size_t stride, size_t count, size_t head, size_t padded) {
    for (size_t j = 0; j < count; ++j)
        for (size_t d = 0; d < head; d += LANES) {
            vfloat key = load_part(k + j * stride + d, head - d < LANES ? head - d : LANES);
            _mm256_store_si256((__m256i *)(keys + j * padded + d), (__m256i)_mm512_cvtneps_pbh(key));
        }
    size_t rows = (count + BF16_SCORE_GROUP - 1) / BF16_SCORE_GROUP * BF16_SCORE_GROUP;
    memset(keys + count * padded, 0, (rows - count) * padded * sizeof(uint16_t));
}

/* scores[j] for the BF16_SCORE_GROUP keys from row `first` of `keys`: the paired queries' dot products. */
static inline __attribute__((always_inline)) BF16_TARGET void score_group_bf16(float scores[][LANES],
                                                                               __m512i const pairs[],
                                                                               uint16_t const *keys,
                                                                               size_t first, size_t padded) {
    vfloat sums[BF16_SCORE_GROUP];
#pragma GCC unroll 16
    for (size_t j = 0; j < BF16_SCORE_GROUP; ++j)
        sums[j] = vf_zero();
    for (size_t p = 0; p < padded / 2; ++p) {
        __m512bh query = (__m512bh)pairs[p];
#pragma GCC unroll 16
        for (size_t j = 0; j < BF16_SCORE_GROUP; ++j)
            sums[j] = dot_broadcast(sums[j], query, keys + (first + j) * padded + 2 * p);
    }
#pragma GCC unroll 16
    for (size_t j = 0; j < BF16_SCORE_GROUP; ++j)
        vf_store(scores[j], sums[j]);
}

/* The tile's values in `values`: per pair of keys, `padded` dims of the two keys' values side by side (a
 * missing last key's 0, 0 past the head). */
static inline __attribute__((always_inline)) BF16_TARGET void
load_values(uint32_t *values, float const *v, size_t stride, size_t count, size_t head, size_t padded) {
    for (size_t j = 0; j < count; j += 2)
        for (size_t d = 0; d < head; d += LANES) {
            size_t width = head - d < LANES ? head - d : LANES;
            vfloat a = load_part(v + j * stride + d, width);
            vfloat b = j + 1 < count ? load_part(v + (j + 1) * stride + d, width) : vf_zero();
            _mm512_store_si512(values + j / 2 * padded + d, bf16_interleaved(a, b));
        }
}

/* A block's weights paired: keys 2p and 2p + 1 of each query side by side, a missing last key's weight 0. */
static inline __attribute__((always_inline)) BF16_TARGET void
pair_weights(__m512i weights[], float const scores[][LANES], size_t count) {
    for (size_t j = 0; j < count; j += 2)
        weights[j / 2] =
            bf16_interleaved(vf_load(scores[j]), j + 1 < count ? vf_load(scores[j + 1]) : vf_zero());
}

/* A block's sums (rescaled by `correction`) += the paired weights times the paired values, LANES dims at a
 * time. */
static inline __attribute__((always_inline)) BF16_TARGET void
add_weighted_values(float sums_of[][LANES], vfloat correction, __m512i const weights[],
                    uint32_t const *values, size_t count, size_t padded) {
    for (size_t chunk = 0; chunk < padded; chunk += LANES) {
        vfloat sums[LANES];
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            sums[d] = vf_mul(vf_load(sums_of[chunk + d]), correction);
        for (size_t p = 0; p < (count + 1) / 2; ++p) {
            __m512bh weight = (__m512bh)weights[p];
#pragma GCC unroll 16
            for (size_t d = 0; d < LANES; ++d)
                sums[d] = dot_broadcast(sums[d], weight, values + p * padded + chunk + d);
        }
#pragma GCC unroll 16
        for (size_t d = 0; d < LANES; ++d)
            vf_store(sums_of[chunk + d], sums[d]);
    }
}

/* An item's keys and values in load_keys' and load_values' layouts, converted once into the caller's
 * scratch (kernel_attention_t.scratch), from the item's first row on. */
typedef struct item_bf16 {
    uint16_t const *keys;
    uint32_t const *values;
} item_bf16_t;

/* The item's keys and values, rows [first, end), converted into a->scratch where they fit and the item has
 * no causal mask; false otherwise. Without a mask every tile starts at an even distance from the item's
 * first row and the last one ends at the item's end, so that each tile reads what load_keys and
 * load_values would have written for it alone: the same bits. */
static inline __attribute__((always_inline)) BF16_TARGET bool
convert_item(kernel_attention_t const *a, size_t first, size_t end, size_t head, item_bf16_t *item) {
    size_t const padded = (head + LANES - 1) / LANES * LANES, rows = end - first;
    size_t const key_rows = (rows + BF16_SCORE_GROUP - 1) / BF16_SCORE_GROUP * BF16_SCORE_GROUP;
    size_t const key_bytes = key_rows * padded * sizeof(uint16_t); /* kernel_attention_scratch_bytes' keys */
    if (a->causal || !a->scratch || kernel_attention_scratch_bytes(rows, head) > a->scratch_bytes)
        return false;
    uint16_t *keys = a->scratch;
    uint32_t *values = (uint32_t *)(void *)((char *)a->scratch + key_bytes);
    load_keys(keys, a->k + first * a->stride, a->stride, rows, head, padded);
    load_values(values, a->v + first * a->stride, a->stride, rows, head, padded);
    *item = (item_bf16_t){keys, values};
    return true;
}

/* `blocks` (1 or 2) blocks of LANES queries from first_query, rows[b] queries in block b, of the item whose
 * keys are rows [first_key, end_key). Every lane sees the item's first key in the first tile, so its running
 * max is finite from then on, and a later tile whose keys are all in a causal lane's future adds nothing. */
static inline __attribute__((always_inline)) BF16_TARGET void
attend_blocks_bf16(kernel_attention_t const *a, size_t first_query, size_t const rows[2], size_t blocks,
                   size_t first_key, size_t end_key, size_t head, item_bf16_t const *item) {
    size_t const padded = (head + LANES - 1) / LANES * LANES, pair_count = padded / 2;
    size_t const fits = BF16_TILE_VALUES / padded / LANES * LANES;
    size_t const tile_keys = fits < ATTENTION_TILE ? fits : ATTENTION_TILE;
    __m512i pairs[KERNEL_HEAD_MAX / 2], weights[ATTENTION_TILE / 2]; /* block b's pairs from b pair_count */
    _Alignas(VECTOR_ALIGN) float scores[2][ATTENTION_TILE][LANES];
    _Alignas(VECTOR_ALIGN) float values[KERNEL_HEAD_MAX][LANES]; /* block b's sums from b padded */
    _Alignas(64) uint16_t tile[BF16_TILE_VALUES];
    vfloat max[2], sum[2];
    memset(values, 0, blocks * padded * sizeof values[0]);
    for (size_t b = 0; b < blocks; ++b) {
        max[b] = vf_set1(-INFINITY);
        sum[b] = vf_zero();
        load_query_pairs(pairs + b * pair_count, a->q + (first_query + b * LANES) * a->stride, a->stride,
                         rows[b], a->scale, head);
    }
    for (size_t first = first_key; first < end_key; first += tile_keys) {
        size_t count = end_key - first < tile_keys ? end_key - first : tile_keys;
        uint16_t const *keys = tile;
        if (item)
            keys = item->keys + (first - first_key) * padded;
        else
            load_keys(tile, a->k + first * a->stride, a->stride, count, head, padded);
        for (size_t b = 0; b < blocks; ++b)
            for (size_t j = 0; j < count; j += BF16_SCORE_GROUP)
                score_group_bf16(scores[b] + j, pairs + b * pair_count, keys, j, padded);
        uint32_t const *tile_values = (uint32_t const *)(void const *)tile;
        if (item)
            tile_values = item->values + (first - first_key) / 2 * padded;
        else
            load_values((uint32_t *)(void *)tile, a->v + first * a->stride, a->stride, count, head, padded);
        for (size_t b = 0; b < blocks; ++b) {
            if (a->bias) add_position_bias(scores[b], a->bias, count, first, first_query + b * LANES);
            if (a->causal) mask_future(scores[b], count, first, first_query + b * LANES);
            vfloat correction = tile_weights(&max[b], &sum[b], scores[b], count);
            pair_weights(weights, scores[b], count);
            add_weighted_values(values + b * padded, correction, weights, tile_values, count, padded);
        }
    }
    for (size_t b = 0; b < blocks; ++b)
        store_block(a->out + (first_query + b * LANES) * a->out_stride, a->out_stride, values + b * padded,
                    sum[b], rows[b], head);
}

/* The blocks of one item, two at a time where two blocks' state fits. */
static inline __attribute__((always_inline)) BF16_TARGET void attend_item_bf16(kernel_attention_t const *a,
                                                                               size_t item, size_t head) {
    size_t first = a->offsets[item], end = a->offsets[item + 1];
    size_t const padded = (head + LANES - 1) / LANES * LANES, most = padded <= KERNEL_HEAD_MAX / 2 ? 2 : 1;
    item_bf16_t converted;
    item_bf16_t const *whole = convert_item(a, first, end, head, &converted) ? &converted : NULL;
    for (size_t block = first; block < end; block += most * LANES) {
        size_t rows[2] = {end - block < LANES ? end - block : LANES, 0};
        if (most == 2 && block + LANES < end)
            rows[1] = end - block - LANES < LANES ? end - block - LANES : LANES;
        size_t blocks = rows[1] ? 2 : 1, last = block + (blocks - 1) * LANES + rows[blocks - 1];
        attend_blocks_bf16(a, block, rows, blocks, first, a->causal ? last : end, head, whole);
    }
}

BF16_TARGET void kernel_attention_avx512bf16(kernel_attention_t const *attention, size_t item_begin,
                                             size_t item_end) {
    for (size_t item = item_begin; item < item_end; ++item) {
        if (attention->head == KERNEL_HEAD)
            attend_item_bf16(attention, item, KERNEL_HEAD);
        else
            attend_item_bf16(attention, item, attention->head);
    }
}

/* ---- Conversions -------------------------------------------------------------------------------- */

void kernel_bf16_to_f32_avx512(float *out, uint16_t const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, x + i));
        _mm512_mask_storeu_ps(out + i, mask, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
}

/* The bits of f32_to_bf16 (kernels.h) for 16 values: round to nearest even, a NaN kept quiet. */
static inline __m256i bf16_of(__m512 x) {
    __m512i bits = _mm512_castps_si512(x);
    __m512i high = _mm512_srli_epi32(bits, 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
    __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

void kernel_f32_to_bf16_avx512(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        _mm256_mask_storeu_epi16(out + i, mask, bf16_of(_mm512_maskz_loadu_ps(mask, x + i)));
    }
}

/* F16C rounds to nearest even, subnormal halves included, exactly as the scalar converter. */
static void convert_f16(uint16_t *out, float const *x, size_t n) {
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m256i half = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(mask, x + i),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + i, mask, half);
    }
}

/* round(x) half away from zero, for |x| < 2^23: the fraction |x| - trunc|x| is exact. */
static inline __m512 round_half_away(__m512 x) {
    __m512 magnitude = _mm512_abs_ps(x);
    __m512 whole = _mm512_roundscale_ps(magnitude, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(magnitude, whole), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    whole = _mm512_mask_add_ps(whole, up, whole, _mm512_set1_ps(1.0f));
    __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(whole), sign));
}

/* Per-row I8 as kernel_convert_scalar: scale = max|x| / 127, q = round(x / scale), a zero row all 0. */
static void convert_i8(int8_t *out, float const *x, size_t n, float *scale) {
    __m512 max = _mm512_setzero_ps();
    for (size_t i = 0; i < n; i += LANES)
        max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_maskz_loadu_ps(tail_mask(n - i), x + i)));
    float largest = _mm512_reduce_max_ps(max);
    *scale = largest / 127.0f;
    if (largest == 0.0f) {
        memset(out, 0, n);
        return;
    }
    __m512 by = _mm512_set1_ps(*scale);
    for (size_t i = 0; i < n; i += LANES) {
        __mmask16 mask = tail_mask(n - i);
        __m512 q = round_half_away(_mm512_div_ps(_mm512_maskz_loadu_ps(mask, x + i), by));
        _mm_mask_storeu_epi8(out + i, mask, _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
    }
}

/* ---- I8 weights ---------------------------------------------------------------------------------- */

/* kernel_quantize_weights, bitwise: the largest BF16 bits without their sign 32 at a time, then per 16
 * weights the scalar's division, rounding half away from zero (exact, as there) and clamp. */
void kernel_quantize_weights_avx512(int8_t *q, float *scale, uint16_t const *w, size_t k) {
    __m512i const magnitude = _mm512_set1_epi16(0x7fff);
    __m512i largest = _mm512_setzero_si512();
    for (size_t i = 0; i < k; i += 2 * LANES) {
        __mmask32 mask = k - i >= 2 * LANES ? ~(__mmask32)0 : (__mmask32)((1u << (k - i)) - 1u);
        largest =
            _mm512_max_epu16(largest, _mm512_and_si512(_mm512_maskz_loadu_epi16(mask, w + i), magnitude));
    }
    __m256i half = _mm256_max_epu16(_mm512_castsi512_si256(largest), _mm512_extracti64x4_epi64(largest, 1));
    __m128i quarter = _mm_max_epu16(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
    /* the largest of 8 as 0xffff less the smallest of their complements (phminposuw) */
    __m128i smallest = _mm_minpos_epu16(_mm_xor_si128(quarter, _mm_set1_epi16(-1)));
    if (!kernel_weights_scale((uint16_t)(0xffffu - (uint16_t)_mm_cvtsi128_si32(smallest)), scale)) {
        memset(q, 0, k);
        return;
    }
    __m512 divisor = _mm512_set1_ps(*scale);
    __m512i const low = _mm512_set1_epi32(-127), high = _mm512_set1_epi32(127);
    for (size_t i = 0; i < k; i += LANES) {
        __mmask16 mask = tail_mask(k - i);
        __m512i bits = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, w + i));
        __m512 ratio = _mm512_div_ps(_mm512_castsi512_ps(_mm512_slli_epi32(bits, 16)), divisor);
        __m512i value = _mm512_cvttps_epi32(round_half_away(ratio));
        value = _mm512_min_epi32(_mm512_max_epi32(value, low), high);
        _mm_mask_storeu_epi8(q + i, mask, _mm512_cvtepi32_epi8(value));
    }
}

/* ---- I8 activations ------------------------------------------------------------------------------ */

/* A row's range for quantize_rows: min and max over its k values (and 0), exact in any order, in two chains
 * of two vectors each, with the tail masked (masked lanes load 0, which holds in the range). `finite` is
 * whether no value is a NaN or an infinity: a sum of x * 0, which is NaN exactly then. */
static bool row_range(float const *x, size_t k, float *low, float *high) {
    __m512 const zero = _mm512_setzero_ps();
    __m512 lo[2] = {zero, zero}, hi[2] = {zero, zero}, odd[2] = {zero, zero};
    size_t i = 0;
    for (; i + 2 * LANES <= k; i += 2 * LANES) {
#pragma GCC unroll 2
        for (size_t j = 0; j < 2; ++j) {
            __m512 v = _mm512_loadu_ps(x + i + j * LANES);
            lo[j] = _mm512_min_ps(lo[j], v);
            hi[j] = _mm512_max_ps(hi[j], v);
            odd[j] = _mm512_fmadd_ps(v, zero, odd[j]);
        }
    }
    for (; i < k; i += LANES) {
        __m512 v = _mm512_maskz_loadu_ps(tail_mask(k - i), x + i);
        lo[0] = _mm512_min_ps(lo[0], v);
        hi[0] = _mm512_max_ps(hi[0], v);
        odd[0] = _mm512_fmadd_ps(v, zero, odd[0]);
    }
    *low = _mm512_reduce_min_ps(_mm512_min_ps(lo[0], lo[1]));
    *high = _mm512_reduce_max_ps(_mm512_max_ps(hi[0], hi[1]));
    __m512 sum = _mm512_add_ps(odd[0], odd[1]);
    return !_mm512_cmp_ps_mask(sum, sum, _CMP_UNORD_Q);
}

/* round(v by) + zero as int32, rounded to nearest even as rintf does. */
static inline __m512i quantized(__m512 v, __m512 by, __m512i zero) {
    return _mm512_add_epi32(
        _mm512_cvt_roundps_epi32(_mm512_mul_ps(v, by), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zero);
}

/* quantize_rows as kernel_quantize_rows_scalar computes it: x inv is one rounding, and the conversion rounds
 * to nearest even. 64 values at a time narrow to bytes by two saturating packs (int32 to int16, then to
 * unsigned bytes: the clamp to [0, 255]), which interleave the four vectors' 128-bit lanes; a permute puts
 * their 32-bit groups back in order. The tail clamps and narrows 16 values at a time. */
void kernel_quantize_rows_avx512(uint8_t *q, size_t q_stride, float *scales, int32_t *zeros, float const *x,
                                 size_t x_stride, size_t rows, size_t k) {
    __m512i const order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for (size_t r = 0; r < rows; ++r, q += q_stride, x += x_stride) {
        float lo, hi, inv;
        bool finite = row_range(x, k, &lo, &hi);
        if (!kernel_quantize_range(lo, hi, finite, &inv, &zeros[r], &scales[r])) {
            memset(q, 0, k);
            continue;
        }
        __m512 by = _mm512_set1_ps(inv);
        __m512i zero = _mm512_set1_epi32(zeros[r]);
        size_t i = 0;
        for (; i + 4 * LANES <= k; i += 4 * LANES) {
            __m512i v[4];
#pragma GCC unroll 4
            for (size_t j = 0; j < 4; ++j)
                v[j] = quantized(_mm512_loadu_ps(x + i + j * LANES), by, zero);
            __m512i bytes =
                _mm512_packus_epi16(_mm512_packs_epi32(v[0], v[1]), _mm512_packs_epi32(v[2], v[3]));
            _mm512_storeu_si512(q + i, _mm512_permutexvar_epi32(order, bytes));
        }
        __m512i const top = _mm512_set1_epi32(255);
        for (; i < k; i += LANES) {
            __mmask16 mask = tail_mask(k - i);
            __m512i value = quantized(_mm512_maskz_loadu_ps(mask, x + i), by, zero);
            value = _mm512_min_epi32(_mm512_max_epi32(value, _mm512_setzero_si512()), top);
            _mm_mask_storeu_epi8(q + i, mask, _mm512_cvtepi32_epi8(value));
        }
    }
}

static kernel_converters_t const converters = {kernel_f32_to_bf16_avx512, convert_f16, convert_i8};

void kernel_convert_avx512(void *out, float const *x, size_t n, uform_scalar_t scalar, float *scale) {
    kernel_convert_by(&converters, out, x, n, scalar, scale);
}
