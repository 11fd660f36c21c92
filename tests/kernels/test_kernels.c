/* The vector kernels (everything but GEMM): the scalar path against independent double-precision formulas
 * and known bit patterns, then every SIMD path this CPU runs against the scalar path within the
 * tolerances of kernels.h (bitwise where it says so), on random inputs from a fixed seed and on sizes
 * around the vector widths. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "kernel_fixtures.h"
#include "kernels.h"

static size_t const sizes[] = {1, 3, 15, 16, 17, 63, 64, 65, 100, 768, 1000};

/* ---- Helpers ------------------------------------------------------------------------------------ */

static float float_of(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

static uint32_t bits_of(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* The SIMD paths this CPU and build run; skips the test when there are none. */
/* The value of an F16 bit pattern (exponent 31 read as a normal one, so 0x7c00 gives 65536). */
static double half_value(uint16_t half) {
    int exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
    double magnitude = exponent ? ldexp(1024 + mantissa, exponent - 25) : ldexp(mantissa, -24);
    return half & 0x8000 ? -magnitude : magnitude;
}

/* ---- Scalar path against formulas --------------------------------------------------------------- */

static void scalar_rmsnorm_matches_formula(void **state) {
    (void)state;
    kernels_t const *scalar = kernels_scalar();
    random_seed(1);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s], rows = 3;
        float *x = floats_uniform(rows * n, -2.0f, 2.0f), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *y = floats_filled(rows * n, 0.0f);
        scalar->rmsnorm(y, n, x, n, weight, rows, n, 1e-6f);
        for (size_t r = 0; r < rows; ++r) {
            double squares = 0.0;
            for (size_t i = 0; i < n; ++i)
                squares += (double)x[r * n + i] * x[r * n + i];
            double inverse = 1.0 / sqrt(squares / (double)n + (double)1e-6f);
            for (size_t i = 0; i < n; ++i) {
                double expected = x[r * n + i] * inverse * weight[i];
                check_near(y[r * n + i], expected, 1e-6 * fabs(expected), "rmsnorm", r * n + i);
            }
        }
        scalar->rmsnorm(x, n, x, n, weight, rows, n, 1e-6f); /* in place: the same bits */
        assert_memory_equal(x, y, rows * n * sizeof(float));
        test_free(x), test_free(weight), test_free(y);
    }
}

/* LayerNorm's rows of n at `stride`, by r % 4: spread around 0; around 100, where the variance would lose
 * digits to the mean if taken as mean(x^2) - mean^2; tightly around 1e4, where it would lose all of them, and
 * where rounding the mean to F32 would shift every deviation; and constant (variance 0). */
static float *layernorm_rows(size_t rows, size_t n, size_t stride) {
    float *x = floats_filled(rows * stride, SENTINEL);
    for (size_t r = 0; r < rows; ++r)
        for (size_t i = 0; i < n; ++i) {
            float *at = x + r * stride + i;
            switch (r % 4) {
            case 0:
                *at = random_uniform(-2.0f, 2.0f);
                break;
            case 1:
                *at = 100.0f + random_uniform(-1.0f, 1.0f);
                break;
            case 2:
                *at = 1e4f + random_uniform(-0.05f, 0.05f);
                break;
            default:
                *at = 3.25f;
                break;
            }
        }
    return x;
}

/* The LayerNorm of one row x [n] in double, two passes: expected [n], and magnitude [n] = |(x - mean) /
 * sqrt(var + eps) weight| + |bias|, what kernels.h's tolerance is relative to. */
static void layernorm_double(float const *x, size_t n, float const *weight, float const *bias, float eps,
                             double *expected, double *magnitude) {
    double mean = 0.0, variance = 0.0;
    for (size_t i = 0; i < n; ++i)
        mean += x[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; ++i)
        variance += (x[i] - mean) * (x[i] - mean);
    double inverse = 1.0 / sqrt(variance / (double)n + (double)eps);
    for (size_t i = 0; i < n; ++i) {
        double scaled = (x[i] - mean) * inverse * weight[i], shift = bias ? bias[i] : 0.0;
        expected[i] = scaled + shift;
        magnitude[i] = fabs(scaled) + fabs(shift);
    }
}

static size_t const layernorm_sizes[] = {1, 3, 15, 16, 17, 33, 63, 64, 65, 100, 384, 768, 1000};

/* Within 1e-6 of the formula in double on rows of every kind (a constant row gives the bias exactly), with
 * BERT's eps and PyTorch's default, with and without a bias; in place the same bits. */
static void scalar_layernorm_matches_formula(void **state) {
    (void)state;
    kernels_t const *scalar = kernels_scalar();
    float const epsilons[] = {1e-12f, 1e-5f};
    size_t const rows = 4;
    random_seed(14);
    for (size_t s = 0; s < COUNT(layernorm_sizes); ++s) {
        size_t n = layernorm_sizes[s];
        float *x = layernorm_rows(rows, n, n), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *bias = floats_uniform(n, -1.0f, 1.0f), *y = floats_filled(rows * n, 0.0f);
        double *expected = test_malloc(n * sizeof(double)), *magnitude = test_malloc(n * sizeof(double));
        for (size_t e = 0; e < COUNT(epsilons); ++e)
            for (int with_bias = 0; with_bias < 2; ++with_bias) {
                float const *b = with_bias ? bias : NULL;
                scalar->layernorm(y, n, x, n, weight, b, rows, n, epsilons[e]);
                for (size_t r = 0; r < rows; ++r) {
                    layernorm_double(x + r * n, n, weight, b, epsilons[e], expected, magnitude);
                    for (size_t i = 0; i < n; ++i)
                        check_near(y[r * n + i], expected[i], 1e-6 * magnitude[i], "layernorm", r * n + i);
                    for (size_t i = 0; r == 3 && i < n; ++i) /* constant: the bias itself */
                        assert_true(y[r * n + i] == (with_bias ? bias[i] : 0.0f));
                }
                float *in_place = test_malloc(rows * n * sizeof(float));
                memcpy(in_place, x, rows * n * sizeof(float));
                scalar->layernorm(in_place, n, in_place, n, weight, b, rows, n, epsilons[e]);
                assert_memory_equal(in_place, y, rows * n * sizeof(float));
                test_free(in_place);
            }
        test_free(x), test_free(weight), test_free(bias), test_free(y), test_free(expected),
            test_free(magnitude);
    }
}

static void scalar_rope_matches_formula(void **state) {
    (void)state;
    size_t const positions[] = {0, 1, 1000}, heads = 3;
    random_seed(2);
    float *x = floats_uniform(heads * KERNEL_HEAD, -1.0f, 1.0f), rotated[3 * KERNEL_HEAD];
    for (size_t p = 0; p < COUNT(positions); ++p) {
        memcpy(rotated, x, sizeof rotated);
        kernels_scalar()->rope(rotated, heads, positions[p]);
        for (size_t h = 0; h < heads; ++h) {
            for (size_t i = 0; i < KERNEL_HEAD / 2; ++i) {
                double angle = (double)positions[p] * exp(-2.0 * (double)i / KERNEL_HEAD * log(10000.0));
                size_t first = h * KERNEL_HEAD + i, second = first + KERNEL_HEAD / 2;
                double c = cos(angle), s = sin(angle);
                check_near(rotated[first], x[first] * c - x[second] * s, 1e-6, "rope", first);
                check_near(rotated[second], x[second] * c + x[first] * s, 1e-6, "rope", second);
            }
        }
        if (positions[p] == 0) assert_memory_equal(rotated, x, sizeof rotated);
    }
    test_free(x);
}

/* Every output column outside head `head` still holds the sentinel. */
static void check_other_heads_untouched(float const *out, size_t tokens, size_t head) {
    for (size_t row = 0; row < tokens; ++row)
        for (size_t i = 0; i < HIDDEN; ++i)
            if (i / KERNEL_HEAD != head && out[row * HIDDEN + i] != SENTINEL)
                fail_msg("attention wrote column %zu of row %zu, outside head %zu", i, row, head);
}

/* Head `head` of the batch's q, k and v in double, [tokens, 64] each, one after the other (test_free
 * it): for attention_row_double. */
static double *head_in_double(qkv_batch_t const *batch, size_t head) {
    size_t const n = batch->tokens * KERNEL_HEAD;
    double *q = test_malloc(3 * n * sizeof(double));
    for (size_t row = 0; row < batch->tokens; ++row)
        for (size_t part = 0; part < 3; ++part)
            for (size_t d = 0; d < KERNEL_HEAD; ++d)
                q[part * n + row * KERNEL_HEAD + d] =
                    batch->qkv[row * 3 * HIDDEN + part * HIDDEN + head * KERNEL_HEAD + d];
    return q;
}

/* ---- Relative-position bias ----------------------------------------------------------------------
 * A table of kernel_attention_t.bias holds bias_at(d) at every relative position d: a magnitude in [1, 3]
 * and a sign, both hashed from d, so that an entry read at the wrong d or added with the wrong sign moves
 * the outputs far past every tolerance. A table holds exactly the entries the contract lets a path read for
 * items of up to its rows, in a malloc of its own (test_malloc's guard bytes would hide a read past it from
 * AddressSanitizer); the same d holds the same value in every table, so that a path gives the same bits
 * with a table of the batch's longest item and with one of each item alone. */

static float bias_at(ptrdiff_t d) {
    uint32_t hash = (uint32_t)d + 0x9e3779b9u; /* murmur3's finalizer */
    hash = (hash ^ hash >> 16) * 0x85ebca6bu;
    hash = (hash ^ hash >> 13) * 0xc2b2ae35u;
    hash ^= hash >> 16;
    float magnitude = 1.0f + 2.0f * (float)(hash >> 16) / 65535.0f;
    return hash & 1 ? -magnitude : magnitude;
}

typedef struct bias_table {
    float *entries;    /* free it */
    float const *bias; /* the entry of d = 0: kernel_attention_t.bias */
} bias_table_t;

/* The table for items of up to `rows` rows (at least 1): d from -(rows - 1) to
 * rows - 1 + KERNEL_ATTENTION_BIAS_LANES - 1, 2 rows + KERNEL_ATTENTION_BIAS_LANES - 2 entries. */
static bias_table_t bias_table_make(size_t rows) {
    rows = rows ? rows : 1;
    size_t count = 2 * rows + KERNEL_ATTENTION_BIAS_LANES - 2;
    float *entries = malloc(count * sizeof(float));
    assert_non_null(entries);
    for (size_t i = 0; i < count; ++i)
        entries[i] = bias_at((ptrdiff_t)i - (ptrdiff_t)(rows - 1));
    return (bias_table_t){entries, entries + (rows - 1)};
}

/* The rows of the longest of `items` items at `offsets`. */
static size_t longest_item(size_t const *offsets, size_t items) {
    size_t longest = 0;
    for (size_t i = 0; i < items; ++i)
        longest = offsets[i + 1] - offsets[i] > longest ? offsets[i + 1] - offsets[i] : longest;
    return longest;
}

/* Fails unless the bias of the scalar attention `a`, whose outputs are in `with` (`floats` of them, a.out
 * among them), moved some output by more than 0.1 from the attention without it: a path that ignored the
 * bias would be that far from scalar, 25 times the widest tolerance (2^-8). */
static void check_bias_moves(kernel_attention_t a, float const *with, size_t floats) {
    float *without = floats_filled(floats, SENTINEL);
    a.out = without + (a.out - with);
    a.bias = NULL;
    kernels_scalar()->attention(&a, 0, a.items);
    double moved = 0.0;
    for (size_t i = 0; i < floats; ++i)
        moved = fmax(moved, fabs((double)with[i] - without[i]));
    if (moved <= 0.1) fail_msg("the bias moved no output by more than %g", moved);
    test_free(without);
}

/* `attention` over each item alone with a table of exactly that item's rows, into a.out: AddressSanitizer
 * reports a read of the table outside what the contract lets the path read. */
static void attend_items_alone(void (*attention)(kernel_attention_t const *, size_t, size_t),
                               kernel_attention_t a) {
    for (size_t item = 0; item < a.items; ++item) {
        bias_table_t table = bias_table_make(a.offsets[item + 1] - a.offsets[item]);
        a.bias = table.bias;
        attention(&a, item, item + 1);
        free(table.entries);
    }
}

/* The scalar path against attention in double, without a bias and with one. */
static void scalar_attention_matches_naive(void **state) {
    (void)state;
    float const amplitudes[] = {1.0f, 6.0f};
    random_seed(3);
    for (size_t m = 0; m < COUNT(amplitudes); ++m) {
        qkv_batch_t batch = qkv_batch_make(amplitudes[m]);
        bias_table_t table = bias_table_make(longest_item(batch.offsets, ITEMS));
        for (int variant = 0; variant < 4; ++variant) { /* causal or not, without a bias and with one */
            bool causal = variant & 1;
            float *out = floats_filled(batch.tokens * HIDDEN, SENTINEL);
            kernel_attention_t a = qkv_batch_head(&batch, 1, causal, out);
            a.bias = variant & 2 ? table.bias : NULL;
            kernels_scalar()->attention(&a, 0, ITEMS);
            check_other_heads_untouched(out, batch.tokens, 1);
            double *q = head_in_double(&batch, 1), *k = q + batch.tokens * KERNEL_HEAD,
                   *v = k + batch.tokens * KERNEL_HEAD;
            for (size_t item = 0; item < ITEMS; ++item) {
                for (size_t row = batch.offsets[item]; row < batch.offsets[item + 1]; ++row) {
                    double expected[KERNEL_HEAD];
                    attention_row_double(q, k, v, row, batch.offsets[item],
                                         causal ? row + 1 : batch.offsets[item + 1], a.scale, a.bias,
                                         expected);
                    for (size_t d = 0; d < KERNEL_HEAD; ++d)
                        check_near(a.out[row * HIDDEN + d], expected[d], 1e-5, "attention",
                                   row * KERNEL_HEAD + d);
                }
            }
            if (a.bias) check_bias_moves(a, out, batch.tokens * HIDDEN);
            test_free(q);
            test_free(out);
        }
        free(table.entries);
        test_free(batch.qkv);
    }
}

/* ---- Heads of other widths ----------------------------------------------------------------------
 * HEADS heads of `width` side by side in rows q | k | v [tokens, 3 HEADS width], items of the lengths below
 * (across tiles of 64 keys, and empty), the head under test the last of each row, so that a read past it
 * would leave the allocation's end in the last row. */

static size_t const head_widths[] = {1, 24, 32, 33, 40, 64, 72, 80, 128, 256};
static size_t const width_item_lengths[] = {1, 7, 77, 0, 300, 64};
#define WIDTH_ITEMS COUNT(width_item_lengths)

typedef struct width_batch {
    size_t width, tokens, offsets[WIDTH_ITEMS + 1];
    float *qkv; /* test_free it */
} width_batch_t;

/* Values in [-1, 1], queries and keys in [-3, 3] (a softmax peaked enough to move its max between tiles). */
static width_batch_t width_batch_make(size_t width) {
    width_batch_t batch = {.width = width};
    for (size_t i = 0; i < WIDTH_ITEMS; ++i)
        batch.offsets[i + 1] = batch.offsets[i] + width_item_lengths[i];
    batch.tokens = batch.offsets[WIDTH_ITEMS];
    size_t row = 3 * HEADS * width;
    batch.qkv = floats_uniform(batch.tokens * row, -1.0f, 1.0f);
    for (size_t r = 0; r < batch.tokens; ++r)
        for (size_t i = 0; i < 2 * HEADS * width; ++i)
            batch.qkv[r * row + i] *= 3.0f;
    return batch;
}

/* The last head's attention, scale 1/sqrt(width), with `bias` (or none), written to out [tokens, HEADS width]
 * at its columns. */
static kernel_attention_t width_batch_last_head(width_batch_t const *batch, bool causal, float const *bias,
                                                float *out) {
    size_t width = batch->width, last = (HEADS - 1) * width;
    return (kernel_attention_t){
        .q = batch->qkv + last,
        .k = batch->qkv + HEADS * width + last,
        .v = batch->qkv + 2 * HEADS * width + last,
        .stride = 3 * HEADS * width,
        .out = out + last,
        .out_stride = HEADS * width,
        .head = width,
        .offsets = batch->offsets,
        .items = WIDTH_ITEMS,
        .causal = causal,
        .scale = 1.0f / sqrtf((float)width),
        .bias = bias,
    };
}

/* out [tokens + 1, HEADS width], the sentinel everywhere: one row more than the batch, that must stay so. */
static float *width_batch_out(width_batch_t const *batch) {
    return floats_filled((batch->tokens + 1) * HEADS * batch->width, SENTINEL);
}

/* Every column of out before the last head, and the row past the batch, still hold the sentinel. */
static void check_outside_last_head_untouched(width_batch_t const *batch, float const *out) {
    size_t width = batch->width, columns = HEADS * width;
    for (size_t row = 0; row <= batch->tokens; ++row)
        for (size_t i = 0; i < columns; ++i)
            if ((row == batch->tokens || i < (HEADS - 1) * width) && out[row * columns + i] != SENTINEL)
                fail_msg("attention of width %zu wrote column %zu of row %zu", width, i, row);
}

/* x rounded to BF16 (to nearest even), as a path whose attention rounds (kernel_attention_rounds) rounds its
 * products' operands. */
static double bf16_rounded(float x) {
    return bf16_to_f32(f32_to_bf16(x));
}

/* One row of the last head's attention in double, against keys [first, end) of the item whose first row is
 * `first`, with a->bias where it has one: out [width]. `rounded`: over the operands that a rounding
 * attention multiplies, q scale (scaled in F32), k and v rounded to BF16 (the bias stays as it is). */
static void width_row_double(width_batch_t const *batch, kernel_attention_t const *a, size_t row,
                             size_t first, size_t end, bool rounded, double *out) {
    size_t width = batch->width;
    double *scores = test_malloc((end - first) * sizeof(double)), max = -INFINITY, sum = 0.0;
    for (size_t j = first; j < end; ++j) {
        double dot = 0.0;
        for (size_t d = 0; d < width; ++d) {
            float query = a->q[row * a->stride + d], key = a->k[j * a->stride + d];
            dot += rounded ? bf16_rounded(query * a->scale) * bf16_rounded(key) : (double)query * key;
        }
        scores[j - first] = rounded ? dot : dot * a->scale;
        if (a->bias) scores[j - first] += a->bias[(ptrdiff_t)row - (ptrdiff_t)j];
        max = fmax(max, scores[j - first]);
    }
    for (size_t d = 0; d < width; ++d)
        out[d] = 0.0;
    for (size_t j = first; j < end; ++j) {
        double weight = exp(scores[j - first] - max);
        sum += weight;
        for (size_t d = 0; d < width; ++d) {
            float value = a->v[j * a->stride + d];
            out[d] += weight * (rounded ? bf16_rounded(value) : value);
        }
    }
    for (size_t d = 0; d < width; ++d)
        out[d] /= sum;
    test_free(scores);
}

static void scalar_attention_widths_match_naive(void **state) {
    (void)state;
    random_seed(16);
    double expected[KERNEL_HEAD_MAX];
    for (size_t w = 0; w < COUNT(head_widths); ++w) {
        width_batch_t batch = width_batch_make(head_widths[w]);
        bias_table_t table = bias_table_make(longest_item(batch.offsets, WIDTH_ITEMS));
        for (int variant = 0; variant < 4; ++variant) { /* causal or not, without a bias and with one */
            bool causal = variant & 1;
            float *out = width_batch_out(&batch);
            kernel_attention_t a =
                width_batch_last_head(&batch, causal, variant & 2 ? table.bias : NULL, out);
            kernels_scalar()->attention(&a, 0, WIDTH_ITEMS);
            check_outside_last_head_untouched(&batch, out);
            for (size_t item = 0; item < WIDTH_ITEMS; ++item)
                for (size_t row = batch.offsets[item]; row < batch.offsets[item + 1]; ++row) {
                    width_row_double(&batch, &a, row, batch.offsets[item],
                                     causal ? row + 1 : batch.offsets[item + 1], false, expected);
                    for (size_t d = 0; d < batch.width; ++d)
                        check_near(a.out[row * a.out_stride + d], expected[d], 1e-5, "attention",
                                   row * batch.width + d);
                }
            if (a.bias) check_bias_moves(a, out, (batch.tokens + 1) * HEADS * batch.width);
            test_free(out);
        }
        free(table.entries);
        test_free(batch.qkv);
    }
}

static void scalar_softmax_matches_formula(void **state) {
    (void)state;
    random_seed(4);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s];
        float *x = floats_uniform(n, -10.0f, 10.0f), *y = test_malloc(n * sizeof(float));
        memcpy(y, x, n * sizeof(float));
        kernels_scalar()->softmax(y, n);
        double max = -INFINITY, sum = 0.0;
        for (size_t i = 0; i < n; ++i)
            max = fmax(max, x[i]);
        for (size_t i = 0; i < n; ++i)
            sum += exp(x[i] - max);
        for (size_t i = 0; i < n; ++i)
            check_near(y[i], exp(x[i] - max) / sum, 1e-7, "softmax", i);
        test_free(x), test_free(y);
    }
}

static void scalar_normalize_matches_formula(void **state) {
    (void)state;
    random_seed(5);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s];
        float *x = floats_uniform(n, -3.0f, 3.0f), *y = test_malloc(n * sizeof(float));
        memcpy(y, x, n * sizeof(float));
        kernels_scalar()->normalize(y, n);
        double squares = 0.0;
        for (size_t i = 0; i < n; ++i)
            squares += (double)x[i] * x[i];
        for (size_t i = 0; i < n; ++i)
            check_near(y[i], x[i] / sqrt(squares), 1e-6 * fabs(x[i] / sqrt(squares)), "normalize", i);
        memset(y, 0, n * sizeof(float));
        kernels_scalar()->normalize(y, n);
        for (size_t i = 0; i < n; ++i)
            assert_true(bits_of(y[i]) == 0);
        test_free(x), test_free(y);
    }
}

/* ---- Scalar conversions: known bits ------------------------------------------------------------- */

typedef struct known_bits {
    uint32_t from;
    uint16_t to;
} known_bits_t;

static void scalar_bf16_known_bits(void **state) {
    (void)state;
    known_bits_t const known[] = {
        {0x3f800000u, 0x3f80}, /* 1 */
        {0xc0000000u, 0xc000}, /* -2 */
        {0x00000000u, 0x0000}, /* 0 */
        {0x80000000u, 0x8000}, /* -0 */
        {0x7f800000u, 0x7f80}, /* infinity */
        {0xff800000u, 0xff80}, /* -infinity */
        {0x7fc00000u, 0x7fc0}, /* quiet NaN */
        {0x7f800001u, 0x7fc0}, /* signaling NaN: quieted */
        {0x7f810000u, 0x7fc1}, /* signaling NaN: quieted, the payload's top kept */
        {0xff800001u, 0xffc0}, /* negative signaling NaN */
        {0x7fffffffu, 0x7fff}, /* NaN whose payload is all ones: not rounded into the sign */
        {0x3f808000u, 0x3f80}, /* tie, down to even */
        {0x3f818000u, 0x3f82}, /* tie, up to even */
        {0x3f808001u, 0x3f81}, /* just above a tie */
        {0x3f807fffu, 0x3f80}, /* just below a tie */
        {0x7f7fffffu, 0x7f80}, /* FLT_MAX rounds to infinity */
        {0x00000001u, 0x0000}, /* the smallest F32 subnormal */
        {0x00008000u, 0x0000}, /* subnormal tie, down to even */
        {0x00018000u, 0x0002}, /* subnormal tie, up to even */
    };
    for (size_t i = 0; i < COUNT(known); ++i) {
        uint16_t half = 0;
        float value = float_of(known[i].from);
        kernels_scalar()->f32_to_bf16(&half, &value, 1);
        if (half != known[i].to)
            fail_msg("bf16(0x%08x) = 0x%04x, expected 0x%04x", known[i].from, half, known[i].to);
        kernels_scalar()->convert(&half, &value, 1, UFORM_BF16, NULL);
        assert_int_equal(half, known[i].to);
    }
    uint16_t const halves[] = {0x3f80, 0xc000, 0x7f80, 0x0001};
    float values[4];
    kernels_scalar()->bf16_to_f32(values, halves, 4);
    assert_true(values[0] == 1.0f && values[1] == -2.0f && isinf(values[2]) && values[3] == 0x1p-133f);
}

static void scalar_f16_known_bits(void **state) {
    (void)state;
    known_bits_t const known[] = {
        {0x3f800000u, 0x3c00}, /* 1 */
        {0xc0000000u, 0xc000}, /* -2 */
        {0x3dcccccdu, 0x2e66}, /* 0.1 */
        {0x3eaaaaabu, 0x3555}, /* 1/3 */
        {0x00000000u, 0x0000}, /* 0 */
        {0x80000000u, 0x8000}, /* -0 */
        {0x477fe000u, 0x7bff}, /* 65504, the largest half */
        {0x477fefffu, 0x7bff}, /* just below 65520 */
        {0x477ff000u, 0x7c00}, /* 65520 ties to infinity */
        {0x7f7fffffu, 0x7c00}, /* FLT_MAX overflows */
        {0xff7fffffu, 0xfc00}, /* -FLT_MAX overflows */
        {0x7f800000u, 0x7c00}, /* infinity */
        {0xff800000u, 0xfc00}, /* -infinity */
        {0x7fc00000u, 0x7e00}, /* quiet NaN */
        {0x7f800001u, 0x7e00}, /* signaling NaN: quieted */
        {0xffffe000u, 0xffff}, /* negative NaN: the payload's top kept */
        {0x38800000u, 0x0400}, /* 2^-14, the smallest normal half */
        {0x387fc000u, 0x03ff}, /* the largest subnormal half */
        {0x387fe000u, 0x0400}, /* the tie between them goes to even */
        {0x33800000u, 0x0001}, /* 2^-24, the smallest subnormal half */
        {0x33000000u, 0x0000}, /* 2^-25 ties to zero */
        {0x33000001u, 0x0001}, /* just above 2^-25 */
        {0x33c00000u, 0x0002}, /* 1.5 * 2^-24 ties to even */
        {0x00800000u, 0x0000}, /* FLT_MIN */
        {0x00000001u, 0x0000}, /* the smallest F32 subnormal */
        {0x80000001u, 0x8000}, /* its negative */
        {0x3f801000u, 0x3c00}, /* tie above 1, down to even */
        {0x3f803000u, 0x3c02}, /* tie, up to even */
        {0x3f801001u, 0x3c01}, /* just above a tie */
    };
    for (size_t i = 0; i < COUNT(known); ++i) {
        uint16_t half = 0;
        float value = float_of(known[i].from);
        kernels_scalar()->convert(&half, &value, 1, UFORM_F16, NULL);
        if (half != known[i].to)
            fail_msg("f16(0x%08x) = 0x%04x, expected 0x%04x", known[i].from, half, known[i].to);
    }
}

/* The F32 values around every F16 rounding boundary, both signs: the half itself, the midpoint to the
 * next half, and the F32 neighbours of the midpoint; `expected` receives the correctly rounded half. */
static size_t f16_boundaries(float *values, uint16_t *expected) {
    size_t count = 0;
    for (uint16_t half = 0; half <= 0x7bff; ++half) {
        for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
            uint16_t low = (uint16_t)(sign | half), high = (uint16_t)(sign | (half + 1));
            float middle = (float)((half_value(low) + half_value(high)) / 2);
            float toward_zero = nextafterf(middle, 0.0f),
                  away = nextafterf(middle, sign ? -INFINITY : INFINITY);
            float const cases[] = {(float)half_value(low), middle, toward_zero, away};
            uint16_t const rounded[] = {low, half & 1 ? high : low, low, high};
            for (size_t c = 0; c < 4; ++c, ++count)
                values[count] = cases[c], expected[count] = rounded[c];
        }
    }
    return count;
}

#define F16_BOUNDARIES (0x7c00 * 2 * 4)

static void scalar_f16_rounds_every_boundary(void **state) {
    (void)state;
    float *values = test_malloc(F16_BOUNDARIES * sizeof(float));
    uint16_t *expected = test_malloc(F16_BOUNDARIES * sizeof(uint16_t));
    uint16_t *halves = test_malloc(F16_BOUNDARIES * sizeof(uint16_t));
    size_t count = f16_boundaries(values, expected);
    kernels_scalar()->convert(halves, values, count, UFORM_F16, NULL);
    for (size_t i = 0; i < count; ++i)
        if (halves[i] != expected[i])
            fail_msg("f16(%a) = 0x%04x, expected 0x%04x", (double)values[i], halves[i], expected[i]);
    test_free(values), test_free(expected), test_free(halves);
}

static void scalar_i8_known_rows(void **state) {
    (void)state;
    float const unit[] = {127.0f, 63.5f, -63.5f, 0.5f, -0.5f, 1.4999999f, -126.5f, 0.0f, 2.5f};
    int8_t const unit_q[] = {127, 64, -64, 1, -1, 1, -127, 0, 3};
    float const twice[] = {-254.0f, 1.0f, -1.0f, 3.0f, -3.0f, 2.9999998f, 5.0f};
    int8_t const twice_q[] = {-127, 1, -1, 2, -2, 1, 3};
    int8_t q[COUNT(unit)];
    float scale = -1.0f;
    kernels_scalar()->convert(q, unit, COUNT(unit), UFORM_I8, &scale);
    assert_true(scale == 1.0f);
    assert_memory_equal(q, unit_q, sizeof unit_q);
    kernels_scalar()->convert(q, twice, COUNT(twice), UFORM_I8, &scale);
    assert_true(scale == 2.0f);
    assert_memory_equal(q, twice_q, sizeof twice_q);
    float const zeros[3] = {0.0f, -0.0f, 0.0f};
    memset(q, 1, sizeof q);
    kernels_scalar()->convert(q, zeros, 3, UFORM_I8, &scale);
    assert_true(scale == 0.0f && q[0] == 0 && q[1] == 0 && q[2] == 0);
}

static void scalar_i8_matches_formula(void **state) {
    (void)state;
    random_seed(6);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s];
        float *x = floats_uniform(n, -3.0f, 3.0f), scale = 0.0f;
        int8_t *q = test_malloc(n);
        kernels_scalar()->convert(q, x, n, UFORM_I8, &scale);
        double max = 0.0;
        for (size_t i = 0; i < n; ++i)
            max = fmax(max, fabs(x[i]));
        check_near(scale, max / 127.0, 1e-7 * max, "scale", 0);
        for (size_t i = 0; i < n; ++i)
            check_near(q[i], x[i] / (max / 127.0), 0.5 + 1e-4, "i8", i);
        test_free(x), test_free(q);
    }
}

/* ---- SIMD paths against scalar ------------------------------------------------------------------ */

static void paths_rmsnorm_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), rows = 4;
    random_seed(7);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s], x_stride = n + 5, y_stride = n + 3;
        float *x = floats_uniform(rows * x_stride, -2.0f, 2.0f), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *expected = floats_filled(rows * y_stride, SENTINEL);
        float *y = test_malloc(rows * y_stride * sizeof(float));
        float *in_place = test_malloc(rows * x_stride * sizeof(float));
        kernels_scalar()->rmsnorm(expected, y_stride, x, x_stride, weight, rows, n, 1e-6f);
        for (size_t p = 0; p < path_count; ++p) {
            for (size_t i = 0; i < rows * y_stride; ++i)
                y[i] = SENTINEL;
            paths[p]->rmsnorm(y, y_stride, x, x_stride, weight, rows, n, 1e-6f);
            memcpy(in_place, x, rows * x_stride * sizeof(float));
            paths[p]->rmsnorm(in_place, x_stride, in_place, x_stride, weight, rows, n, 1e-6f);
            for (size_t r = 0; r < rows; ++r) {
                for (size_t i = 0; i < n; ++i) {
                    float e = expected[r * y_stride + i];
                    check_near(y[r * y_stride + i], e, 1e-5 * fabsf(e), paths[p]->name, r * n + i);
                    check_near(in_place[r * x_stride + i], e, 1e-5 * fabsf(e), paths[p]->name, r * n + i);
                }
                for (size_t i = n; i < y_stride; ++i)
                    assert_true(y[r * y_stride + i] == SENTINEL);
                assert_memory_equal(in_place + r * x_stride + n, x + r * x_stride + n, 5 * sizeof(float));
            }
        }
        test_free(x), test_free(weight), test_free(expected), test_free(y), test_free(in_place);
    }
}

/* Rows of every kind at padded strides, with and without a bias: within 1e-5 of scalar relative to
 * kernels.h's magnitude, nothing written past n, and in place too. */
static void paths_layernorm_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), rows = 8;
    random_seed(15);
    for (size_t s = 0; s < COUNT(layernorm_sizes); ++s) {
        size_t n = layernorm_sizes[s], x_stride = n + 5, y_stride = n + 3;
        float *x = layernorm_rows(rows, n, x_stride), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *bias = floats_uniform(n, -1.0f, 1.0f),
              *expected = test_malloc(rows * y_stride * sizeof(float));
        float *y = test_malloc(rows * y_stride * sizeof(float));
        float *in_place = test_malloc(rows * x_stride * sizeof(float));
        double *exact = test_malloc(n * sizeof(double)), *magnitude = test_malloc(n * sizeof(double));
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            float const *b = with_bias ? bias : NULL;
            kernels_scalar()->layernorm(expected, y_stride, x, x_stride, weight, b, rows, n, 1e-5f);
            for (size_t p = 0; p < path_count; ++p) {
                for (size_t i = 0; i < rows * y_stride; ++i)
                    y[i] = SENTINEL;
                paths[p]->layernorm(y, y_stride, x, x_stride, weight, b, rows, n, 1e-5f);
                memcpy(in_place, x, rows * x_stride * sizeof(float));
                paths[p]->layernorm(in_place, x_stride, in_place, x_stride, weight, b, rows, n, 1e-5f);
                for (size_t r = 0; r < rows; ++r) {
                    layernorm_double(x + r * x_stride, n, weight, b, 1e-5f, exact, magnitude);
                    for (size_t i = 0; i < n; ++i) {
                        float e = expected[r * y_stride + i];
                        check_near(y[r * y_stride + i], e, 1e-5 * magnitude[i], paths[p]->name, r * n + i);
                        check_near(in_place[r * x_stride + i], e, 1e-5 * magnitude[i], paths[p]->name,
                                   r * n + i);
                    }
                    for (size_t i = n; i < y_stride; ++i)
                        assert_true(y[r * y_stride + i] == SENTINEL);
                    assert_memory_equal(in_place + r * x_stride + n, x + r * x_stride + n, 5 * sizeof(float));
                }
            }
        }
        test_free(x), test_free(weight), test_free(bias), test_free(expected), test_free(y),
            test_free(in_place);
        test_free(exact), test_free(magnitude);
    }
}

static void paths_rope_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), heads = 5;
    random_seed(8);
    float *x = floats_uniform(heads * KERNEL_HEAD, -1.0f, 1.0f);
    float expected[5 * KERNEL_HEAD], rotated[5 * KERNEL_HEAD];
    for (size_t position = 0; position < 300; position += 37) {
        memcpy(expected, x, sizeof expected);
        kernels_scalar()->rope(expected, heads, position);
        for (size_t p = 0; p < path_count; ++p) {
            memcpy(rotated, x, sizeof rotated);
            paths[p]->rope(rotated, heads, position);
            for (size_t i = 0; i < heads * KERNEL_HEAD; ++i)
                check_near(rotated[i], expected[i], 1e-5, paths[p]->name, i);
        }
    }
    test_free(x);
}

/* What a path whose attention rounds is held to on head `head` of the batch with `bias` (or none): attention
 * in double over q scale (scaled in F32), k and v rounded to BF16, and the bias as it is, at the head's
 * columns of [tokens, HIDDEN], the sentinel elsewhere (test_free it). */
static float *rounded_expected(qkv_batch_t const *batch, size_t head, bool causal, float const *bias) {
    float *expected = floats_filled(batch->tokens * HIDDEN, SENTINEL);
    kernel_attention_t a = qkv_batch_head(batch, head, causal, expected);
    size_t const n = batch->tokens * KERNEL_HEAD;
    double *q = head_in_double(batch, head), *k = q + n, *v = k + n;
    for (size_t i = 0; i < n; ++i) {
        q[i] = bf16_rounded((float)q[i] * a.scale);
        k[i] = bf16_rounded((float)k[i]);
        v[i] = bf16_rounded((float)v[i]);
    }
    for (size_t item = 0; item < ITEMS; ++item)
        for (size_t row = batch->offsets[item]; row < batch->offsets[item + 1]; ++row) {
            double out[KERNEL_HEAD];
            attention_row_double(q, k, v, row, batch->offsets[item],
                                 causal ? row + 1 : batch->offsets[item + 1], 1.0, bias, out);
            for (size_t d = 0; d < KERNEL_HEAD; ++d)
                a.out[row * HIDDEN + d] = (float)out[d];
        }
    test_free(q);
    return expected;
}

/* Scratch for kernel_attention_t.scratch: `bytes` of it, and SCRATCH_GUARD bytes past them, painted
 * (free it). */
#define SCRATCH_GUARD 256
#define SCRATCH_PAINT 0xa5
static unsigned char *scratch_painted(size_t bytes) {
    unsigned char *scratch = aligned_alloc(64, (bytes + SCRATCH_GUARD + 63) / 64 * 64);
    assert_non_null(scratch);
    memset(scratch, SCRATCH_PAINT, bytes + SCRATCH_GUARD);
    return scratch;
}

/* Whether the attention wrote into the `bytes` it was given; failing where it wrote past them. */
static bool scratch_written(unsigned char const *scratch, size_t bytes) {
    for (size_t i = bytes; i < bytes + SCRATCH_GUARD; ++i)
        if (scratch[i] != SCRATCH_PAINT) fail_msg("attention wrote scratch byte %zu past its %zu", i, bytes);
    for (size_t i = 0; i < bytes; ++i)
        if (scratch[i] != SCRATCH_PAINT) return true;
    return false;
}

/* One path's attention over the whole batch with `bias` (or none) within `tolerance` of `expected`, and
 * again over ranges of items with scratch, and with a bias over each item alone: the same bits. */
static void check_attention_path(kernels_t const *path, qkv_batch_t const *batch, bool causal,
                                 float const *bias, float const *expected, double tolerance) {
    size_t const cuts[] = {0, 2, 3, 3, 5, ITEMS};
    size_t floats = batch->tokens * HIDDEN;
    float *whole = floats_filled(floats, SENTINEL), *pieces = floats_filled(floats, SENTINEL);
    kernel_attention_t a = qkv_batch_head(batch, 2, causal, whole);
    a.bias = bias;
    path->attention(&a, 0, ITEMS);
    check_other_heads_untouched(whole, batch->tokens, 2);
    for (size_t i = 0; i < floats; ++i)
        check_near(whole[i], expected[i], tolerance, path->name, i);
    a.out = pieces + 2 * KERNEL_HEAD;
    unsigned char *scratch = scratch_painted(KERNEL_ATTENTION_SCRATCH);
    a.scratch = scratch;
    a.scratch_bytes = KERNEL_ATTENTION_SCRATCH;
    for (size_t c = 0; c + 1 < COUNT(cuts); ++c)
        path->attention(&a, cuts[c], cuts[c + 1]);
    assert_memory_equal(pieces, whole, floats * sizeof(float));
    if (scratch_written(scratch, KERNEL_ATTENTION_SCRATCH) && !kernel_attention_rounds(path))
        fail_msg("%s's F32 attention wrote its scratch", path->name);
    if (bias) {
        float *alone = floats_filled(floats, SENTINEL);
        a.out = alone + 2 * KERNEL_HEAD;
        attend_items_alone(path->attention, a);
        assert_memory_equal(alone, whole, floats * sizeof(float));
        test_free(alone);
    }
    free(scratch);
    test_free(whole), test_free(pieces);
}

/* Every path, causal and not, without a bias and with one (which moves the outputs far past the
 * tolerances, so that a path that ignored it would fail). */
static void paths_attention_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    float const amplitudes[] = {1.0f, 6.0f};
    random_seed(9);
    for (size_t m = 0; m < COUNT(amplitudes); ++m) {
        qkv_batch_t batch = qkv_batch_make(amplitudes[m]);
        bias_table_t table = bias_table_make(longest_item(batch.offsets, ITEMS));
        for (int variant = 0; variant < 4; ++variant) { /* causal or not, without a bias and with one */
            bool causal = variant & 1;
            float const *bias = variant & 2 ? table.bias : NULL;
            float *expected = floats_filled(batch.tokens * HIDDEN, SENTINEL);
            kernel_attention_t a = qkv_batch_head(&batch, 2, causal, expected);
            a.bias = bias;
            kernels_scalar()->attention(&a, 0, ITEMS);
            if (bias) check_bias_moves(a, expected, batch.tokens * HIDDEN);
            float *rounded = rounded_expected(&batch, 2, causal, bias);
            for (size_t p = 0; p < path_count; ++p) { /* max|v| is 1: kernel_attention_t's tolerances */
                kernels_t f32 = *paths[p];
                f32.attention = f32.attention_f32;
                check_attention_path(&f32, &batch, causal, bias, expected, 1e-4);
                if (kernel_attention_rounds(paths[p]))
                    check_attention_path(paths[p], &batch, causal, bias, rounded, 0x1p-8);
            }
            test_free(expected), test_free(rounded);
        }
        free(table.entries);
        test_free(batch.qkv);
    }
}

/* The last head's attention with `bias` (or none) in double over the operands a rounding attention rounds
 * (width_row_double's), at its columns of an output like width_batch_out's (test_free it). */
static float *width_rounded_expected(width_batch_t const *batch, bool causal, float const *bias) {
    float *expected = width_batch_out(batch);
    kernel_attention_t a = width_batch_last_head(batch, causal, bias, expected);
    double out[KERNEL_HEAD_MAX];
    for (size_t item = 0; item < WIDTH_ITEMS; ++item)
        for (size_t row = batch->offsets[item]; row < batch->offsets[item + 1]; ++row) {
            width_row_double(batch, &a, row, batch->offsets[item],
                             causal ? row + 1 : batch->offsets[item + 1], true, out);
            for (size_t d = 0; d < batch->width; ++d)
                a.out[row * a.out_stride + d] = (float)out[d];
        }
    return expected;
}

/* The attention over the batch with `bias` (or none) with scratch of KERNEL_ATTENTION_SCRATCH bytes, of
 * exactly what the longest item's keys and values take (kernel_attention_t) and of a byte less: the bits of
 * `whole`, nothing written past the scratch, and, for an attention that rounds without a causal mask, the
 * scratch taken where the longest item fits it. */
static void check_attention_scratch(width_batch_t const *batch, bool causal, float const *bias,
                                    void (*attention)(kernel_attention_t const *, size_t, size_t),
                                    bool rounds, float const *whole) {
    size_t need = kernel_attention_scratch_bytes(longest_item(batch->offsets, WIDTH_ITEMS), batch->width);
    size_t const given_bytes[] = {KERNEL_ATTENTION_SCRATCH, need, need - 1};
    size_t floats = (batch->tokens + 1) * HEADS * batch->width;
    for (size_t s = 0; s < COUNT(given_bytes); ++s) {
        unsigned char *scratch = scratch_painted(given_bytes[s]);
        float *given = width_batch_out(batch);
        kernel_attention_t a = width_batch_last_head(batch, causal, bias, given);
        a.scratch = scratch;
        a.scratch_bytes = given_bytes[s];
        attention(&a, 0, WIDTH_ITEMS);
        assert_memory_equal(given, whole, floats * sizeof(float));
        bool written = scratch_written(scratch, given_bytes[s]);
        if (given_bytes[s] >= need && written != (rounds && !causal))
            fail_msg("width %zu, scratch of %zu bytes (the longest item takes %zu): %s", batch->width,
                     given_bytes[s], need, written ? "written" : "not taken");
        if (written && !rounds) fail_msg("an F32 attention wrote its scratch");
        free(scratch);
        test_free(given);
    }
}

/* Every path at every head width, causal and not, without a bias and with one: within 1e-4 of scalar, or a
 * path whose attention rounds within 2^-8 of attention over its rounded operands (max|v| is 1) and its
 * attention_f32 within 1e-4 of scalar; nothing written outside the head, and the same bits over ranges of
 * items, and with a bias over each item alone, as over the whole batch. */
static void paths_attention_widths_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    size_t const cuts[] = {0, 1, 3, 3, 5, WIDTH_ITEMS};
    random_seed(17);
    for (size_t w = 0; w < COUNT(head_widths); ++w) {
        width_batch_t batch = width_batch_make(head_widths[w]);
        size_t floats = (batch.tokens + 1) * HEADS * batch.width;
        bias_table_t table = bias_table_make(longest_item(batch.offsets, WIDTH_ITEMS));
        for (int variant = 0; variant < 4; ++variant) { /* causal or not, without a bias and with one */
            bool causal = variant & 1;
            float const *bias = variant & 2 ? table.bias : NULL;
            float *expected = width_batch_out(&batch);
            kernel_attention_t a = width_batch_last_head(&batch, causal, bias, expected);
            kernels_scalar()->attention(&a, 0, WIDTH_ITEMS);
            if (bias) check_bias_moves(a, expected, floats);
            float *rounded = width_rounded_expected(&batch, causal, bias);
            /* each path's attention, then its F32 one where the first rounds */
            for (size_t run = 0; run < 2 * path_count; ++run) {
                kernels_t const *path = paths[run / 2];
                bool bf16 = kernel_attention_rounds(path) && run % 2 == 0;
                if (run % 2 && !kernel_attention_rounds(path)) continue;
                void (*attention)(kernel_attention_t const *, size_t, size_t) =
                    run % 2 ? path->attention_f32 : path->attention;
                float *whole = width_batch_out(&batch), *pieces = width_batch_out(&batch);
                a = width_batch_last_head(&batch, causal, bias, whole);
                attention(&a, 0, WIDTH_ITEMS);
                check_outside_last_head_untouched(&batch, whole);
                for (size_t i = 0; i < floats; ++i)
                    check_near(whole[i], bf16 ? rounded[i] : expected[i], bf16 ? 0x1p-8 : 1e-4, path->name,
                               i);
                a = width_batch_last_head(&batch, causal, bias, pieces);
                for (size_t c = 0; c + 1 < COUNT(cuts); ++c)
                    attention(&a, cuts[c], cuts[c + 1]);
                assert_memory_equal(pieces, whole, floats * sizeof(float));
                if (bias) {
                    float *alone = width_batch_out(&batch);
                    attend_items_alone(attention, width_batch_last_head(&batch, causal, bias, alone));
                    assert_memory_equal(alone, whole, floats * sizeof(float));
                    test_free(alone);
                }
                check_attention_scratch(&batch, causal, bias, attention, bf16, whole);
                test_free(whole), test_free(pieces);
            }
            test_free(expected), test_free(rounded);
        }
        free(table.entries);
        test_free(batch.qkv);
    }
}

static void paths_softmax_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    float const spreads[] = {10.0f, 200.0f}; /* the wide one underflows most weights */
    random_seed(10);
    for (size_t w = 0; w < COUNT(spreads); ++w) {
        for (size_t s = 0; s < COUNT(sizes); ++s) {
            size_t n = sizes[s];
            float *x = floats_uniform(n + 1, -spreads[w], spreads[w]),
                  *expected = test_malloc(n * sizeof(float));
            float *y = test_malloc((n + 1) * sizeof(float));
            memcpy(expected, x, n * sizeof(float));
            kernels_scalar()->softmax(expected, n);
            for (size_t p = 0; p < path_count; ++p) {
                memcpy(y, x, (n + 1) * sizeof(float));
                paths[p]->softmax(y, n);
                for (size_t i = 0; i < n; ++i)
                    check_near(y[i], expected[i], 1e-6, paths[p]->name, i);
                assert_true(y[n] == x[n]);
            }
            test_free(x), test_free(expected), test_free(y);
        }
    }
}

static void paths_normalize_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    random_seed(11);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s];
        float *x = floats_uniform(n + 1, -3.0f, 3.0f), *expected = test_malloc(n * sizeof(float));
        float *y = test_malloc((n + 1) * sizeof(float));
        memcpy(expected, x, n * sizeof(float));
        kernels_scalar()->normalize(expected, n);
        for (size_t p = 0; p < path_count; ++p) {
            memcpy(y, x, (n + 1) * sizeof(float));
            paths[p]->normalize(y, n);
            for (size_t i = 0; i < n; ++i)
                check_near(y[i], expected[i], 1e-6 * fabsf(expected[i]), paths[p]->name, i);
            assert_true(y[n] == x[n]);
            memset(y, 0, n * sizeof(float));
            paths[p]->normalize(y, n);
            for (size_t i = 0; i < n; ++i)
                assert_true(bits_of(y[i]) == 0);
        }
        test_free(x), test_free(expected), test_free(y);
    }
}

/* Floats that exercise conversions: special values first, then a mix of any bit pattern (NaNs,
 * infinities, subnormals), magnitudes around the F16 range, and exact F16 and BF16 rounding ties. */
static void conversion_inputs(float *x, size_t n) {
    uint32_t const specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
        0xffc00001u, 0x7fffffffu, 0x7f7fffffu, 0xff7fffffu, 0x00800000u, 0x00000001u,
        0x807fffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x33800000u, 0x33000000u,
        0x33c00000u, 0x387fe000u, 0x3f808000u, 0x3f818000u, 0x3f801000u, 0x3f803000u,
    };
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits = (uint32_t)random_bits(), sign = bits & 0x80000000u;
        switch (random_bits() % 4) {
        case 0:
            break;
        case 1:
            bits = sign | (uint32_t)(96 + random_bits() % 50) << 23 | (bits & 0x7fffffu);
            break;
        case 2:
            bits = sign | (uint32_t)(102 + random_bits() % 40) << 23 | (bits & 0x7fe000u) | 0x1000u;
            break;
        default:
            bits = (bits & 0xffff0000u) | 0x8000u;
            break;
        }
        x[i] = float_of(i < COUNT(specials) ? specials[i] : bits);
    }
}

static void paths_bf16_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), count = 65536 + 7;
    uint16_t *halves = test_malloc(count * sizeof(uint16_t));
    uint16_t *expected_halves = test_malloc(count * sizeof(uint16_t)),
             *actual_halves = test_malloc(count * sizeof(uint16_t));
    float *values = test_malloc(count * sizeof(float)), *expected = test_malloc(count * sizeof(float));
    float *actual = test_malloc(count * sizeof(float));
    random_seed(12);
    for (size_t i = 0; i < count; ++i)
        halves[i] = (uint16_t)i;
    conversion_inputs(values, count);
    kernels_scalar()->bf16_to_f32(expected, halves, count);
    kernels_scalar()->f32_to_bf16(expected_halves, values, count);
    for (size_t p = 0; p < path_count; ++p) {
        for (size_t s = 0; s <= COUNT(sizes); ++s) { /* every size from an unaligned start, then all */
            size_t offset = s < COUNT(sizes) ? s + 1 : 0, n = s < COUNT(sizes) ? sizes[s] : count;
            memset(actual, 0xff, count * sizeof(float));
            memset(actual_halves, 0xff, count * sizeof(uint16_t));
            paths[p]->bf16_to_f32(actual + offset, halves + offset, n);
            paths[p]->f32_to_bf16(actual_halves + offset, values + offset, n);
            assert_memory_equal(actual + offset, expected + offset, n * sizeof(float));
            assert_memory_equal(actual_halves + offset, expected_halves + offset, n * sizeof(uint16_t));
            if (offset + n < count) assert_true(bits_of(actual[offset + n]) == 0xffffffffu);
            if (offset + n < count) assert_true(actual_halves[offset + n] == 0xffff);
        }
    }
    test_free(halves), test_free(expected_halves), test_free(actual_halves);
    test_free(values), test_free(expected), test_free(actual);
}

/* One conversion of n values by one path against scalar: the same bytes, the same I8 scale, and nothing
 * written past the row. */
static void check_convert(kernels_t const *path, float const *x, size_t n, uform_scalar_t scalar) {
    size_t bytes = n * uform_scalar_size(scalar);
    unsigned char *expected = test_malloc(bytes + 16), *actual = test_malloc(bytes + 16);
    memset(expected, 0xa5, bytes + 16), memset(actual, 0xa5, bytes + 16);
    float expected_scale = -1.0f, actual_scale = -2.0f;
    kernels_scalar()->convert(expected, x, n, scalar, scalar == UFORM_I8 ? &expected_scale : NULL);
    path->convert(actual, x, n, scalar, scalar == UFORM_I8 ? &actual_scale : NULL);
    if (memcmp(expected, actual, bytes + 16)) {
        for (size_t i = 0; i < bytes + 16; ++i)
            if (expected[i] != actual[i])
                fail_msg("%s convert to %d, n %zu: byte %zu is 0x%02x, expected 0x%02x", path->name,
                         (int)scalar, n, i, actual[i], expected[i]);
    }
    if (scalar == UFORM_I8) assert_true(bits_of(actual_scale) == bits_of(expected_scale));
    test_free(expected), test_free(actual);
}

/* Rows for I8: random values, half-integers under scale 1 (every rounding tie), and a zero row. */
static void i8_rows(float *random, float *ties, float *zeros, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        random[i] = random_uniform(-3.0f, 3.0f);
        ties[i] = i == 0 ? -127.0f : (float)((int)(random_bits() % 509) - 254) / 2.0f;
        zeros[i] = i % 2 ? -0.0f : 0.0f;
    }
}

static void paths_convert_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), largest = sizes[COUNT(sizes) - 1];
    float *x = test_malloc(largest * sizeof(float)), *ties = test_malloc(largest * sizeof(float));
    float *zeros = test_malloc(largest * sizeof(float));
    random_seed(13);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s];
        for (size_t p = 0; p < path_count; ++p) {
            conversion_inputs(x, n);
            check_convert(paths[p], x, n, UFORM_F32);
            check_convert(paths[p], x, n, UFORM_BF16);
            check_convert(paths[p], x, n, UFORM_F16);
            i8_rows(x, ties, zeros, n);
            check_convert(paths[p], x, n, UFORM_I8);
            check_convert(paths[p], ties, n, UFORM_I8);
            check_convert(paths[p], zeros, n, UFORM_I8);
        }
    }
    test_free(x), test_free(ties), test_free(zeros);
}

static void paths_f16_round_every_boundary(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    float *values = test_malloc(F16_BOUNDARIES * sizeof(float));
    uint16_t *expected = test_malloc(F16_BOUNDARIES * sizeof(uint16_t));
    size_t count = f16_boundaries(values, expected);
    for (size_t p = 0; p < path_count; ++p)
        check_convert(paths[p], values, count, UFORM_F16);
    test_free(values), test_free(expected);
}

int main(void) {
    print_simd_paths();
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(scalar_rmsnorm_matches_formula),
        cmocka_unit_test(scalar_layernorm_matches_formula),
        cmocka_unit_test(scalar_rope_matches_formula),
        cmocka_unit_test(scalar_attention_matches_naive),
        cmocka_unit_test(scalar_attention_widths_match_naive),
        cmocka_unit_test(scalar_softmax_matches_formula),
        cmocka_unit_test(scalar_normalize_matches_formula),
        cmocka_unit_test(scalar_bf16_known_bits),
        cmocka_unit_test(scalar_f16_known_bits),
        cmocka_unit_test(scalar_f16_rounds_every_boundary),
        cmocka_unit_test(scalar_i8_known_rows),
        cmocka_unit_test(scalar_i8_matches_formula),
        cmocka_unit_test(paths_rmsnorm_match_scalar),
        cmocka_unit_test(paths_layernorm_match_scalar),
        cmocka_unit_test(paths_rope_match_scalar),
        cmocka_unit_test(paths_attention_match_scalar),
        cmocka_unit_test(paths_attention_widths_match_scalar),
        cmocka_unit_test(paths_softmax_match_scalar),
        cmocka_unit_test(paths_normalize_match_scalar),
        cmocka_unit_test(paths_bf16_match_scalar),
        cmocka_unit_test(paths_convert_match_scalar),
        cmocka_unit_test(paths_f16_round_every_boundary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
