/* The CUDA kernels (kernels/cuda/cuda_kernels.h) against the scalar CPU path (kernels.h) on random inputs
 * from fixed seeds: conversions, gathers and convert bitwise; RMSNorm, normalize, text_choose, attention
 * and the cuBLASLt linear layers within the tolerances the header gives, each case printing its largest
 * error and, when it fails, the function, the case, the element and both values. Output padding and the
 * rows after each output are checked untouched.
 *
 * Without the CUDA libraries (cuda_library_load: the driver first), without a CUDA device, or with one
 * older than compute capability 9.0, which the kernels are not built for, the program says why and exits
 * 77, meson's code for a skipped test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_library.h"
#include "fixtures.h"
#include "kernels.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))
#define SKIP         77
#define HEAD         CUDA_KERNELS_HEAD

static cudaStream_t stream;

/* ---- Random inputs ------------------------------------------------------------------------------ */

static float float_of(uint32_t bits) {
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

/* ---- Host and device memory --------------------------------------------------------------------- */

static void *host_alloc(size_t bytes) {
    if (bytes > ((size_t)1 << 40)) fail_msg("host_alloc of %zu bytes", bytes);
    void *memory = malloc(bytes ? bytes : 1);
    assert_non_null(memory);
    return memory;
}

static float *floats_uniform(size_t n, float low, float high) {
    float *x = host_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i)
        x[i] = random_uniform(low, high);
    return x;
}

static uint16_t *bf16_uniform(size_t n, float low, float high) {
    uint16_t *x = host_alloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i)
        x[i] = f32_to_bf16(random_uniform(low, high));
    return x;
}

static void cuda_check(cudaError_t error, char const *call, int line) {
    if (error != cudaSuccess)
        fail_msg("line %d: %s answered %s: %s", line, call, cudaGetErrorName(error),
                 cudaGetErrorString(error));
}
#define CUDA_CHECK(call) cuda_check((call), #call, __LINE__)

/* Device memory filled with the byte 0xff (a NaN in F32 and BF16): what a kernel leaves unwritten
 * shows. */
static void *device_alloc(size_t bytes) {
    void *memory = NULL;
    CUDA_CHECK(cudaMalloc(&memory, bytes ? bytes : 1));
    CUDA_CHECK(cudaMemset(memory, 0xff, bytes ? bytes : 1));
    CUDA_CHECK(cudaDeviceSynchronize());
    return memory;
}

/* Copies finish before the next kernel starts on any stream. */
static void *device_copy(void const *host, size_t bytes) {
    void *memory = device_alloc(bytes);
    CUDA_CHECK(cudaMemcpy(memory, host, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    return memory;
}

static void *host_copy(void const *device, size_t bytes) {
    void *memory = host_alloc(bytes);
    CUDA_CHECK(cudaMemcpy(memory, device, bytes, cudaMemcpyDeviceToHost));
    return memory;
}

static void device_free(void *memory) {
    CUDA_CHECK(cudaFree(memory));
}

/* A kernel's answer, then its completion: a launch error or a fault while it ran names the function and
 * the case. */
static void ran(cudaError_t launched, char const *function, char const *name) {
    if (launched != cudaSuccess)
        fail_msg("%s (%s) answered %s: %s", function, name, cudaGetErrorName(launched),
                 cudaGetErrorString(launched));
    cudaError_t done = cudaStreamSynchronize(stream);
    if (done != cudaSuccess)
        fail_msg("%s (%s) failed while running: %s: %s", function, name, cudaGetErrorName(done),
                 cudaGetErrorString(done));
}

/* ---- Comparisons -------------------------------------------------------------------------------- */

/* The largest error of a case relative to what it is allowed, and where: printed at the end, and the
 * test fails when it is over 1 (or any value was NaN where a number was expected). */
typedef struct check {
    char name[160];
    size_t columns; /* to print an index as [row][column] */
    size_t count;
    double worst_error, worst_ratio, got, expected, allowed;
    size_t at;
    bool failed;
} check_t;

static check_t check_start(size_t columns, char const *format, ...) {
    check_t check = {.columns = columns ? columns : 1, .worst_ratio = -1.0};
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(check.name, sizeof check.name, format, arguments);
    va_end(arguments);
    return check;
}

static void check_value(check_t *check, size_t index, double got, double expected, double allowed) {
    double error = fabs(got - expected),
           ratio = allowed > 0.0 ? error / allowed : (error > 0.0 ? INFINITY : 0.0);
    bool bad = !(error <= allowed); /* NaN is bad */
    ++check->count;
    if (error > check->worst_error) check->worst_error = error;
    if ((bad && !check->failed) || (!check->failed && ratio > check->worst_ratio)) {
        check->worst_ratio = bad && isnan(ratio) ? INFINITY : ratio;
        check->got = got, check->expected = expected, check->allowed = allowed, check->at = index;
        check->failed = bad;
    }
}

static void check_end(check_t const *check) {
    print_message("  %-64s max error %.3g (%.3g of allowed) over %zu values\n", check->name,
                  check->worst_error, check->worst_ratio < 0 ? 0.0 : check->worst_ratio, check->count);
    if (check->failed)
        fail_msg("%s: [%zu][%zu] = %.9g, expected %.9g, error %.3g allowed %.3g", check->name,
                 check->at / check->columns, check->at % check->columns, check->got, check->expected,
                 fabs(check->got - check->expected), check->allowed);
}

/* Bitwise equality of n elements of `size` bytes, rows of `columns` elements. */
static void check_bits(void const *got, void const *expected, size_t n, size_t size, size_t columns,
                       char const *name) {
    unsigned char const *a = got, *b = expected;
    for (size_t i = 0; i < n; ++i) {
        if (memcmp(a + i * size, b + i * size, size) == 0) continue;
        uint32_t g = 0, e = 0;
        memcpy(&g, a + i * size, size);
        memcpy(&e, b + i * size, size);
        fail_msg("%s: element [%zu][%zu] is 0x%0*x, the scalar path's 0x%0*x", name, i / columns, i % columns,
                 (int)(2 * size), g, (int)(2 * size), e);
    }
    print_message("  %-64s bitwise equal over %zu values\n", name, n);
}

/* ---- Conversions and gathers -------------------------------------------------------------------- */

static void conversions_bitwise(void **state) {
    (void)state;
    random_seed(1);
    size_t const n = 100003;
    float *values = host_alloc(n * sizeof(float));
    uint32_t const special[] = {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f800000u, 0xff800000u,
                                0x3f808000u, 0x3f818000u, 0x00008000u, 0x00018000u, 0x7f7fffffu, 0x80000000u};
    for (size_t i = 0; i < n; ++i) {
        uint32_t bits = (uint32_t)random_bits();
        values[i] = i < COUNT(special) ? float_of(special[i]) : float_of(bits);
    }
    uint16_t *expected = host_alloc(n * sizeof(uint16_t));
    kernels_scalar()->f32_to_bf16(expected, values, n);
    float *values_device = device_copy(values, n * sizeof(float));
    uint16_t *halves_device = device_alloc(n * sizeof(uint16_t));
    ran(cuda_f32_to_bf16(halves_device, values_device, n, stream), "cuda_f32_to_bf16", "random bits");
    uint16_t *halves = host_copy(halves_device, n * sizeof(uint16_t));
    check_bits(halves, expected, n, sizeof(uint16_t), n, "cuda_f32_to_bf16 on random bit patterns");

    float *widened_expected = host_alloc(n * sizeof(float));
    kernels_scalar()->bf16_to_f32(widened_expected, halves, n);
    ran(cuda_bf16_to_f32(values_device, halves_device, n, stream), "cuda_bf16_to_f32", "random bits");
    float *widened = host_copy(values_device, n * sizeof(float));
    check_bits(widened, widened_expected, n, sizeof(float), n, "cuda_bf16_to_f32 on random bit patterns");
    ran(cuda_bf16_to_f32(values_device, halves_device, 0, stream), "cuda_bf16_to_f32", "n = 0");
    free(values), free(expected), free(halves), free(widened_expected), free(widened);
    device_free(values_device), device_free(halves_device);
}

static void gathers_exact(void **state) {
    (void)state;
    random_seed(2);
    /* embed: table [257, 200] */
    size_t const hidden = 200, rows = 1000;
    uint16_t *table = bf16_uniform(257 * hidden, -2.0f, 2.0f);
    int32_t *indices = host_alloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; ++r)
        indices[r] = (int32_t)random_below(257);
    float *expected = host_alloc(rows * hidden * sizeof(float));
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < hidden; ++c)
            expected[r * hidden + c] = bf16_to_f32(table[(size_t)indices[r] * hidden + c]);
    uint16_t *table_device = device_copy(table, 257 * hidden * sizeof(uint16_t));
    int32_t *indices_device = device_copy(indices, rows * sizeof(int32_t));
    float *x_device = device_alloc(rows * hidden * sizeof(float));
    ran(cuda_embed(x_device, table_device, indices_device, rows, hidden, stream), "cuda_embed", "1000 x 200");
    float *x = host_copy(x_device, rows * hidden * sizeof(float));
    check_bits(x, expected, rows * hidden, sizeof(float), hidden, "cuda_embed 1000 rows of 200");
    free(x), free(expected);

    /* gather_rows: 300 rows of 130 out of src [500, 137] into dst stride 133 */
    size_t const count = 300, columns = 130, src_rows = 500, src_stride = 137, dst_stride = 133;
    float *src = floats_uniform(src_rows * src_stride, -5.0f, 5.0f);
    int32_t *picks = host_alloc(count * sizeof(int32_t));
    for (size_t r = 0; r < count; ++r) /* every seventh a failed item's: a row of zeros */
        picks[r] = r % 7 == 3 ? -1 : (int32_t)random_below(src_rows);
    float *src_device = device_copy(src, src_rows * src_stride * sizeof(float));
    int32_t *picks_device = device_copy(picks, count * sizeof(int32_t));
    float *dst_device = device_alloc(count * dst_stride * sizeof(float));
    ran(cuda_gather_rows(dst_device, dst_stride, src_device, src_stride, picks_device, count, columns,
                         stream),
        "cuda_gather_rows", "300 x 130");
    float *dst = host_copy(dst_device, count * dst_stride * sizeof(float));
    for (size_t r = 0; r < count; ++r) {
        for (size_t c = 0; c < dst_stride; ++c) {
            float got = dst[r * dst_stride + c];
            float want = picks[r] < 0 ? 0.0f : src[(size_t)picks[r] * src_stride + c];
            if (c < columns && memcmp(&got, &want, sizeof got) != 0)
                fail_msg("cuda_gather_rows: [%zu][%zu] = %g, expected %g", r, c, got, want);
            if (c >= columns && !isnan(got)) fail_msg("cuda_gather_rows wrote padding [%zu][%zu]", r, c);
        }
    }
    print_message("  %-64s exact\n", "cuda_gather_rows 300 rows of 130, padded strides, index -1");
    free(dst);

    /* add_rows: 37 rows of 100 at stride 104, period 5 */
    size_t const add_rows = 37, add_columns = 100, add_stride = 104, period = 5;
    float *base = floats_uniform(add_rows * add_stride, -1.0f, 1.0f);
    float *addend = floats_uniform(period * add_columns, -1.0f, 1.0f);
    float *base_device = device_copy(base, add_rows * add_stride * sizeof(float));
    float *addend_device = device_copy(addend, period * add_columns * sizeof(float));
    ran(cuda_add_rows(base_device, add_stride, addend_device, period, add_rows, add_columns, stream),
        "cuda_add_rows", "37 x 100, period 5");
    float *added = host_copy(base_device, add_rows * add_stride * sizeof(float));
    for (size_t r = 0; r < add_rows; ++r)
        for (size_t c = 0; c < add_stride; ++c) {
            float want = c < add_columns ? base[r * add_stride + c] + addend[(r % period) * add_columns + c]
                                         : base[r * add_stride + c];
            if (added[r * add_stride + c] != want)
                fail_msg("cuda_add_rows: [%zu][%zu] = %g, expected %g", r, c, added[r * add_stride + c],
                         want);
        }
    print_message("  %-64s exact\n", "cuda_add_rows 37 rows of 100, period 5");
    free(added);

    /* assemble_tokens: items of 3, 0, 5 and 1 patches of 70, max_patches 5 */
    int32_t const offsets[] = {0, 3, 3, 8, 9};
    size_t const items = 4, max_patches = 5, width = 70, tokens = 9 + 4;
    float *patches = floats_uniform(9 * width, -1.0f, 1.0f), *cls = floats_uniform(width, -1.0f, 1.0f);
    float *pos = floats_uniform((1 + max_patches) * width, -1.0f, 1.0f);
    float *patches_device = device_copy(patches, 9 * width * sizeof(float));
    float *cls_device = device_copy(cls, width * sizeof(float));
    float *pos_device = device_copy(pos, (1 + max_patches) * width * sizeof(float));
    int32_t *offsets_device = device_copy(offsets, sizeof offsets);
    float *tokens_device = device_alloc((tokens + 1) * width * sizeof(float));
    ran(cuda_assemble_tokens(tokens_device, patches_device, cls_device, pos_device, offsets_device, items,
                             max_patches, width, stream),
        "cuda_assemble_tokens", "3, 0, 5, 1 patches");
    float *assembled = host_copy(tokens_device, (tokens + 1) * width * sizeof(float));
    for (size_t item = 0; item < items; ++item)
        for (int32_t t = 0; t <= offsets[item + 1] - offsets[item]; ++t)
            for (size_t c = 0; c < width; ++c) {
                size_t row = (size_t)offsets[item] + item + (size_t)t;
                float want = t == 0 ? cls[c] + pos[c]
                                    : patches[((size_t)offsets[item] + (size_t)t - 1) * width + c] +
                                          pos[(size_t)t * width + c];
                if (assembled[row * width + c] != want)
                    fail_msg("cuda_assemble_tokens: item %zu token %d column %zu = %g, expected %g", item, t,
                             c, assembled[row * width + c], want);
            }
    for (size_t c = 0; c < width; ++c)
        if (!isnan(assembled[tokens * width + c])) fail_msg("cuda_assemble_tokens wrote past the last token");
    print_message("  %-64s exact\n", "cuda_assemble_tokens items of 3, 0, 5, 1 patches");
    free(assembled);

    free(table), free(indices), free(src), free(picks), free(base), free(addend), free(patches), free(cls),
        free(pos);
    device_free(table_device), device_free(indices_device), device_free(x_device), device_free(src_device),
        device_free(picks_device), device_free(dst_device), device_free(base_device),
        device_free(addend_device), device_free(patches_device), device_free(cls_device),
        device_free(pos_device), device_free(offsets_device), device_free(tokens_device);
}

/* The clip pooling: a mean of each group of rows, bitwise the host's loop (src/encode/video.c, rows_mean):
 * summed in order in F32, then divided. Groups of 8, 3 and 1; group 0 refused. */
static void mean_rows_bitwise(void **state) {
    (void)state;
    random_seed(3);
    size_t const groups = 37, columns = 130, x_stride = 133, out_stride = 131;
    size_t const sizes[] = {8, 3, 1};
    for (size_t g = 0; g < COUNT(sizes); ++g) {
        size_t const group = sizes[g], rows = groups * group;
        float *x = floats_uniform(rows * x_stride, -3.0f, 3.0f);
        float *expected = host_alloc(groups * out_stride * sizeof(float));
        memset(expected, 0xff, groups * out_stride * sizeof(float));
        for (size_t k = 0; k < groups; ++k)
            for (size_t c = 0; c < columns; ++c) {
                float sum = 0.0f;
                for (size_t r = 0; r < group; ++r)
                    sum += x[(k * group + r) * x_stride + c];
                expected[k * out_stride + c] = sum / (float)group;
            }
        float *x_device = device_copy(x, rows * x_stride * sizeof(float));
        float *out_device = device_alloc(groups * out_stride * sizeof(float));
        char name[64];
        snprintf(name, sizeof name, "37 groups of %zu rows of 130", group);
        ran(cuda_mean_rows(out_device, out_stride, x_device, x_stride, groups, group, columns, stream),
            "cuda_mean_rows", name);
        float *out = host_copy(out_device, groups * out_stride * sizeof(float));
        char what[96];
        snprintf(what, sizeof what, "cuda_mean_rows %s, padded strides", name);
        check_bits(out, expected, groups * out_stride, sizeof(float), out_stride, what);
        free(x), free(expected), free(out);
        device_free(x_device), device_free(out_device);
    }
    assert_int_equal(cuda_mean_rows(NULL, 1, NULL, 1, 1, 0, 1, stream), cudaErrorInvalidValue);
}

/* ---- Normalization ------------------------------------------------------------------------------ */

static size_t const row_sizes[] = {1, 3, 64, 65, 768, 1000, 3072};

static void rmsnorm_matches_scalar(void **state) {
    (void)state;
    random_seed(3);
    size_t const rows = 5;
    for (size_t s = 0; s < COUNT(row_sizes); ++s) {
        size_t n = row_sizes[s], x_stride = n + 5, f32_stride = n + 3, bf16_stride = n + 7;
        float *x = floats_uniform(rows * x_stride, -2.0f, 2.0f), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *expected = host_alloc(rows * n * sizeof(float));
        kernels_scalar()->rmsnorm(expected, n, x, x_stride, weight, rows, n, 1e-6f);
        float *x_device = device_copy(x, rows * x_stride * sizeof(float));
        float *weight_device = device_copy(weight, n * sizeof(float));
        float *y_device = device_alloc(rows * f32_stride * sizeof(float));
        uint16_t *y16_device = device_alloc(rows * bf16_stride * sizeof(uint16_t));
        ran(cuda_rmsnorm(y16_device, bf16_stride, y_device, f32_stride, x_device, x_stride, weight_device,
                         rows, n, 1e-6f, stream),
            "cuda_rmsnorm", "both outputs");
        float *y = host_copy(y_device, rows * f32_stride * sizeof(float));
        uint16_t *y16 = host_copy(y16_device, rows * bf16_stride * sizeof(uint16_t));
        check_t f32 = check_start(n, "cuda_rmsnorm F32, %zu rows of %zu", rows, n);
        /* BF16: one rounding (at most 2^-8 relative) of a value within 1e-5 of the scalar one */
        check_t bf16 = check_start(n, "cuda_rmsnorm BF16, %zu rows of %zu", rows, n);
        for (size_t r = 0; r < rows; ++r) {
            for (size_t i = 0; i < n; ++i) {
                double e = expected[r * n + i];
                check_value(&f32, r * n + i, y[r * f32_stride + i], e, 1e-5 * fabs(e) + 1e-30);
                check_value(&bf16, r * n + i, bf16_to_f32(y16[r * bf16_stride + i]), e,
                            (0x1p-8 + 1e-5) * fabs(e) + 1e-30);
            }
            for (size_t i = n; i < f32_stride; ++i)
                if (!isnan(y[r * f32_stride + i]))
                    fail_msg("cuda_rmsnorm wrote F32 padding [%zu][%zu]", r, i);
            for (size_t i = n; i < bf16_stride; ++i)
                if (y16[r * bf16_stride + i] != 0xffff)
                    fail_msg("cuda_rmsnorm wrote BF16 padding [%zu][%zu]", r, i);
        }
        check_end(&f32), check_end(&bf16);

        /* In place, F32 only */
        ran(cuda_rmsnorm(NULL, 0, x_device, x_stride, x_device, x_stride, weight_device, rows, n, 1e-6f,
                         stream),
            "cuda_rmsnorm", "in place");
        float *in_place = host_copy(x_device, rows * x_stride * sizeof(float));
        check_t place = check_start(n, "cuda_rmsnorm in place, %zu rows of %zu", rows, n);
        for (size_t r = 0; r < rows; ++r) {
            for (size_t i = 0; i < n; ++i) {
                double e = expected[r * n + i];
                check_value(&place, r * n + i, in_place[r * x_stride + i], e, 1e-5 * fabs(e) + 1e-30);
            }
            if (memcmp(in_place + r * x_stride + n, x + r * x_stride + n, 5 * sizeof(float)))
                fail_msg("cuda_rmsnorm in place wrote the padding of row %zu", r);
        }
        check_end(&place);
        free(x), free(weight), free(expected), free(y), free(y16), free(in_place);
        device_free(x_device), device_free(weight_device), device_free(y_device), device_free(y16_device);
    }
}

static void normalize_matches_scalar(void **state) {
    (void)state;
    random_seed(4);
    size_t const rows = 4;
    for (size_t s = 0; s < COUNT(row_sizes); ++s) {
        size_t n = row_sizes[s], stride = n + 2;
        float *x = floats_uniform(rows * stride, -3.0f, 3.0f);
        for (size_t i = 0; i < n; ++i)
            x[2 * stride + i] = 0.0f; /* row 2 is zero and stays zero */
        float *expected = host_alloc(rows * stride * sizeof(float));
        memcpy(expected, x, rows * stride * sizeof(float));
        for (size_t r = 0; r < rows; ++r)
            kernels_scalar()->normalize(expected + r * stride, n);
        float *x_device = device_copy(x, rows * stride * sizeof(float));
        ran(cuda_normalize(x_device, stride, rows, n, stream), "cuda_normalize", "rows with a zero row");
        float *y = host_copy(x_device, rows * stride * sizeof(float));
        check_t check = check_start(stride, "cuda_normalize, %zu rows of %zu, one zero", rows, n);
        for (size_t i = 0; i < rows * stride; ++i)
            check_value(&check, i, y[i], expected[i], i % stride < n ? 1e-6 * fabs(expected[i]) : 0.0);
        check_end(&check);
        free(x), free(expected), free(y);
        device_free(x_device);
    }
}

/* ---- convert ------------------------------------------------------------------------------------ */

typedef struct convert_shape {
    size_t rows, columns;
} convert_shape_t;

static void convert_bitwise(void **state) {
    (void)state;
    random_seed(5);
    convert_shape_t const shapes[] = {{3, 1}, {5, 17}, {4, 768}, {2, 1000}, {64, 255}};
    uform_scalar_t const scalars[] = {UFORM_F32, UFORM_BF16, UFORM_F16, UFORM_I8};
    size_t const widths[] = {4, 2, 2, 1};
    char const *names[] = {"F32", "BF16", "F16", "I8"};
    for (size_t sh = 0; sh < COUNT(shapes); ++sh) {
        size_t rows = shapes[sh].rows, columns = shapes[sh].columns, x_stride = columns + 3;
        for (size_t k = 0; k < COUNT(scalars); ++k) {
            size_t width = widths[k], out_stride = (columns + 5) * width; /* bytes */
            float *x = host_alloc(rows * x_stride * sizeof(float));
            for (size_t r = 0; r < rows; ++r) {
                for (size_t c = 0; c < x_stride; ++c) {
                    float *at = x + r * x_stride + c;
                    if (scalars[k] != UFORM_I8) { /* every bit pattern, NaNs included, and small values */
                        uint32_t bits = (uint32_t)random_bits();
                        *at = c % 3 ? float_of(bits) : random_uniform(-70000.0f, 70000.0f) * 0x1p-20f;
                    } else if (r == 1) {
                        *at = 0.0f;      /* a zero row */
                    } else if (r == 2) { /* scale 1 and exact halves: rounding half away from zero */
                        *at = c == 0 ? 127.0f : (float)((int)random_below(253) - 126) + 0.5f;
                    } else {
                        *at = random_uniform(-3.0f, 3.0f) * (float)(r + 1);
                    }
                }
            }
            unsigned char *expected = host_alloc(rows * out_stride);
            float *expected_scales = host_alloc(rows * sizeof(float));
            memset(expected, 0xff, rows * out_stride);
            for (size_t r = 0; r < rows; ++r)
                kernels_scalar()->convert(expected + r * out_stride, x + r * x_stride, columns, scalars[k],
                                          &expected_scales[r]);
            float *x_device = device_copy(x, rows * x_stride * sizeof(float));
            unsigned char *out_device = device_alloc(rows * out_stride);
            float *scales_device = device_alloc(rows * sizeof(float));
            char name[96];
            snprintf(name, sizeof name, "cuda_convert %s, %zu rows of %zu", names[k], rows, columns);
            ran(cuda_convert(out_device, out_stride, scales_device, x_device, x_stride, rows, columns,
                             (int)scalars[k], stream),
                "cuda_convert", name);
            unsigned char *out = host_copy(out_device, rows * out_stride);
            check_bits(out, expected, rows * out_stride / width, width, out_stride / width, name);
            if (scalars[k] == UFORM_I8) {
                float *scales = host_copy(scales_device, rows * sizeof(float));
                check_bits(scales, expected_scales, rows, sizeof(float), 1, "cuda_convert I8 scales");
                free(scales);
            }
            free(x), free(expected), free(expected_scales), free(out);
            device_free(x_device), device_free(out_device), device_free(scales_device);
        }
    }
    assert_int_equal(cuda_convert(NULL, 0, NULL, NULL, 0, 1, 1, 7, stream), cudaErrorInvalidValue);
    assert_int_equal(cuda_convert(NULL, 0, NULL, NULL, 0, 1, 1, UFORM_I8, stream), cudaErrorInvalidValue);
}

/* ---- text_choose -------------------------------------------------------------------------------- */

static void choose_matches_scalar(void **state) {
    (void)state;
    random_seed(6);
    size_t const counts[] = {1, 5, 256, 17, 100, 2};
    size_t const hiddens[] = {64, 768};
    for (size_t h = 0; h < COUNT(hiddens); ++h) {
        size_t hidden = hiddens[h], items = COUNT(counts), stride = hidden + 4, first = 3;
        int64_t offsets[COUNT(counts) + 1];
        offsets[0] = (int64_t)first; /* the tape starts 3 bytes in */
        for (size_t i = 0; i < items; ++i)
            offsets[i + 1] = offsets[i] + (int64_t)counts[i];
        size_t total = (size_t)(offsets[items] - offsets[0]);
        uint8_t *legal = host_alloc(first + total);
        for (size_t i = 0; i < items; ++i) { /* distinct bytes: a shuffled prefix of 0..255 */
            uint8_t bytes[256];
            for (size_t b = 0; b < 256; ++b)
                bytes[b] = (uint8_t)b;
            for (size_t b = 255; b > 0; --b) {
                size_t other = random_below(b + 1);
                uint8_t swap = bytes[b];
                bytes[b] = bytes[other], bytes[other] = swap;
            }
            memcpy(legal + offsets[i], bytes, counts[i]);
        }
        memset(legal, 0, first);
        float *states = floats_uniform(items * stride, -1.0f, 1.0f);
        uint16_t *table = bf16_uniform(257 * hidden, -0.25f, 0.25f);
        float *expected = host_alloc(total * sizeof(float));
        for (size_t i = 0; i < items; ++i) { /* as src/encode/text.c's choose_start */
            float *logits = expected + (offsets[i] - offsets[0]);
            for (size_t j = 0; j < counts[i]; ++j) {
                uint16_t const *row = table + (size_t)legal[offsets[i] + (int64_t)j] * hidden;
                float sum = 0.0f;
                for (size_t d = 0; d < hidden; ++d)
                    sum += states[i * stride + d] * bf16_to_f32(row[d]);
                logits[j] = sum;
            }
            kernels_scalar()->softmax(logits, counts[i]);
        }
        float *states_device = device_copy(states, items * stride * sizeof(float));
        uint16_t *table_device = device_copy(table, 257 * hidden * sizeof(uint16_t));
        uint8_t *legal_device = device_copy(legal, first + total);
        int64_t *offsets_device = device_copy(offsets, sizeof offsets);
        float *probabilities_device = device_alloc((total + 1) * sizeof(float));
        ran(cuda_choose(probabilities_device, states_device, stride, table_device, legal_device,
                        offsets_device, items, hidden, stream),
            "cuda_choose", "items of 1, 5, 256, 17, 100, 2 legal bytes");
        float *probabilities = host_copy(probabilities_device, (total + 1) * sizeof(float));
        check_t check = check_start(total, "cuda_choose, 6 items, hidden %zu", hidden);
        for (size_t j = 0; j < total; ++j)
            check_value(&check, j, probabilities[j], expected[j], 1e-5);
        check_end(&check);
        if (!isnan(probabilities[total])) fail_msg("cuda_choose wrote past the last probability");
        free(legal), free(states), free(table), free(expected), free(probabilities);
        device_free(states_device), device_free(table_device), device_free(legal_device),
            device_free(offsets_device), device_free(probabilities_device);
    }
}

/* ---- Attention ---------------------------------------------------------------------------------- */

/* One attention case: items of `lengths` packed end to end, qkv BF16 [tokens, 3 * heads * 64] with
 * values in [-1, 1] and q, k scaled by `amplitude`. The scalar reference runs on the same BF16 values:
 * rope at each row's position in its item when `rotary`, then kernels.h's attention per head. With
 * `misaligned`, qkv and out start 2 bytes past a 16-byte boundary (the kernel's scalar loads). */
static void attention_case(size_t const *lengths, size_t items, size_t heads, bool causal, bool rotary,
                           float amplitude, bool misaligned, char const *label) {
    size_t width = 3 * heads * HEAD, hidden = heads * HEAD, tokens = 0, max_length = 0;
    size_t *offsets = host_alloc((items + 1) * sizeof(size_t));
    int32_t *offsets32 = host_alloc((items + 1) * sizeof(int32_t));
    offsets[0] = 0;
    for (size_t i = 0; i < items; ++i) {
        offsets[i + 1] = offsets[i] + lengths[i];
        if (lengths[i] > max_length) max_length = lengths[i];
    }
    tokens = offsets[items];
    for (size_t i = 0; i <= items; ++i)
        offsets32[i] = (int32_t)offsets[i];
    uint16_t *qkv = host_alloc(tokens * width * sizeof(uint16_t));
    float *reference_in = host_alloc(tokens * width * sizeof(float));
    double max_v = 0.0;
    for (size_t row = 0; row < tokens; ++row)
        for (size_t i = 0; i < width; ++i) {
            float scale = i < 2 * hidden ? amplitude : 1.0f;
            qkv[row * width + i] = f32_to_bf16(scale * random_uniform(-1.0f, 1.0f));
            reference_in[row * width + i] = bf16_to_f32(qkv[row * width + i]);
            if (i >= 2 * hidden) max_v = fmax(max_v, fabs(reference_in[row * width + i]));
        }
    if (rotary)
        for (size_t item = 0; item < items; ++item)
            for (size_t row = offsets[item]; row < offsets[item + 1]; ++row) {
                kernels_scalar()->rope(reference_in + row * width, heads, row - offsets[item]);
                kernels_scalar()->rope(reference_in + row * width + hidden, heads, row - offsets[item]);
            }
    float *expected = host_alloc((tokens ? tokens : 1) * hidden * sizeof(float));
    for (size_t h = 0; h < heads; ++h) {
        kernel_attention_t a = {
            .q = reference_in + h * HEAD,
            .k = reference_in + hidden + h * HEAD,
            .v = reference_in + 2 * hidden + h * HEAD,
            .stride = width,
            .out = expected + h * HEAD,
            .out_stride = hidden,
            .offsets = offsets,
            .items = items,
            .causal = causal,
            .scale = 0.125f,
        };
        kernels_scalar()->attention(&a, 0, items);
    }

    size_t shift = misaligned ? 1 : 0; /* elements */
    uint16_t *qkv_base = device_alloc((tokens * width + 8) * sizeof(uint16_t));
    uint16_t *out_base = device_alloc(((tokens + 1) * hidden + 8) * sizeof(uint16_t));
    CUDA_CHECK(cudaMemcpy(qkv_base + shift, qkv, tokens * width * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    int32_t *offsets_device = device_copy(offsets32, (items + 1) * sizeof(int32_t));
    char name[160];
    snprintf(name, sizeof name, "cuda_attention %s%s%s%s, amplitude %g, %zu heads", label,
             causal ? ", causal" : "", rotary ? ", rotary" : "", misaligned ? ", misaligned" : "",
             (double)amplitude, heads);
    ran(cuda_attention(out_base + shift, qkv_base + shift, offsets_device, items, heads, max_length, causal,
                       rotary, 0.125f, stream),
        "cuda_attention", name);
    uint16_t *out = host_alloc(((tokens + 1) * hidden + 8) * sizeof(uint16_t));
    CUDA_CHECK(
        cudaMemcpy(out, out_base, ((tokens + 1) * hidden + 8) * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    check_t check = check_start(hidden, "%s", name);
    for (size_t i = 0; i < tokens * hidden; ++i)
        check_value(&check, i, bf16_to_f32(out[shift + i]), expected[i], 2e-2 * max_v);
    check_end(&check);
    for (size_t i = 0; i < (tokens + 1) * hidden + 8; ++i)
        if ((i < shift || i >= shift + tokens * hidden) && out[i] != 0xffff)
            fail_msg("%s wrote element %zu outside the output (%zu tokens of %zu)", name, i, tokens, hidden);
    free(offsets), free(offsets32), free(qkv), free(reference_in), free(expected), free(out);
    device_free(qkv_base), device_free(out_base), device_free(offsets_device);
}

static void attention_matches_scalar(void **state) {
    (void)state;
    random_seed(7);
    size_t const lengths[] = {1, 7, 64, 65, 197, 300, 0, 128};
    float const amplitudes[] = {1.0f, 3.0f};
    for (int causal = 0; causal < 2; ++causal)
        for (int rotary = 0; rotary < 2; ++rotary)
            for (size_t a = 0; a < COUNT(amplitudes); ++a)
                attention_case(lengths, COUNT(lengths), 3, causal, rotary, amplitudes[a], false,
                               "lengths 1 7 64 65 197 300 0 128");
    size_t const single[] = {1};
    attention_case(single, 1, 1, true, true, 1.0f, false, "one item of 1");
    attention_case(lengths, COUNT(lengths), 2, true, true, 1.0f, true, "lengths 1 7 64 65 197 300 0 128");
    attention_case(lengths, COUNT(lengths), 2, false, false, 1.0f, true, "lengths 1 7 64 65 197 300 0 128");
}

static void attention_many_and_long(void **state) {
    (void)state;
    random_seed(8);
    size_t const many = 2000;
    size_t *lengths = host_alloc(many * sizeof(size_t));
    for (size_t i = 0; i < many; ++i)
        lengths[i] = 1 + random_below(80);
    attention_case(lengths, many, 2, true, true, 1.0f, false, "2000 items of 1..80");
    attention_case(lengths, many, 2, false, false, 1.0f, false, "2000 items of 1..80");
    free(lengths);
    size_t const long_items[] = {2100, 33};
    attention_case(long_items, COUNT(long_items), 2, true, true, 1.0f, false, "lengths 2100 33");
    attention_case(long_items, COUNT(long_items), 2, false, true, 1.0f, false, "lengths 2100 33");
    assert_int_equal(cuda_attention(NULL, NULL, NULL, 1, 70000, 1, false, false, 0.125f, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(cuda_attention(NULL, NULL, NULL, 0, 3, 1, false, false, 0.125f, stream), cudaSuccess);
}

/* ---- Linear layers ------------------------------------------------------------------------------ */

typedef struct linear_shape {
    size_t m, n, k, x_stride, y_stride;
} linear_shape_t;

static char const *kind_names[] = {"BF16", "GELU_BF16", "RESIDUAL", "F32"};

/* What the scalar GEMM answers for `linear` over its operands on the host: x and w in BF16, b (the bias,
 * where `linear` has one) and y0 (y's start: the residual of CUDA_LINEAR_RESIDUAL, and the padding
 * columns). F32 rows of linear->y_stride; the caller frees them. */
static float *scalar_linear(cuda_linear_t const *linear, uint16_t const *x, uint16_t const *w, float const *b,
                            float const *y0) {
    kernels_t const *scalar = kernels_scalar();
    size_t y_bytes = linear->m * linear->y_stride * sizeof(float);
    float *expected = host_alloc(y_bytes);
    void *packed = host_alloc(scalar->gemm_packed_size(linear->n, linear->k));
    scalar->gemm_pack(packed, w, linear->n, linear->k);
    memcpy(expected, y0, y_bytes);
    kernel_gemm_t reference = {
        .m = linear->m,
        .n = linear->n,
        .k = linear->k,
        .x_bf16 = x,
        .x_stride = linear->x_stride,
        .w = packed,
        .bias = linear->bias ? b : NULL,
        .residual = linear->kind == CUDA_LINEAR_RESIDUAL ? y0 : NULL,
        .residual_stride = linear->y_stride,
        .y = expected,
        .y_stride = linear->y_stride,
        .epilogue = linear->kind == CUDA_LINEAR_GELU_BF16 ? KERNEL_EPILOGUE_GELU : KERNEL_EPILOGUE_NONE,
    };
    scalar->gemm(&reference, 0, linear->n);
    free(packed);
    return expected;
}

/* The device's `y` (copied back) against the scalar GEMM's `expected`, at the tolerance below, over the
 * host operands x, w (BF16), b and y0; the padding columns past n untouched (y0's where the layer adds a
 * residual, else the NaNs device_alloc fills with). */
static void check_linear(cuda_linear_t const *linear, char const *name, bool fused, void const *y,
                         uint16_t const *x, uint16_t const *w, float const *b, float const *y0,
                         float const *expected) {
    size_t m = linear->m, n = linear->n, k = linear->k, xs = linear->x_stride, ys = linear->y_stride;
    bool bf16_out = linear->kind == CUDA_LINEAR_BF16 || linear->kind == CUDA_LINEAR_GELU_BF16;
    check_t check = check_start(n, "%s (%s)", name, fused ? "fused" : "our epilogue");
    for (size_t r = 0; r < m; ++r) {
        for (size_t c = 0; c < ys; ++c) {
            double got =
                bf16_out ? bf16_to_f32(((uint16_t const *)y)[r * ys + c]) : ((float const *)y)[r * ys + c];
            if (c >= n) {
                double untouched = linear->kind == CUDA_LINEAR_RESIDUAL ? y0[r * ys + c] : NAN;
                if (!(got == untouched || (isnan(got) && isnan(untouched))))
                    fail_msg("%s wrote padding [%zu][%zu]", name, r, c);
                continue;
            }
            double magnitude = linear->bias ? fabs(b[c]) : 0.0;
            for (size_t i = 0; i < k; ++i)
                magnitude += fabs((double)bf16_to_f32(x[r * xs + i]) * bf16_to_f32(w[c * k + i]));
            check_value(&check, r * n + c, got, expected[r * ys + c], 1e-2 * magnitude + 1e-6);
        }
    }
    check_end(&check);
}

/* One layer of `kind` on cuBLASLt against the scalar GEMM on the same BF16 x and w, with kernels.h's
 * tolerance |y - y_scalar| <= 1e-2 (|bias| + sum_k |x w|) + 1e-6. */
static void linear_case(cuda_gemm_t *gemm, linear_shape_t shape, cuda_linear_kind_t kind, bool bias,
                        bool fuse) {
    size_t m = shape.m, n = shape.n, k = shape.k, xs = shape.x_stride, ys = shape.y_stride;
    bool bf16_out = kind == CUDA_LINEAR_BF16 || kind == CUDA_LINEAR_GELU_BF16;
    float w_scale = 3.0f / sqrtf((float)k); /* sums of order 1: GELU sees both of its sides */
    uint16_t *x = bf16_uniform(m * xs, -1.0f, 1.0f), *w = bf16_uniform(n * k, -w_scale, w_scale);
    float *b = floats_uniform(n, -1.0f, 1.0f), *y0 = floats_uniform(m * ys, -1.0f, 1.0f);
    uint16_t *x_device = device_copy(x, m * xs * sizeof(uint16_t));
    uint16_t *w_device = device_copy(w, n * k * sizeof(uint16_t));
    float *b_device = device_copy(b, n * sizeof(float));
    size_t y_bytes = m * ys * (bf16_out ? sizeof(uint16_t) : sizeof(float));
    void *y_device = kind == CUDA_LINEAR_RESIDUAL ? device_copy(y0, y_bytes) : device_alloc(y_bytes);
    cuda_linear_t linear = {
        .m = m,
        .n = n,
        .k = k,
        .x = x_device,
        .x_stride = xs,
        .w = w_device,
        .bias = bias ? b_device : NULL,
        .y = y_device,
        .y_stride = ys,
        .kind = kind,
    };
    float *expected = scalar_linear(&linear, x, w, b, y0);
    char name[160];
    snprintf(name, sizeof name, "cuda_linear %s%s m %zu n %zu k %zu strides %zu %zu%s", kind_names[kind],
             bias ? " +bias" : "", m, n, k, xs, ys, fuse ? "" : ", fallback forced");
    cuda_gemm_set_fuse(gemm, fuse);
    char const *message = "(none)";
    cudaError_t launched = cuda_linear(gemm, &linear, &message);
    if (launched != cudaSuccess)
        fail_msg("%s answered %s: %s; step: %s; cublasStatus_t %d", name, cudaGetErrorName(launched),
                 cudaGetErrorString(launched), message, cuda_gemm_last_status(gemm));
    ran(cudaSuccess, "cuda_linear", name);
    bool fused = cuda_gemm_last_fused(gemm);
    unsigned char *y = host_copy(y_device, y_bytes);
    check_linear(&linear, name, fused, y, x, w, b, y0, expected);
    free(x), free(w), free(b), free(y0), free(expected), free(y);
    device_free(x_device), device_free(w_device), device_free(b_device), device_free(y_device);
}

static void linear_matches_scalar(void **state) {
    (void)state;
    random_seed(9);
    cuda_gemm_t *gemm = NULL;
    CUDA_CHECK(cuda_gemm_create(&gemm, stream));
    linear_shape_t const shapes[] = {
        {1, 64, 128, 128, 64},       {7, 100, 768, 776, 104},  {33, 2304, 768, 768, 2304},
        {130, 768, 3072, 3072, 768}, {64, 50, 3072, 3080, 56}, {5, 257, 128, 136, 264},
        {300, 192, 64, 64, 192},
    };
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (int kind = 0; kind < 4; ++kind) {
            linear_case(gemm, shapes[s], (cuda_linear_kind_t)kind, true, true);
            if (kind != CUDA_LINEAR_RESIDUAL)
                linear_case(gemm, shapes[s], (cuda_linear_kind_t)kind, false, true);
        }
    for (int kind = 0; kind < 4; ++kind) { /* the fallback epilogue, and the cache after it */
        linear_case(gemm, shapes[1], (cuda_linear_kind_t)kind, true, false);
        linear_case(gemm, shapes[3], (cuda_linear_kind_t)kind, true, false);
        linear_case(gemm, shapes[1], (cuda_linear_kind_t)kind, true, true);
    }
    cuda_linear_t empty = {.m = 0, .n = 8, .k = 8, .kind = CUDA_LINEAR_F32};
    char const *message = NULL;
    assert_int_equal(cuda_linear(gemm, &empty, &message), cudaSuccess);
    cuda_linear_t wrong = {.m = 1, .n = 8, .k = 8, .x_stride = 4, .y_stride = 8, .kind = CUDA_LINEAR_F32};
    assert_int_equal(cuda_linear(gemm, &wrong, &message), cudaErrorInvalidValue);
    assert_non_null(message);
    cuda_gemm_destroy(gemm);
}

/* ---- Main --------------------------------------------------------------------------------------- */

static int setup(void **state) {
    (void)state;
    return cudaStreamCreate(&stream) == cudaSuccess ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return cudaStreamDestroy(stream) == cudaSuccess ? 0 : -1;
}

int main(void) {
    char const *missing = NULL;
    if (!cuda_library_load(&missing)) {
        printf("SKIP: %s\n", missing);
        return SKIP;
    }
    int devices = 0;
    cudaError_t error = cudaGetDeviceCount(&devices);
    if (error != cudaSuccess || devices == 0) {
        printf("SKIP: no CUDA device (%s)\n",
               error != cudaSuccess ? cudaGetErrorString(error) : "none found");
        return SKIP;
    }
    struct cudaDeviceProp properties;
    if ((error = cudaGetDeviceProperties(&properties, 0)) != cudaSuccess) {
        printf("SKIP: cannot read device 0's properties (%s)\n", cudaGetErrorString(error));
        return SKIP;
    }
    printf("device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", properties.name, properties.major,
           properties.minor, properties.multiProcessorCount, (double)properties.totalGlobalMem / (1u << 30));
    if (properties.major < 9) {
        printf("SKIP: the kernels are built for compute capability 9.0 and later\n");
        return SKIP;
    }
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(conversions_bitwise),      cmocka_unit_test(gathers_exact),
        cmocka_unit_test(mean_rows_bitwise),        cmocka_unit_test(rmsnorm_matches_scalar),
        cmocka_unit_test(normalize_matches_scalar), cmocka_unit_test(convert_bitwise),
        cmocka_unit_test(choose_matches_scalar),    cmocka_unit_test(attention_matches_scalar),
        cmocka_unit_test(attention_many_and_long),  cmocka_unit_test(linear_matches_scalar),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
