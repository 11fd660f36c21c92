/* The CUDA kernels (kernels/cuda/cuda_kernels.h) against the scalar CPU path (kernels.h) on random inputs
 * from fixed seeds: conversions, gathers and convert bitwise; RMSNorm, normalize, text_choose, attention
 * (with and without a bias by relative position) and the cuBLASLt linear layers within the tolerances the
 * header gives; and the kernels of training (kernels/cuda/cuda_train.h): GELU and RMSNorm backward, bias
 * gradients, the towers' input gradients bitwise, attention backward against the scalar path's, the
 * backward products of linear layers, the next-byte and contrastive losses against the RAM trainer's
 * formulas in double, and AdamW bitwise the RAM trainer's from the same stored values (skipping a
 * non-finite loss or norm). Each case printing its largest error and, when it fails, the function, the
 * case, the element and both values. Output padding and the rows after each output are checked untouched.
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
#include "cuda/cuda_train.h"
#include "fixtures.h"
#include "kernels.h"
#include "train_device.h"
#include "train_vram.h"

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

    /* assemble_leading: the same items after a class token and 2 registers (pos rows 1 and 2 as they are) */
    size_t const leading = 3, lead_tokens = 9 + 4 * leading;
    float *lead_pos = floats_uniform((leading + max_patches) * width, -1.0f, 1.0f);
    float *lead_pos_device = device_copy(lead_pos, (leading + max_patches) * width * sizeof(float));
    float *lead_device = device_alloc((lead_tokens + 1) * width * sizeof(float));
    CUDA_CHECK(cudaMemset(lead_device, 0xff, (lead_tokens + 1) * width * sizeof(float)));
    ran(cuda_assemble_leading(lead_device, patches_device, cls_device, lead_pos_device, offsets_device, items,
                              max_patches, leading, width, stream),
        "cuda_assemble_leading", "3, 0, 5, 1 patches, 2 registers");
    float *led = host_copy(lead_device, (lead_tokens + 1) * width * sizeof(float));
    for (size_t item = 0; item < items; ++item)
        for (size_t t = 0; t < (size_t)(offsets[item + 1] - offsets[item]) + leading; ++t)
            for (size_t c = 0; c < width; ++c) {
                size_t row = (size_t)offsets[item] + item * leading + t;
                float want = t == 0        ? cls[c] + lead_pos[c]
                             : t < leading ? lead_pos[t * width + c]
                                           : patches[((size_t)offsets[item] + t - leading) * width + c] +
                                                 lead_pos[t * width + c];
                if (led[row * width + c] != want)
                    fail_msg("cuda_assemble_leading: item %zu token %zu column %zu = %g, expected %g", item,
                             t, c, led[row * width + c], want);
            }
    for (size_t c = 0; c < width; ++c)
        if (!isnan(led[lead_tokens * width + c])) fail_msg("cuda_assemble_leading wrote past the last token");
    print_message("  %-64s exact\n", "cuda_assemble_leading items of 3, 0, 5, 1 patches, 2 registers");
    free(led);
    /* No class token (SigLIP's): every token a patch, patch j + pos[j]; cls is not read. */
    CUDA_CHECK(cudaMemset(lead_device, 0xff, (lead_tokens + 1) * width * sizeof(float)));
    ran(cuda_assemble_leading(lead_device, patches_device, NULL, lead_pos_device, offsets_device, items,
                              max_patches, 0, width, stream),
        "cuda_assemble_leading", "3, 0, 5, 1 patches, no class token");
    led = host_copy(lead_device, (lead_tokens + 1) * width * sizeof(float));
    for (size_t r = 0; r < 9; ++r) {
        size_t item = r < 3 ? 0 : r < 8 ? 2 : 3, t = r - (size_t)offsets[item];
        for (size_t c = 0; c < width; ++c)
            if (led[r * width + c] != patches[r * width + c] + lead_pos[t * width + c])
                fail_msg("cuda_assemble_leading without a class token: row %zu column %zu", r, c);
    }
    if (!isnan(led[9 * width])) fail_msg("cuda_assemble_leading without a class token wrote past its tokens");
    print_message("  %-64s exact\n", "cuda_assemble_leading items of 3, 0, 5, 1 patches, no class token");
    free(led), free(lead_pos);
    device_free(lead_pos_device), device_free(lead_device);

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

/* Against the scalar layernorm on rows around 0, around 100 and tightly around 1e4 (where a deviation from
 * the mean rounded to F32 alone would be off), with and without a bias, both outputs and in place; the
 * tolerance relative to |(x - mean) / sqrt(var + eps) * weight| + |bias| (kernels.h), taken from the
 * scalar output and the bias. */
static void layernorm_matches_scalar(void **state) {
    (void)state;
    random_seed(21);
    size_t const rows = 6;
    for (size_t s = 0; s < COUNT(row_sizes); ++s) {
        size_t n = row_sizes[s], x_stride = n + 5, f32_stride = n + 3, bf16_stride = n + 7;
        float *x = floats_uniform(rows * x_stride, -2.0f, 2.0f), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *bias = floats_uniform(n, -1.0f, 1.0f);
        float const centers[3] = {0.0f, 100.0f, 1e4f}, spreads[3] = {1.0f, 0.5f, 0.025f};
        for (size_t r = 0; r < rows; ++r)
            for (size_t i = 0; i < n; ++i)
                x[r * x_stride + i] = centers[r % 3] + spreads[r % 3] * x[r * x_stride + i];
        float *x_device = device_copy(x, rows * x_stride * sizeof(float));
        float *weight_device = device_copy(weight, n * sizeof(float)),
              *bias_device = device_copy(bias, n * sizeof(float));
        for (int with_bias = 0; with_bias < 2; ++with_bias) {
            float const *b = with_bias ? bias : NULL;
            float *expected = host_alloc(rows * n * sizeof(float));
            kernels_scalar()->layernorm(expected, n, x, x_stride, weight, b, rows, n, 1e-5f);
            float *y_device = device_alloc(rows * f32_stride * sizeof(float));
            uint16_t *y16_device = device_alloc(rows * bf16_stride * sizeof(uint16_t));
            ran(cuda_layernorm(y16_device, bf16_stride, y_device, f32_stride, x_device, x_stride,
                               weight_device, with_bias ? bias_device : NULL, rows, n, 1e-5f, stream),
                "cuda_layernorm", with_bias ? "both outputs, bias" : "both outputs, no bias");
            float *y = host_copy(y_device, rows * f32_stride * sizeof(float));
            uint16_t *y16 = host_copy(y16_device, rows * bf16_stride * sizeof(uint16_t));
            check_t f32 =
                check_start(n, "cuda_layernorm F32, %zu rows of %zu%s", rows, n, with_bias ? ", bias" : "");
            check_t bf16 =
                check_start(n, "cuda_layernorm BF16, %zu rows of %zu%s", rows, n, with_bias ? ", bias" : "");
            for (size_t r = 0; r < rows; ++r) {
                for (size_t i = 0; i < n; ++i) {
                    double e = expected[r * n + i], shift = b ? fabs(b[i]) : 0.0;
                    double magnitude = fabs(e - (b ? b[i] : 0.0)) + shift;
                    check_value(&f32, r * n + i, y[r * f32_stride + i], e, 1e-5 * magnitude + 1e-30);
                    check_value(&bf16, r * n + i, bf16_to_f32(y16[r * bf16_stride + i]), e,
                                0x1p-8 * fabs(e) + 1e-5 * magnitude + 1e-30);
                }
                for (size_t i = n; i < f32_stride; ++i)
                    if (!isnan(y[r * f32_stride + i]))
                        fail_msg("cuda_layernorm wrote F32 padding [%zu][%zu]", r, i);
                for (size_t i = n; i < bf16_stride; ++i)
                    if (y16[r * bf16_stride + i] != 0xffff)
                        fail_msg("cuda_layernorm wrote BF16 padding [%zu][%zu]", r, i);
            }
            check_end(&f32), check_end(&bf16);
            free(expected), free(y), free(y16);
            device_free(y_device), device_free(y16_device);
        }

        /* In place, F32 only, with the bias */
        float *expected = host_alloc(rows * n * sizeof(float));
        kernels_scalar()->layernorm(expected, n, x, x_stride, weight, bias, rows, n, 1e-5f);
        ran(cuda_layernorm(NULL, 0, x_device, x_stride, x_device, x_stride, weight_device, bias_device, rows,
                           n, 1e-5f, stream),
            "cuda_layernorm", "in place");
        float *in_place = host_copy(x_device, rows * x_stride * sizeof(float));
        check_t place = check_start(n, "cuda_layernorm in place, %zu rows of %zu", rows, n);
        for (size_t r = 0; r < rows; ++r) {
            for (size_t i = 0; i < n; ++i) {
                double e = expected[r * n + i], magnitude = fabs(e - bias[i]) + fabs(bias[i]);
                check_value(&place, r * n + i, in_place[r * x_stride + i], e, 1e-5 * magnitude + 1e-30);
            }
            if (memcmp(in_place + r * x_stride + n, x + r * x_stride + n, 5 * sizeof(float)))
                fail_msg("cuda_layernorm in place wrote the padding of row %zu", r);
        }
        check_end(&place);
        free(x), free(weight), free(bias), free(expected), free(in_place);
        device_free(x_device), device_free(weight_device), device_free(bias_device);
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

/* cuda_tanh against glibc's tanhf, within 2 ulp of it: values over [-12, 12] (both saturations), zeros,
 * and a count that is no multiple of a block. */
static void tanh_matches_tanhf(void **state) {
    (void)state;
    random_seed(44);
    size_t const n = 3 * 256 + 17;
    float *x = floats_uniform(n, -12.0f, 12.0f);
    x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e-30f;
    float *x_device = device_copy(x, n * sizeof(float));
    ran(cuda_tanh(x_device, n, stream), "cuda_tanh", "values over [-12, 12]");
    float *y = host_copy(x_device, n * sizeof(float));
    check_t check = check_start(n, "cuda_tanh, %zu values", n);
    for (size_t i = 0; i < n; ++i) {
        float expected = tanhf(x[i]);
        check_value(&check, i, y[i], expected,
                    2.0 * (nextafterf(fabsf(expected), INFINITY) - fabsf(expected)));
    }
    check_end(&check);
    free(x), free(y);
    device_free(x_device);
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

/* Items of `lengths` packed end to end: their offsets [items + 1] for the scalar kernels (size_t) and for
 * the device (int32_t), which the caller frees, and the longest item. Answers the tokens. */
static size_t pack_items(size_t const *lengths, size_t items, size_t **offsets, int32_t **offsets32,
                         size_t *max_length) {
    *offsets = host_alloc((items + 1) * sizeof(size_t));
    *offsets32 = host_alloc((items + 1) * sizeof(int32_t));
    (*offsets)[0] = 0;
    *max_length = 0;
    for (size_t i = 0; i < items; ++i) {
        (*offsets)[i + 1] = (*offsets)[i] + lengths[i];
        if (lengths[i] > *max_length) *max_length = lengths[i];
    }
    for (size_t i = 0; i <= items; ++i)
        (*offsets32)[i] = (int32_t)(*offsets)[i];
    return (*offsets)[items];
}

/* `rope` (the scalar rope or rope_backward) on the q and k of every row of `qkv` [tokens, 3 * heads * 64],
 * at the row's position in its item. */
static void rope_rows(void (*rope)(float *x, size_t heads, size_t position), float *qkv,
                      size_t const *offsets, size_t items, size_t heads) {
    size_t const hidden = heads * HEAD, width = 3 * hidden;
    for (size_t item = 0; item < items; ++item)
        for (size_t row = offsets[item]; row < offsets[item + 1]; ++row) {
            rope(qkv + row * width, heads, row - offsets[item]);
            rope(qkv + row * width + hidden, heads, row - offsets[item]);
        }
}

/* Each head's bias by relative position for items of up to `rows` rows (at least 1), values of magnitude
 * 1 to 3 and either sign, so that a wrong sign, offset or head shows: the host's [heads][span] as
 * kernels.h's scalar attention may read it (span: 2 rows + KERNEL_ATTENTION_BIAS_LANES - 2, distance 0 at
 * rows - 1), and the device's with exactly the distances cuda_attention reads, -(rows - 1) .. rows - 1
 * (stride 2 rows - 1, no room between heads), between 64 NaNs on either side (device_alloc's bytes), so
 * that a read past any head's table changes or poisons an output. */
typedef struct bias_tables {
    float *host;         /* [heads][span] */
    size_t span;         /* the host's stride */
    float *device_base;  /* what to free */
    float const *device; /* head 0's distance 0 */
    size_t stride;       /* the device's: 2 rows - 1 */
} bias_tables_t;

static bias_tables_t bias_tables_make(size_t heads, size_t rows) {
    rows = rows ? rows : 1;
    bias_tables_t tables = {.span = 2 * rows + KERNEL_ATTENTION_BIAS_LANES - 2, .stride = 2 * rows - 1};
    tables.host = host_alloc(heads * tables.span * sizeof(float));
    float *packed = host_alloc(heads * tables.stride * sizeof(float));
    for (size_t h = 0; h < heads; ++h)
        for (size_t i = 0; i < tables.span; ++i) {
            float magnitude = random_uniform(1.0f, 3.0f);
            tables.host[h * tables.span + i] = random_below(2) ? -magnitude : magnitude;
            if (i < tables.stride) packed[h * tables.stride + i] = tables.host[h * tables.span + i];
        }
    tables.device_base = device_alloc((heads * tables.stride + 128) * sizeof(float));
    CUDA_CHECK(cudaMemcpy(tables.device_base + 64, packed, heads * tables.stride * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
    tables.device = tables.device_base + 64 + (rows - 1);
    free(packed);
    return tables;
}

/* One attention case: items of `lengths` packed end to end, qkv BF16 [tokens, 3 * heads * 64] with
 * values in [-1, 1] and q, k scaled by `amplitude`. The scalar reference runs on the same BF16 values:
 * rope at each row's position in its item when `rotary`, then kernels.h's attention per head, with a bias
 * by relative position when `biased` (bias_tables_make's, the same values on both sides). With
 * `misaligned`, qkv and out start 2 bytes past a 16-byte boundary (the kernel's scalar loads). */
static void attention_case_head(size_t const *lengths, size_t items, size_t heads, size_t head, bool causal,
                                bool rotary, float amplitude, bool misaligned, bool biased,
                                char const *label) {
    size_t width = 3 * heads * head, hidden = heads * head, *offsets, max_length;
    float const score_scale = (float)(1.0 / sqrt((double)head));
    int32_t *offsets32;
    size_t tokens = pack_items(lengths, items, &offsets, &offsets32, &max_length);
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
    if (rotary) rope_rows(kernels_scalar()->rope, reference_in, offsets, items, heads);
    bias_tables_t tables = {0};
    if (biased) tables = bias_tables_make(heads, max_length);
    float *expected = host_alloc((tokens ? tokens : 1) * hidden * sizeof(float));
    for (size_t h = 0; h < heads; ++h) {
        kernel_attention_t a = {
            .q = reference_in + h * head,
            .k = reference_in + hidden + h * head,
            .v = reference_in + 2 * hidden + h * head,
            .stride = width,
            .out = expected + h * head,
            .out_stride = hidden,
            .head = head,
            .offsets = offsets,
            .items = items,
            .causal = causal,
            .scale = score_scale,
            .bias = biased ? tables.host + h * tables.span + (max_length ? max_length - 1 : 0) : NULL,
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
    snprintf(name, sizeof name, "cuda_attention%s %s%s%s%s%s, amplitude %g, %zu heads of %zu",
             head == HEAD ? "" : "_heads", label, causal ? ", causal" : "", rotary ? ", rotary" : "",
             misaligned ? ", misaligned" : "", biased ? ", biased" : "", (double)amplitude, heads, head);
    if (head == HEAD)
        ran(cuda_attention(out_base + shift, qkv_base + shift, offsets_device, items, heads, max_length,
                           causal, rotary, score_scale, tables.device, tables.stride, stream),
            "cuda_attention", name);
    else
        ran(cuda_attention_heads(out_base + shift, qkv_base + shift, offsets_device, items, heads, head,
                                 max_length, causal, rotary, score_scale, tables.device, tables.stride,
                                 stream),
            "cuda_attention_heads", name);
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
    free(offsets), free(offsets32), free(qkv), free(reference_in), free(expected), free(out),
        free(tables.host);
    device_free(qkv_base), device_free(out_base), device_free(offsets_device);
    if (biased) device_free(tables.device_base);
}

static void attention_case(size_t const *lengths, size_t items, size_t heads, bool causal, bool rotary,
                           float amplitude, bool misaligned, char const *label) {
    attention_case_head(lengths, items, heads, HEAD, causal, rotary, amplitude, misaligned, false, label);
}

/* The pretrained families' heads (cuda_attention_heads): 32 (all-MiniLM-L6-v2), 80, 96, 128, an odd 40
 * and 1, bidirectional and causal, against the scalar attention at 1/sqrt(head); rotary refused there. */
static void attention_heads_match_scalar(void **state) {
    (void)state;
    random_seed(17);
    size_t const lengths[] = {1, 7, 31, 32, 33, 197, 0, 77};
    size_t const heads_of[] = {32, 80, 96, 128, 40, 1, 256};
    for (size_t h = 0; h < COUNT(heads_of); ++h)
        for (int causal = 0; causal < 2; ++causal)
            attention_case_head(lengths, COUNT(lengths), 3, heads_of[h], causal, false, 3.0f, false, false,
                                "lengths 1 7 31 32 33 197 0 77");
    attention_case_head(lengths, COUNT(lengths), 2, 32, false, false, 1.0f, true, false,
                        "lengths 1 7 31 32 33 197 0 77");
    size_t const many[] = {600, 5};
    attention_case_head(many, COUNT(many), 12, 32, false, false, 1.0f, false, false, "lengths 600 5");
    assert_int_equal(cuda_attention_heads(NULL, NULL, NULL, 1, 1, 32, 1, false, true, 0.1f, NULL, 0, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(
        cuda_attention_heads(NULL, NULL, NULL, 1, 1, 257, 1, false, false, 0.1f, NULL, 0, stream),
        cudaErrorInvalidValue);
    assert_int_equal(cuda_attention_heads(NULL, NULL, NULL, 0, 1, 32, 1, false, false, 0.1f, NULL, 0, stream),
                     cudaSuccess);
}

/* The bias by relative position (MPNet's) on both kernels: heads of 64 (the tensor cores; rotary and
 * misaligned too) and of 32 and 80 (SIMT), items of 1, 17, 64, 65 and 130 rows (one tile, one and a row,
 * three tiles of 64 keys) and an empty one, causal and not, against the scalar attention with the same
 * table; a table whose stride cannot hold every distance refused. */
static void attention_bias_matches_scalar(void **state) {
    (void)state;
    random_seed(19);
    size_t const lengths[] = {1, 17, 64, 0, 65, 130};
    size_t const heads_of[] = {HEAD, 32, 80};
    char const *label = "lengths 1 17 64 0 65 130";
    for (size_t h = 0; h < COUNT(heads_of); ++h)
        for (int causal = 0; causal < 2; ++causal)
            attention_case_head(lengths, COUNT(lengths), 3, heads_of[h], causal, false, 1.0f, false, true,
                                label);
    attention_case_head(lengths, COUNT(lengths), 2, HEAD, true, true, 1.0f, false, true, label);
    attention_case_head(lengths, COUNT(lengths), 2, HEAD, false, false, 3.0f, true, true, label);
    attention_case_head(lengths, COUNT(lengths), 2, 32, true, false, 3.0f, true, true, label);
    size_t const single[] = {1};
    attention_case_head(single, 1, 1, HEAD, false, false, 1.0f, false, true, "one item of 1");
    static float const table[7];
    for (size_t h = 0; h < COUNT(heads_of); ++h)
        assert_int_equal(cuda_attention_heads(NULL, NULL, NULL, 1, 1, heads_of[h], 4, false, false, 0.1f,
                                              table + 3, 6, stream),
                         cudaErrorInvalidValue);
}

/* The input rows of a text that reads tokens: the token's row, the token type's, then the position's,
 * added in that order as the host's tokens_embed; and the mean of segments as tower_pool's mean, an empty
 * segment zeros. Bitwise. */
static void embed_tokens_and_segment_means_bitwise(void **state) {
    (void)state;
    random_seed(18);
    size_t const hidden = 384, vocab = 1000, positions = 514, rows = 700;
    uint16_t *table = bf16_uniform(vocab * hidden, -2.0f, 2.0f);
    float *type = floats_uniform(hidden, -1.0f, 1.0f),
          *position = floats_uniform(positions * hidden, -1.0f, 1.0f);
    int32_t *ids = host_alloc(rows * sizeof(int32_t)), *places = host_alloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; ++r) {
        ids[r] = (int32_t)random_below(vocab);
        places[r] = (int32_t)random_below(positions);
    }
    float *expected = host_alloc(rows * hidden * sizeof(float)),
          *plain = host_alloc(rows * hidden * sizeof(float));
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < hidden; ++c) {
            float value = bf16_to_f32(table[(size_t)ids[r] * hidden + c]);
            plain[r * hidden + c] = value;
            value += type[c];
            value += position[(size_t)places[r] * hidden + c];
            expected[r * hidden + c] = value;
        }
    uint16_t *table_device = device_copy(table, vocab * hidden * sizeof(uint16_t));
    float *type_device = device_copy(type, hidden * sizeof(float));
    float *position_device = device_copy(position, positions * hidden * sizeof(float));
    int32_t *ids_device = device_copy(ids, rows * sizeof(int32_t)),
            *places_device = device_copy(places, rows * sizeof(int32_t));
    float *x_device = device_alloc(rows * hidden * sizeof(float));
    ran(cuda_embed_tokens(x_device, table_device, ids_device, type_device, position_device, places_device,
                          rows, hidden, stream),
        "cuda_embed_tokens", "700 x 384");
    float *x = host_copy(x_device, rows * hidden * sizeof(float));
    check_bits(x, expected, rows * hidden, sizeof(float), hidden, "cuda_embed_tokens, type and positions");
    free(x);
    ran(cuda_embed_tokens(x_device, table_device, ids_device, NULL, NULL, NULL, rows, hidden, stream),
        "cuda_embed_tokens", "700 x 384, the token's row alone");
    x = host_copy(x_device, rows * hidden * sizeof(float));
    check_bits(x, plain, rows * hidden, sizeof(float), hidden, "cuda_embed_tokens, the token's row alone");
    assert_int_equal(
        cuda_embed_tokens(x_device, table_device, ids_device, NULL, position_device, NULL, 1, hidden, stream),
        cudaErrorInvalidValue);

    /* Means of segments of 5, 0, 1, 300 and 394 rows, out stride 390. */
    int32_t const offsets[] = {0, 5, 5, 6, 306, 700};
    size_t const items = COUNT(offsets) - 1, out_stride = 390;
    float *means = host_alloc(items * out_stride * sizeof(float));
    memset(means, 0xff, items * out_stride * sizeof(float));
    for (size_t i = 0; i < items; ++i)
        for (size_t c = 0; c < hidden; ++c) {
            float sum = 0.0f;
            size_t count = (size_t)(offsets[i + 1] - offsets[i]);
            for (size_t r = (size_t)offsets[i]; r < (size_t)offsets[i + 1]; ++r)
                sum += expected[r * hidden + c];
            means[i * out_stride + c] = count ? sum / (float)count : 0.0f;
        }
    float *expected_device = device_copy(expected, rows * hidden * sizeof(float));
    int32_t *offsets_device = device_copy(offsets, sizeof offsets);
    float *out_device = device_alloc(items * out_stride * sizeof(float));
    CUDA_CHECK(cudaMemset(out_device, 0xff, items * out_stride * sizeof(float)));
    ran(cuda_mean_segments(out_device, out_stride, expected_device, hidden, offsets_device, items, hidden,
                           stream),
        "cuda_mean_segments", "5 segments");
    float *out = host_copy(out_device, items * out_stride * sizeof(float));
    check_bits(out, means, items * out_stride, sizeof(float), out_stride,
               "cuda_mean_segments, padded stride");
    free(table), free(type), free(position), free(ids), free(places), free(expected), free(plain), free(x),
        free(means), free(out);
    device_free(table_device), device_free(type_device), device_free(position_device),
        device_free(ids_device), device_free(places_device), device_free(x_device),
        device_free(expected_device), device_free(offsets_device), device_free(out_device);
}

/* The attention-pooling head's attention (cuda_attention_probe) against pool_head's loop on the host: one
 * query per head against every token of each item, items of 1, 7, 0, 197 and 729 tokens (SigLIP's 27 x 27
 * patches), heads of 64 and 32; and cuda_scatter_rows, exact. */
static void attention_probe_matches_host(void **state) {
    (void)state;
    random_seed(19);
    size_t const lengths[] = {1, 7, 0, 197, 729}, heads_of[] = {64, 32}, heads = 3;
    for (size_t w = 0; w < COUNT(heads_of); ++w) {
        size_t const head = heads_of[w], hidden = heads * head, width = 3 * hidden, items = COUNT(lengths);
        size_t *offsets, max_length;
        int32_t *offsets32;
        size_t tokens = pack_items(lengths, items, &offsets, &offsets32, &max_length);
        uint16_t *qkv = bf16_uniform(tokens * width, -1.0f, 1.0f);
        float *q = floats_uniform(hidden, -3.0f, 3.0f),
              *expected = host_alloc(items * hidden * sizeof(float));
        float *scores = host_alloc((max_length + 1) * sizeof(float));
        float const scale = (float)(1.0 / sqrt((double)head));
        double max_v = 0.0;
        for (size_t i = 0; i < tokens * width; ++i)
            if (i % width >= 2 * hidden) max_v = fmax(max_v, fabs(bf16_to_f32(qkv[i])));
        for (size_t item = 0; item < items; ++item)
            for (size_t h = 0; h < heads; ++h) {
                size_t first = offsets[item], end = offsets[item + 1];
                float max = -INFINITY, sum = 0.0f;
                for (size_t t = first; t < end; ++t) {
                    float dot = 0.0f;
                    for (size_t d = 0; d < head; ++d)
                        dot += q[h * head + d] * bf16_to_f32(qkv[t * width + hidden + h * head + d]);
                    scores[t - first] = dot * scale;
                    if (scores[t - first] > max) max = scores[t - first];
                }
                for (size_t t = first; t < end; ++t)
                    sum += scores[t - first] = expf(scores[t - first] - max);
                for (size_t d = 0; d < head; ++d) {
                    float o = 0.0f;
                    for (size_t t = first; t < end; ++t)
                        o +=
                            scores[t - first] / sum * bf16_to_f32(qkv[t * width + 2 * hidden + h * head + d]);
                    expected[item * hidden + h * head + d] = o;
                }
            }
        uint16_t *qkv_device = device_copy(qkv, tokens * width * sizeof(uint16_t));
        float *q_device = device_copy(q, hidden * sizeof(float));
        int32_t *offsets_device = device_copy(offsets32, (items + 1) * sizeof(int32_t));
        float *out_device = device_alloc(items * hidden * sizeof(float));
        char name[96];
        snprintf(name, sizeof name, "cuda_attention_probe items of 1 7 0 197 729, 3 heads of %zu", head);
        ran(cuda_attention_probe(out_device, hidden, q_device, qkv_device, offsets_device, items, heads, head,
                                 max_length, scale, stream),
            "cuda_attention_probe", name);
        float *out = host_copy(out_device, items * hidden * sizeof(float));
        check_t check = check_start(hidden, "%s", name);
        for (size_t i = 0; i < items * hidden; ++i)
            check_value(&check, i, out[i], expected[i], 1e-5 * max_v);
        check_end(&check);

        /* scatter: the items' rows to rows 5, 0, 9, 2 and 7 of a [10, hidden] matrix */
        int32_t const targets[] = {5, 0, 9, 2, 7};
        float *scattered_device = device_alloc(10 * hidden * sizeof(float));
        int32_t *targets_device = device_copy(targets, sizeof targets);
        ran(cuda_scatter_rows(scattered_device, hidden, out_device, hidden, targets_device, items, hidden,
                              stream),
            "cuda_scatter_rows", "5 rows");
        float *scattered = host_copy(scattered_device, 10 * hidden * sizeof(float));
        for (size_t r = 0; r < items; ++r)
            if (memcmp(scattered + (size_t)targets[r] * hidden, out + r * hidden, hidden * sizeof(float)))
                fail_msg("cuda_scatter_rows: row %zu did not land at row %d", r, targets[r]);
        assert_int_equal(cuda_attention_probe(out_device, hidden, q_device, qkv_device, offsets_device, items,
                                              heads, head, 12289, scale, stream),
                         cudaErrorInvalidValue);
        free(offsets), free(offsets32), free(qkv), free(q), free(expected), free(scores), free(out),
            free(scattered);
        device_free(qkv_device), device_free(q_device), device_free(offsets_device), device_free(out_device),
            device_free(scattered_device), device_free(targets_device);
    }
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
    assert_int_equal(cuda_attention(NULL, NULL, NULL, 1, 70000, 1, false, false, 0.125f, NULL, 0, stream),
                     cudaErrorInvalidValue);
    assert_int_equal(cuda_attention(NULL, NULL, NULL, 0, 3, 1, false, false, 0.125f, NULL, 0, stream),
                     cudaSuccess);
}

/* ---- Linear layers ------------------------------------------------------------------------------ */

typedef struct linear_shape {
    size_t m, n, k, x_stride, y_stride;
} linear_shape_t;

static char const *kind_names[] = {"BF16", "GELU_BF16",     "RESIDUAL",
                                   "F32",  "GELU_ERF_BF16", "GELU_QUICK_BF16"};
#define LINEAR_KINDS COUNT(kind_names)

/* Whether a kind's y is BF16. */
static bool kind_bf16_out(cuda_linear_kind_t kind) {
    return kind != CUDA_LINEAR_RESIDUAL && kind != CUDA_LINEAR_F32;
}

/* The scalar GEMM's epilogue of a kind. */
static kernel_epilogue_t kind_epilogue(cuda_linear_kind_t kind) {
    return kind == CUDA_LINEAR_GELU_BF16         ? KERNEL_EPILOGUE_GELU
           : kind == CUDA_LINEAR_GELU_ERF_BF16   ? KERNEL_EPILOGUE_GELU_ERF
           : kind == CUDA_LINEAR_GELU_QUICK_BF16 ? KERNEL_EPILOGUE_GELU_QUICK
                                                 : KERNEL_EPILOGUE_NONE;
}

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
        .epilogue = kind_epilogue(linear->kind),
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
    bool bf16_out = kind_bf16_out(linear->kind);
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
    bool bf16_out = kind_bf16_out(kind);
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
        for (size_t kind = 0; kind < LINEAR_KINDS; ++kind) {
            linear_case(gemm, shapes[s], (cuda_linear_kind_t)kind, true, true);
            if (kind != CUDA_LINEAR_RESIDUAL)
                linear_case(gemm, shapes[s], (cuda_linear_kind_t)kind, false, true);
        }
    for (size_t kind = 0; kind < LINEAR_KINDS; ++kind) { /* the fallback epilogue, and the cache after it */
        linear_case(gemm, shapes[1], (cuda_linear_kind_t)kind, true, false);
        linear_case(gemm, shapes[3], (cuda_linear_kind_t)kind, true, false);
        linear_case(gemm, shapes[1], (cuda_linear_kind_t)kind, true, true);
    }
    cuda_gemm_destroy(gemm);
}

/* ---- Training: elementwise and row sums ----------------------------------------------------------- */

/* GELU and its backward pass over BF16 values: one BF16 rounding (2^-7 relative, a rounding of either
 * side's F32) from the scalar gelu and gelu_backward on the widened inputs. */
static void gelu_and_backward_match_scalar(void **state) {
    (void)state;
    random_seed(20);
    size_t const n = 100003;
    uint16_t *u = bf16_uniform(n, -6.0f, 6.0f), *dg = bf16_uniform(n, -2.0f, 2.0f);
    float *widened = host_alloc(n * sizeof(float)), *gradient = host_alloc(n * sizeof(float));
    float *expected_g = host_alloc(n * sizeof(float)), *expected_du = host_alloc(n * sizeof(float));
    kernels_scalar()->bf16_to_f32(widened, u, n);
    kernels_scalar()->bf16_to_f32(gradient, dg, n);
    memcpy(expected_g, widened, n * sizeof(float));
    kernels_scalar()->gelu(expected_g, n);
    kernels_scalar()->gelu_backward(expected_du, gradient, widened, n);
    uint16_t *u_device = device_copy(u, n * 2), *dg_device = device_copy(dg, n * 2);
    uint16_t *g_device = device_alloc(n * 2), *du_device = device_alloc(n * 2);
    ran(cuda_gelu(g_device, u_device, n, stream), "cuda_gelu", "100003 values");
    ran(cuda_gelu_backward(du_device, dg_device, u_device, n, stream), "cuda_gelu_backward", "100003 values");
    uint16_t *g = host_copy(g_device, n * 2), *du = host_copy(du_device, n * 2);
    check_t forward = check_start(n, "cuda_gelu, 100003 BF16 values in [-6, 6]");
    check_t backward = check_start(n, "cuda_gelu_backward, 100003 BF16 values");
    for (size_t i = 0; i < n; ++i) {
        check_value(&forward, i, bf16_to_f32(g[i]), expected_g[i], 0x1p-7 * fabs(expected_g[i]) + 1e-30);
        check_value(&backward, i, bf16_to_f32(du[i]), expected_du[i],
                    0x1p-7 * fabs(expected_du[i]) + 1e-6 * fabs(gradient[i]));
    }
    check_end(&forward), check_end(&backward);
    free(u), free(dg), free(widened), free(gradient), free(expected_g), free(expected_du), free(g), free(du);
    device_free(u_device), device_free(dg_device), device_free(g_device), device_free(du_device);
}

/* Bias gradients: sums over rows of F32 and BF16 inputs added to what the output held, within 1e-5 of the
 * magnitudes summed; the same bits on a second run. */
static void column_sums_match(void **state) {
    (void)state;
    random_seed(21);
    size_t const rows_cases[] = {1, 255, 256, 257, 3000}, columns_cases[] = {1, 64, 3072};
    for (size_t r = 0; r < COUNT(rows_cases); ++r)
        for (size_t c = 0; c < COUNT(columns_cases); ++c)
            for (int bf16 = 0; bf16 < 2; ++bf16) {
                size_t rows = rows_cases[r], columns = columns_cases[c], stride = columns + 3;
                size_t element = bf16 ? 2 : 4;
                void *x = bf16 ? (void *)bf16_uniform(rows * stride, -1.0f, 1.0f)
                               : (void *)floats_uniform(rows * stride, -1.0f, 1.0f);
                float *out0 = floats_uniform(columns, -1.0f, 1.0f);
                void *x_device = device_copy(x, rows * stride * element);
                float *out_device = device_copy(out0, columns * 4);
                float *scratch = device_alloc(cuda_column_sums_scratch(rows, columns) * 4);
                char name[96];
                snprintf(name, sizeof name, "cuda_column_sums %s, %zu rows of %zu", bf16 ? "BF16" : "F32",
                         rows, columns);
                ran(cuda_column_sums(out_device, x_device, bf16, stride, rows, columns, scratch, stream),
                    "cuda_column_sums", name);
                float *out = host_copy(out_device, columns * 4);
                check_t check = check_start(columns, "%s", name);
                for (size_t j = 0; j < columns; ++j) {
                    double sum = out0[j], magnitude = fabs(out0[j]);
                    for (size_t i = 0; i < rows; ++i) {
                        double v = bf16 ? bf16_to_f32(((uint16_t *)x)[i * stride + j])
                                        : ((float *)x)[i * stride + j];
                        sum += v, magnitude += fabs(v);
                    }
                    check_value(&check, j, out[j], sum, 1e-5 * magnitude + 1e-7);
                }
                check_end(&check);
                CUDA_CHECK(cudaMemcpy(out_device, out0, columns * 4, cudaMemcpyHostToDevice));
                ran(cuda_column_sums(out_device, x_device, bf16, stride, rows, columns, scratch, stream),
                    "cuda_column_sums", "again");
                float *again = host_copy(out_device, columns * 4);
                check_bits(again, out, columns, 4, columns, "cuda_column_sums run twice");
                free(x), free(out0), free(out), free(again);
                device_free(x_device), device_free(out_device), device_free(scratch);
            }
}

/* The scalar RMSNorm backward as the RAM trainer sums it: per block of CUDA_TRAIN_ROW_BLOCK rows a partial
 * weight gradient, then the blocks in order onto d_weight. dx into `dx` (added when accumulate). */
static void scalar_rmsnorm_backward(float *dx, bool accumulate, float *d_weight, float const *dy,
                                    float const *x, float const *weight, size_t rows, size_t n) {
    float *partial = host_alloc(n * sizeof(float)), *d = host_alloc(CUDA_TRAIN_ROW_BLOCK * n * sizeof(float));
    for (size_t first = 0; first < rows; first += CUDA_TRAIN_ROW_BLOCK) {
        size_t count = rows - first < CUDA_TRAIN_ROW_BLOCK ? rows - first : CUDA_TRAIN_ROW_BLOCK;
        memset(partial, 0, n * sizeof(float));
        kernels_scalar()->rmsnorm_backward(d, n, partial, dy + first * n, n, x + first * n, n, weight, count,
                                           n, 1e-6f);
        for (size_t i = 0; i < count * n; ++i)
            dx[first * n + i] = accumulate ? dx[first * n + i] + d[i] : d[i];
        for (size_t j = 0; j < n; ++j)
            d_weight[j] += partial[j];
    }
    free(partial), free(d);
}

static void rmsnorm_backward_matches_scalar(void **state) {
    (void)state;
    random_seed(22);
    size_t const rows_cases[] = {1, 63, 64, 65, 300}, n_cases[] = {64, 768};
    for (size_t r = 0; r < COUNT(rows_cases); ++r)
        for (size_t c = 0; c < COUNT(n_cases); ++c)
            for (int accumulate = 0; accumulate < 2; ++accumulate) {
                size_t rows = rows_cases[r], n = n_cases[c];
                float *x = floats_uniform(rows * n, -2.0f, 2.0f), *dy = floats_uniform(rows * n, -1.0f, 1.0f);
                float *weight = floats_uniform(n, 0.5f, 1.5f), *dw0 = floats_uniform(n, -1.0f, 1.0f);
                float *dx0 = floats_uniform(rows * n, -1.0f, 1.0f);
                float *dx_expected = host_alloc(rows * n * 4), *dw_expected = host_alloc(n * 4);
                memcpy(dx_expected, dx0, rows * n * 4), memcpy(dw_expected, dw0, n * 4);
                scalar_rmsnorm_backward(dx_expected, accumulate, dw_expected, dy, x, weight, rows, n);
                float *x_device = device_copy(x, rows * n * 4), *dy_device = device_copy(dy, rows * n * 4);
                float *weight_device = device_copy(weight, n * 4), *dw_device = device_copy(dw0, n * 4);
                float *dx_device = device_copy(dx0, rows * n * 4);
                float *partial = device_alloc((rows + CUDA_TRAIN_ROW_BLOCK) / CUDA_TRAIN_ROW_BLOCK * n * 4);
                char name[96];
                snprintf(name, sizeof name, "cuda_rmsnorm_backward%s, %zu rows of %zu",
                         accumulate ? " accumulating" : "", rows, n);
                ran(cuda_rmsnorm_backward(dx_device, accumulate, dw_device, partial, dy_device, x_device,
                                          weight_device, rows, n, 1e-6f, stream),
                    "cuda_rmsnorm_backward", name);
                float *dx = host_copy(dx_device, rows * n * 4), *dw = host_copy(dw_device, n * 4);
                check_t dx_check = check_start(n, "%s: dx", name),
                        dw_check = check_start(n, "%s: d_weight", name);
                for (size_t i = 0; i < rows; ++i) {
                    double squares = 0.0, largest = 0.0;
                    for (size_t j = 0; j < n; ++j)
                        squares += (double)x[i * n + j] * x[i * n + j];
                    double inverse = 1.0 / sqrt(squares / (double)n + 1e-6);
                    for (size_t j = 0; j < n; ++j)
                        largest = fmax(largest, fabs(weight[j] * dy[i * n + j]) * inverse);
                    for (size_t j = 0; j < n; ++j)
                        check_value(&dx_check, i * n + j, dx[i * n + j], dx_expected[i * n + j],
                                    1e-5 * (largest + (accumulate ? fabs(dx0[i * n + j]) : 0.0)) + 1e-7);
                }
                for (size_t j = 0; j < n; ++j) {
                    double magnitude = fabs(dw0[j]);
                    for (size_t i = 0; i < rows; ++i) {
                        double squares = 0.0;
                        for (size_t k = 0; k < n; ++k)
                            squares += (double)x[i * n + k] * x[i * n + k];
                        magnitude += fabs(dy[i * n + j] * x[i * n + j]) / sqrt(squares / (double)n + 1e-6);
                    }
                    check_value(&dw_check, j, dw[j], dw_expected[j], 1e-5 * magnitude + 1e-7);
                }
                check_end(&dx_check), check_end(&dw_check);
                free(x), free(dy), free(weight), free(dw0), free(dx0), free(dx_expected), free(dw_expected),
                    free(dx), free(dw);
                device_free(x_device), device_free(dy_device), device_free(weight_device),
                    device_free(dw_device), device_free(dx_device), device_free(partial);
            }
}

/* ---- Training: the towers' inputs ----------------------------------------------------------------- */

/* The byte table's gradient through its token lists (train_device_token_order), bitwise the host's loop
 * over the tokens in order. */
static void embed_backward_bitwise(void **state) {
    (void)state;
    random_seed(23);
    size_t const tokens = 3000, hidden = 96;
    uint16_t *bytes = host_alloc(tokens * sizeof(uint16_t));
    for (size_t t = 0; t < tokens; ++t)
        bytes[t] = t % 50 == 0 ? 256 : (uint16_t)random_below(t % 3 ? 256 : 4);
    int32_t starts[258], *order = host_alloc(tokens * sizeof(int32_t));
    train_device_token_order(bytes, tokens, starts, order);
    float *dx = floats_uniform(tokens * hidden, -1.0f, 1.0f),
          *table = floats_uniform(257 * hidden, -1.0f, 1.0f);
    float *expected = host_alloc(257 * hidden * 4);
    memcpy(expected, table, 257 * hidden * 4);
    for (size_t t = 0; t < tokens; ++t)
        for (size_t c = 0; c < hidden; ++c)
            expected[bytes[t] * hidden + c] += dx[t * hidden + c];
    float *dx_device = device_copy(dx, tokens * hidden * 4),
          *table_device = device_copy(table, 257 * hidden * 4);
    int32_t *starts_device = device_copy(starts, sizeof starts),
            *order_device = device_copy(order, tokens * 4);
    ran(cuda_embed_backward(table_device, dx_device, starts_device, order_device, 257, hidden, stream),
        "cuda_embed_backward", "3000 tokens of 96");
    float *got = host_copy(table_device, 257 * hidden * 4);
    check_bits(got, expected, 257 * hidden, 4, hidden, "cuda_embed_backward 3000 tokens of 96");
    free(bytes), free(order), free(dx), free(table), free(expected), free(got);
    device_free(dx_device), device_free(table_device), device_free(starts_device), device_free(order_device);
}

/* The gradients of assembled tokens (items of 3, 0, 5 and 1 patches): patch rows copied, positions and the
 * class token summed over the items in order, bitwise the host's loops; rows past the patches untouched. */
static void assemble_tokens_backward_bitwise(void **state) {
    (void)state;
    random_seed(24);
    int32_t const offsets[] = {0, 3, 3, 8, 9};
    size_t const items = 4, max_patches = 5, width = 70, tokens = 9 + 4, rows = 9;
    float *d_x = floats_uniform(tokens * width, -1.0f, 1.0f), *cls0 = floats_uniform(width, -1.0f, 1.0f);
    float *pos0 = floats_uniform((1 + max_patches) * width, -1.0f, 1.0f);
    float *cls = host_alloc(width * 4), *pos = host_alloc((1 + max_patches) * width * 4);
    float *patches = host_alloc(rows * width * 4);
    memcpy(cls, cls0, width * 4), memcpy(pos, pos0, (1 + max_patches) * width * 4);
    for (size_t item = 0; item < items; ++item) /* as src/train/train_step.c's patch_tokens_backward */
        for (int32_t t = 0; t <= offsets[item + 1] - offsets[item]; ++t)
            for (size_t c = 0; c < width; ++c) {
                float g = d_x[((size_t)offsets[item] + item + (size_t)t) * width + c];
                if (t == 0)
                    cls[c] += g;
                else
                    patches[((size_t)offsets[item] + (size_t)t - 1) * width + c] = g;
                pos[(size_t)t * width + c] += g;
            }
    float *d_x_device = device_copy(d_x, tokens * width * 4), *cls_device = device_copy(cls0, width * 4);
    float *pos_device = device_copy(pos0, (1 + max_patches) * width * 4);
    float *patches_device = device_alloc((rows + 1) * width * 4);
    int32_t *offsets_device = device_copy(offsets, sizeof offsets);
    ran(cuda_assemble_tokens_backward(patches_device, cls_device, pos_device, d_x_device, offsets_device,
                                      items, max_patches, width, stream),
        "cuda_assemble_tokens_backward", "3, 0, 5, 1 patches");
    float *got_patches = host_copy(patches_device, (rows + 1) * width * 4);
    float *got_cls = host_copy(cls_device, width * 4),
          *got_pos = host_copy(pos_device, (1 + max_patches) * width * 4);
    check_bits(got_patches, patches, rows * width, 4, width, "cuda_assemble_tokens_backward patch rows");
    check_bits(got_cls, cls, width, 4, width, "cuda_assemble_tokens_backward class token");
    check_bits(got_pos, pos, (1 + max_patches) * width, 4, width, "cuda_assemble_tokens_backward positions");
    for (size_t c = 0; c < width; ++c)
        if (!isnan(got_patches[rows * width + c]))
            fail_msg("cuda_assemble_tokens_backward wrote past the patches");
    free(d_x), free(cls0), free(pos0), free(cls), free(pos), free(patches), free(got_patches), free(got_cls),
        free(got_pos);
    device_free(d_x_device), device_free(cls_device), device_free(pos_device), device_free(patches_device),
        device_free(offsets_device);
}

/* ---- Training: attention backward ----------------------------------------------------------------- */

/* The forward with its log-sum-exp, then the backward, against the scalar attention_backward (and
 * rope_backward) on the same BF16 inputs and the device's own output: per item and head, within 3e-2 of
 * the largest |d|; the log-sum-exp within 2e-2 of the one of the scores in double; two runs the same bits. */
static void attention_backward_case(size_t const *lengths, size_t items, size_t heads, bool causal,
                                    bool rotary) {
    size_t width = 3 * heads * HEAD, hidden = heads * HEAD, *offsets, max_length;
    int32_t *offsets32;
    size_t tokens = pack_items(lengths, items, &offsets, &offsets32, &max_length);
    uint16_t *qkv = bf16_uniform(tokens * width, -1.0f, 1.0f),
             *d_out = bf16_uniform(tokens * hidden, -1.0f, 1.0f);
    uint16_t *qkv_device = device_copy(qkv, tokens * width * 2),
             *d_out_device = device_copy(d_out, tokens * hidden * 2);
    uint16_t *out_device = device_alloc(tokens * hidden * 2),
             *d_qkv_device = device_alloc(tokens * width * 2);
    float *lse_device = device_alloc(tokens * heads * 4), *rows_device = device_alloc(tokens * heads * 4);
    int32_t *offsets_device = device_copy(offsets32, (items + 1) * sizeof(int32_t));
    char name[128];
    snprintf(name, sizeof name, "cuda_attention_backward, %zu items up to %zu%s%s, %zu heads", items,
             max_length, causal ? ", causal" : "", rotary ? ", rotary" : "", heads);
    ran(cuda_attention_lse(out_device, lse_device, qkv_device, offsets_device, items, heads, max_length,
                           causal, rotary, 0.125f, stream),
        "cuda_attention_lse", name);
    ran(cuda_attention_backward(d_qkv_device, rows_device, qkv_device, out_device, d_out_device, lse_device,
                                offsets_device, items, tokens, heads, max_length, causal, rotary, 0.125f,
                                stream),
        "cuda_attention_backward", name);
    uint16_t *out = host_copy(out_device, tokens * hidden * 2),
             *d_qkv = host_copy(d_qkv_device, tokens * width * 2);
    float *lse = host_copy(lse_device, tokens * heads * 4);
    /* The reference on the widened inputs, q and k rotated at each row's position in its item. */
    float *in = host_alloc(tokens * width * 4), *o = host_alloc(tokens * hidden * 4),
          *d_o = host_alloc(tokens * hidden * 4);
    float *expected = host_alloc(tokens * width * 4);
    kernels_scalar()->bf16_to_f32(in, qkv, tokens * width);
    kernels_scalar()->bf16_to_f32(o, out, tokens * hidden);
    kernels_scalar()->bf16_to_f32(d_o, d_out, tokens * hidden);
    if (rotary) rope_rows(kernels_scalar()->rope, in, offsets, items, heads);
    check_t lse_check = check_start(heads, "%s: lse", name);
    for (size_t item = 0; item < items; ++item)
        for (size_t row = offsets[item]; row < offsets[item + 1]; ++row)
            for (size_t h = 0; h < heads; ++h) {
                size_t end = causal ? row + 1 : offsets[item + 1];
                double max = -INFINITY, sum = 0.0, scores[4096];
                for (size_t j = offsets[item]; j < end; ++j) {
                    double dot = 0.0;
                    for (size_t d = 0; d < HEAD; ++d)
                        dot += (double)in[row * width + h * HEAD + d] * in[j * width + hidden + h * HEAD + d];
                    scores[j - offsets[item]] = 0.125 * dot * 1.4426950408889634;
                    max = fmax(max, scores[j - offsets[item]]);
                }
                for (size_t j = offsets[item]; j < end; ++j)
                    sum += exp2(scores[j - offsets[item]] - max);
                double want = max + log2(sum);
                check_value(&lse_check, row * heads + h, lse[row * heads + h], want,
                            2e-2 + 1e-2 * fabs(want));
            }
    check_end(&lse_check);
    for (size_t h = 0; h < heads; ++h) {
        kernel_attention_backward_t a = {.q = in + h * HEAD,
                                         .k = in + hidden + h * HEAD,
                                         .v = in + 2 * hidden + h * HEAD,
                                         .stride = width,
                                         .out = o + h * HEAD,
                                         .d_out = d_o + h * HEAD,
                                         .out_stride = hidden,
                                         .d_q = expected + h * HEAD,
                                         .d_k = expected + hidden + h * HEAD,
                                         .d_v = expected + 2 * hidden + h * HEAD,
                                         .offsets = offsets,
                                         .items = items,
                                         .causal = causal,
                                         .scale = 0.125f};
        kernels_scalar()->attention_backward(&a, 0, items);
    }
    if (rotary) rope_rows(kernels_scalar()->rope_backward, expected, offsets, items, heads);
    check_t check = check_start(width, "%s", name);
    for (size_t item = 0; item < items; ++item)
        for (size_t h = 0; h < heads; ++h) {
            double largest = 0.0;
            for (size_t row = offsets[item]; row < offsets[item + 1]; ++row)
                for (size_t part = 0; part < 3; ++part)
                    for (size_t d = 0; d < HEAD; ++d)
                        largest = fmax(largest, fabs(expected[row * width + part * hidden + h * HEAD + d]));
            for (size_t row = offsets[item]; row < offsets[item + 1]; ++row)
                for (size_t part = 0; part < 3; ++part)
                    for (size_t d = 0; d < HEAD; ++d) {
                        size_t at = row * width + part * hidden + h * HEAD + d;
                        check_value(&check, at, bf16_to_f32(d_qkv[at]), expected[at], 3e-2 * largest + 1e-6);
                    }
        }
    check_end(&check);
    ran(cuda_attention_backward(d_qkv_device, rows_device, qkv_device, out_device, d_out_device, lse_device,
                                offsets_device, items, tokens, heads, max_length, causal, rotary, 0.125f,
                                stream),
        "cuda_attention_backward", "again");
    uint16_t *again = host_copy(d_qkv_device, tokens * width * 2);
    check_bits(again, d_qkv, tokens * width, 2, width, "cuda_attention_backward run twice");
    free(offsets), free(offsets32), free(qkv), free(d_out), free(out), free(d_qkv), free(lse), free(in),
        free(o), free(d_o), free(expected), free(again);
    device_free(qkv_device), device_free(d_out_device), device_free(out_device), device_free(d_qkv_device),
        device_free(lse_device), device_free(rows_device), device_free(offsets_device);
}

static void attention_backward_matches_scalar(void **state) {
    (void)state;
    random_seed(25);
    size_t const lengths[] = {1, 7, 32, 33, 64, 65, 197};
    for (int causal = 0; causal < 2; ++causal)
        for (int rotary = 0; rotary < 2; ++rotary)
            attention_backward_case(lengths, COUNT(lengths), 2, causal, rotary);
    size_t const long_item[] = {700};
    attention_backward_case(long_item, 1, 1, true, true);
    assert_int_equal(cuda_attention_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 70000, 1, false,
                                             false, 0.125f, stream),
                     cudaErrorInvalidValue);
}

/* ---- Training: linear layers' backward products ----------------------------------------------------- */

/* dW += dy^T x and dx = (or +=) dy W through cuBLASLt against sums in double of the same BF16 operands,
 * within kernels.h's GEMM tolerance; dx as F32 (written and accumulated) and as BF16. */
static void linear_backward_case(cuda_gemm_t *gemm, size_t m, size_t n, size_t k, int mode) {
    bool bf16 = mode == 2, accumulate = mode == 1;
    uint16_t *x = bf16_uniform(m * k, -1.0f, 1.0f), *w = bf16_uniform(n * k, -1.0f, 1.0f);
    uint16_t *dy = bf16_uniform(m * n, -1.0f, 1.0f);
    float *dw0 = floats_uniform(n * k, -1.0f, 1.0f), *dx0 = floats_uniform(m * k, -1.0f, 1.0f);
    uint16_t *x_device = device_copy(x, m * k * 2), *w_device = device_copy(w, n * k * 2);
    uint16_t *dy_device = device_copy(dy, m * n * 2);
    float *dw_device = device_copy(dw0, n * k * 4);
    void *dx_device = bf16 ? device_alloc(m * k * 2) : device_copy(dx0, m * k * 4);
    cuda_linear_backward_t job = {.m = m,
                                  .n = n,
                                  .k = k,
                                  .x = x_device,
                                  .x_stride = k,
                                  .w = w_device,
                                  .dy = dy_device,
                                  .dy_stride = n,
                                  .dw = dw_device,
                                  .dx = dx_device,
                                  .dx_stride = k,
                                  .dx_bf16 = bf16,
                                  .dx_accumulate = accumulate};
    char name[128];
    snprintf(name, sizeof name, "cuda_linear_backward m %zu n %zu k %zu, dx %s", m, n, k,
             bf16         ? "BF16"
             : accumulate ? "F32 accumulated"
                          : "F32");
    char const *message = "(none)";
    cudaError_t launched = cuda_linear_backward(gemm, &job, &message);
    if (launched != cudaSuccess)
        fail_msg("%s answered %s: %s; step: %s", name, cudaGetErrorName(launched),
                 cudaGetErrorString(launched), message);
    ran(cudaSuccess, "cuda_linear_backward", name);
    float *dw = host_copy(dw_device, n * k * 4);
    void *dx = host_copy(dx_device, m * k * (bf16 ? 2 : 4));
    check_t dw_check = check_start(k, "%s: dW", name), dx_check = check_start(k, "%s: dx", name);
    for (size_t i = 0; i < n; ++i)
        for (size_t j = 0; j < k; ++j) {
            double sum = dw0[i * k + j], magnitude = fabs(dw0[i * k + j]);
            for (size_t r = 0; r < m; ++r) {
                double term = (double)bf16_to_f32(dy[r * n + i]) * bf16_to_f32(x[r * k + j]);
                sum += term, magnitude += fabs(term);
            }
            check_value(&dw_check, i * k + j, dw[i * k + j], sum, 1e-2 * magnitude + 1e-6);
        }
    for (size_t r = 0; r < m; ++r)
        for (size_t j = 0; j < k; ++j) {
            double sum = accumulate ? dx0[r * k + j] : 0.0, magnitude = fabs(sum);
            for (size_t i = 0; i < n; ++i) {
                double term = (double)bf16_to_f32(dy[r * n + i]) * bf16_to_f32(w[i * k + j]);
                sum += term, magnitude += fabs(term);
            }
            double got = bf16 ? bf16_to_f32(((uint16_t *)dx)[r * k + j]) : ((float *)dx)[r * k + j];
            check_value(&dx_check, r * k + j, got, sum, 1e-2 * magnitude + 1e-6);
        }
    check_end(&dw_check), check_end(&dx_check);
    free(x), free(w), free(dy), free(dw0), free(dx0), free(dw), free(dx);
    device_free(x_device), device_free(w_device), device_free(dy_device), device_free(dw_device),
        device_free(dx_device);
}

static void linear_backward_matches_scalar(void **state) {
    (void)state;
    random_seed(26);
    cuda_gemm_t *gemm = NULL;
    CUDA_CHECK(cuda_gemm_create(&gemm, stream));
    size_t const shapes[][3] = {
        {1, 64, 128}, {7, 100, 768}, {130, 768, 3072}, {300, 2304, 768}, {64, 256, 768}};
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (int mode = 0; mode < 3; ++mode)
            linear_backward_case(gemm, shapes[s][0], shapes[s][1], shapes[s][2], mode);
    cuda_gemm_destroy(gemm);
}

/* Layers of both directions that cuBLASLt is never asked for: an empty one is done at once; a stride
 * shorter than its row, and a BF16 dx to accumulate, are refused with a message. */
static void linear_jobs_refused(void **state) {
    (void)state;
    cuda_gemm_t *gemm = NULL;
    CUDA_CHECK(cuda_gemm_create(&gemm, stream));
    cuda_linear_t empty = {.m = 0, .n = 8, .k = 8, .kind = CUDA_LINEAR_F32};
    char const *message = NULL;
    assert_int_equal(cuda_linear(gemm, &empty, &message), cudaSuccess);
    cuda_linear_t wrong = {.m = 1, .n = 8, .k = 8, .x_stride = 4, .y_stride = 8, .kind = CUDA_LINEAR_F32};
    assert_int_equal(cuda_linear(gemm, &wrong, &message), cudaErrorInvalidValue);
    assert_non_null(message);
    cuda_linear_backward_t wrong_backward = {
        .m = 1, .n = 8, .k = 8, .dy_stride = 8, .dx_bf16 = true, .dx_accumulate = true};
    message = NULL;
    assert_int_equal(cuda_linear_backward(gemm, &wrong_backward, &message), cudaErrorInvalidValue);
    assert_non_null(message);
    cuda_gemm_destroy(gemm);
}

/* ---- Training: the loss ----------------------------------------------------------------------------- */

/* The next-byte loss per row and its gradient against the RAM trainer's formulas in double. */
static void cross_entropy_matches(void **state) {
    (void)state;
    random_seed(27);
    size_t const rows = 300;
    double const scale = 0.1 / 250.0;
    float *logits = floats_uniform(rows * 256, -5.0f, 5.0f);
    int32_t *targets = host_alloc(rows * sizeof(int32_t));
    for (size_t r = 0; r < rows; ++r)
        targets[r] = r % 7 == 6 ? -1 : (int32_t)random_below(256);
    float *logits_device = device_copy(logits, rows * 256 * 4);
    int32_t *targets_device = device_copy(targets, rows * 4);
    uint16_t *d_device = device_alloc(rows * 256 * 2);
    double *loss_device = device_alloc(rows * 8);
    ran(cuda_cross_entropy(logits_device, d_device, loss_device, targets_device, rows, scale, stream),
        "cuda_cross_entropy", "300 rows");
    float *gradient = host_copy(logits_device, rows * 256 * 4);
    uint16_t *d = host_copy(d_device, rows * 256 * 2), *rounded = host_alloc(rows * 256 * 2);
    double *loss = host_copy(loss_device, rows * 8);
    check_t loss_check = check_start(1, "cuda_cross_entropy 300 rows: loss");
    check_t gradient_check = check_start(256, "cuda_cross_entropy 300 rows: gradient");
    for (size_t r = 0; r < rows; ++r) {
        float const *l = logits + r * 256;
        double max = l[0], sum = 0.0;
        for (int j = 1; j < 256; ++j)
            max = l[j] > max ? l[j] : max;
        for (int j = 0; j < 256; ++j)
            sum += exp(l[j] - max);
        int32_t target = targets[r];
        double want = target < 0 ? 0.0 : log(sum) + max - l[target];
        check_value(&loss_check, r, loss[r], want, 1e-9 * fabs(want) + 1e-12);
        for (int j = 0; j < 256; ++j) {
            double g = target < 0 ? 0.0 : scale * (exp(l[j] - max) / sum - (j == target));
            check_value(&gradient_check, r * 256 + (size_t)j, gradient[r * 256 + (size_t)j], (float)g,
                        1e-6 * scale + 0x1p-22 * fabs(g));
        }
    }
    check_end(&loss_check), check_end(&gradient_check);
    kernels_scalar()->f32_to_bf16(rounded, gradient, rows * 256);
    check_bits(d, rounded, rows * 256, 2, 256, "cuda_cross_entropy BF16 gradient");
    free(logits), free(targets), free(gradient), free(d), free(rounded), free(loss);
    device_free(logits_device), device_free(targets_device), device_free(d_device), device_free(loss_device);
}

/* docs/DESIGN.md's contrastive loss of items first .. first + local of a batch of `global`, over prefixes
 * `widths`, in double: the share, de [local, dims], d scale and d bias. */
static double reference_contrastive(double const *e, size_t global, size_t first, size_t local, size_t dims,
                                    uint32_t const *widths, size_t prefixes, uint8_t const *related, double t,
                                    double b, double *de, double *d_scale, double *d_bias) {
    double loss = 0.0, *x = host_alloc(global * dims * 8), *dx = host_alloc(dims * 8),
           *norms = host_alloc(global * 8);
    memset(de, 0, local * dims * 8);
    *d_scale = *d_bias = 0.0;
    for (size_t p = 0; p < prefixes; ++p) {
        size_t k = widths[p];
        for (size_t g = 0; g < global; ++g) {
            double sum = 0.0;
            for (size_t c = 0; c < k; ++c)
                sum += e[g * dims + c] * e[g * dims + c];
            norms[g] = sqrt(sum);
            for (size_t c = 0; c < k; ++c)
                x[g * dims + c] = e[g * dims + c] / norms[g];
        }
        for (size_t i = 0; i < local; ++i) {
            double const *xi = x + (first + i) * dims;
            memset(dx, 0, dims * 8);
            for (size_t j = 0; j < global; ++j) {
                if (j == first + i) continue;
                double dot = 0.0;
                for (size_t c = 0; c < k; ++c)
                    dot += xi[c] * x[j * dims + c];
                bool pair = j >= first && j < first + local && related[i * local + (j - first)];
                double z = pair ? 1 : -1, s = t * dot + b, sigma = 1 / (1 + exp(z * s));
                loss += log1p(exp(-z * s)) / (double)global;
                double ds = -z * sigma / (double)global;
                *d_scale += ds * dot * t, *d_bias += ds;
                for (size_t c = 0; c < k; ++c)
                    dx[c] += 2 * ds * t * x[j * dims + c];
            }
            double dot = 0.0;
            for (size_t c = 0; c < k; ++c)
                dot += xi[c] * dx[c];
            for (size_t c = 0; c < k; ++c)
                de[i * dims + c] += (dx[c] - xi[c] * dot) / norms[first + i];
        }
    }
    free(x), free(dx), free(norms);
    return loss;
}

/* The embeddings of units (one, or a clip's three frames, per item), the loss over a batch larger than the
 * process's part, and the way back, against the references in double. */
static void contrastive_matches(void **state) {
    (void)state;
    random_seed(28);
    enum { dims = 16, local = 5, first = 3, global = 11, prefixes = 2 };
    int32_t const unit_first[] = {0, 1, 4, 5, 6}, unit_count[] = {1, 3, 1, 1, 1};
    size_t const units = 7;
    uint32_t const widths[] = {8, 16};
    uint8_t related[local * local] = {0};
    related[0 * local + 1] = related[1 * local + 0] = related[2 * local + 4] = related[4 * local + 2] = 1;
    float *projected = floats_uniform(units * dims, -1.0f, 1.0f);
    double *e = host_alloc(global * dims * 8), *unit = host_alloc(units * dims * 8),
           *norms = host_alloc(units * 8);
    double *item_norms = host_alloc(local * 8);
    for (size_t g = 0; g < global; ++g) /* the other processes' items, unit rows */
        for (size_t c = 0; c < dims; ++c)
            e[g * dims + c] = (double)random_uniform(-1.0f, 1.0f);
    for (size_t u = 0; u < units; ++u) {
        double sum = 0.0;
        for (size_t c = 0; c < dims; ++c)
            sum += (double)projected[u * dims + c] * projected[u * dims + c];
        norms[u] = sqrt(sum);
        for (size_t c = 0; c < dims; ++c)
            unit[u * dims + c] = projected[u * dims + c] / norms[u];
    }
    for (size_t i = 0; i < local; ++i) {
        double *row = e + (first + i) * dims, sum = 0.0;
        for (size_t c = 0; c < dims; ++c) {
            row[c] = 0.0;
            for (int32_t u = unit_first[i]; u < unit_first[i] + unit_count[i]; ++u)
                row[c] += unit[(size_t)u * dims + c];
            row[c] /= (double)unit_count[i];
            sum += row[c] * row[c];
        }
        item_norms[i] = sqrt(sum);
        for (size_t c = 0; c < dims; ++c)
            row[c] /= unit_count[i] > 1 ? item_norms[i] : 1.0;
    }
    float const scale = 2.3f, bias = -1.5f;
    double de[local * dims], d_scale, d_bias;
    double share = reference_contrastive(e, global, first, local, dims, widths, prefixes, related,
                                         exp((double)scale), bias, de, &d_scale, &d_bias);
    /* the device: the process's embeddings from its units, then the loss over the whole batch */
    float *projected_device = device_copy(projected, units * dims * 4);
    int32_t *first_device = device_copy(unit_first, sizeof unit_first),
            *count_device = device_copy(unit_count, sizeof unit_count);
    double *e_local = device_alloc(local * dims * 8), *item_norms_device = device_alloc(local * 8);
    double *unit_device = device_alloc(units * dims * 8), *unit_norms_device = device_alloc(units * 8);
    ran(cuda_embeddings(e_local, item_norms_device, unit_device, unit_norms_device, projected_device,
                        first_device, count_device, local, dims, stream),
        "cuda_embeddings", "5 items, one a clip of 3 frames");
    double *got_local = host_copy(e_local, local * dims * 8);
    check_t embeddings = check_start(dims, "cuda_embeddings, 5 items, one of 3 frames");
    for (size_t i = 0; i < local * dims; ++i)
        check_value(&embeddings, i, got_local[i], e[first * dims + i], 1e-12);
    check_end(&embeddings);
    double *e_device = device_copy(e, global * dims * 8);
    CUDA_CHECK(cudaMemcpy(e_device + first * dims, e_local, local * dims * 8, cudaMemcpyDeviceToDevice));
    float logit[4] = {scale, bias, 0.25f, -0.5f};
    float *logit_device = device_copy(logit, sizeof logit);
    uint8_t *related_device = device_copy(related, sizeof related);
    double *de_device = device_alloc(local * dims * 8), *share_device = device_alloc(8);
    double *x = device_alloc(prefixes * global * dims * 8), *x_norms = device_alloc(prefixes * global * 8);
    double *rows = device_alloc(local * (global + dims) * 8), *losses = device_alloc(3 * local * 8);
    cuda_contrastive_t loss = {.dims = dims,
                               .prefixes = prefixes,
                               .widths = {8, 16},
                               .global = global,
                               .first = first,
                               .local = local,
                               .logit_scale = logit_device,
                               .logit_bias = logit_device + 1,
                               .d_logit_scale = logit_device + 2,
                               .d_logit_bias = logit_device + 3};
    ran(cuda_contrastive(&loss, e_device, related_device, de_device, share_device, x, x_norms, rows, losses,
                         stream),
        "cuda_contrastive", "5 items of 11, prefixes 8 and 16");
    double *got_de = host_copy(de_device, local * dims * 8), *got_share = host_copy(share_device, 8);
    float *got_logit = host_copy(logit_device, sizeof logit);
    check_t check = check_start(dims, "cuda_contrastive, 5 items of 11, prefixes 8 and 16");
    check_value(&check, 0, *got_share, share, 1e-9 * fabs(share));
    for (size_t i = 0; i < local * dims; ++i)
        check_value(&check, i, got_de[i], de[i], 1e-9);
    check_value(&check, 0, got_logit[2], 0.25 + d_scale, 1e-6 * (1 + fabs(d_scale)));
    check_value(&check, 0, got_logit[3], -0.5 + d_bias, 1e-6 * (1 + fabs(d_bias)));
    check_end(&check);
    /* the way back to the units: a clip's gradient through its mean, then each frame's normalization */
    float *d_projected_device = device_alloc(units * dims * 4);
    ran(cuda_embeddings_backward(d_projected_device, de_device, e_local, item_norms_device, unit_device,
                                 unit_norms_device, first_device, count_device, local, dims, stream),
        "cuda_embeddings_backward", "5 items");
    float *d_projected = host_copy(d_projected_device, units * dims * 4);
    check_t back = check_start(dims, "cuda_embeddings_backward, 5 items, one of 3 frames");
    for (size_t i = 0; i < local; ++i) {
        double d[16], dot = 0.0;
        double const *y = e + (first + i) * dims;
        memcpy(d, de + i * dims, sizeof d);
        if (unit_count[i] > 1) {
            for (size_t c = 0; c < dims; ++c)
                dot += y[c] * d[c];
            for (size_t c = 0; c < dims; ++c)
                d[c] = (d[c] - y[c] * dot) / item_norms[i] / (double)unit_count[i];
        }
        for (int32_t u = unit_first[i]; u < unit_first[i] + unit_count[i]; ++u) {
            double const *v = unit + (size_t)u * dims;
            double unit_dot = 0.0;
            for (size_t c = 0; c < dims; ++c)
                unit_dot += v[c] * d[c];
            for (size_t c = 0; c < dims; ++c) {
                double want = (d[c] - v[c] * unit_dot) / norms[u];
                check_value(&back, (size_t)u * dims + c, d_projected[(size_t)u * dims + c], want,
                            1e-6 * fabs(want) + 1e-9);
            }
        }
    }
    check_end(&back);
    free(projected), free(e), free(unit), free(norms), free(item_norms), free(got_local), free(got_de),
        free(got_share), free(got_logit), free(d_projected);
    device_free(projected_device), device_free(first_device), device_free(count_device), device_free(e_local),
        device_free(item_norms_device), device_free(unit_device), device_free(unit_norms_device),
        device_free(e_device), device_free(logit_device), device_free(related_device), device_free(de_device),
        device_free(share_device), device_free(x), device_free(x_norms), device_free(rows),
        device_free(losses), device_free(d_projected_device);
}

/* ---- Training: the optimizer ------------------------------------------------------------------------ */

/* A small model's parameters with gradients, on the host and in the device's flat buffers. */
typedef struct optimizer_case {
    train_params_t params;
    train_device_layout_t layout;
    size_t scalars;
    float *value, *grad, *m, *v, *flat; /* device, and a host staging */
    uint16_t *bf16;
    uint8_t *decay;
    double *norm_squared, *chunk_sums, *loss;
    uint32_t *skipped;
} optimizer_case_t;

static void optimizer_case(optimizer_case_t *c, double clip_norm, float poison) {
    uform_trainer_config_t config;
    uform_trainer_config_default(&config);
    config.depth = 1, config.hidden = 64, config.dims = 32;
    uform_model_info_t info;
    char const *message = NULL;
    assert_int_equal(train_info_from_config(&config, &info, &message), UFORM_OK);
    assert_int_equal(train_params_init(&c->params, &info, 11), UFORM_OK);
    c->params.optimizer = (train_optimizer_t){.learning_rate = 3e-3,
                                              .weight_decay = 0.05,
                                              .beta1 = 0.9,
                                              .beta2 = 0.95,
                                              .epsilon = 1e-8,
                                              .clip_norm = clip_norm,
                                              .warmup_steps = 3,
                                              .total_steps = 12};
    for (size_t t = 0; t < c->params.count; ++t) /* moments and gradients of some size, a step taken */
        for (size_t i = 0; i < c->params.tensors[t].count; ++i) {
            c->params.tensors[t].m[i] = 0.001f * (float)sin((double)(i + t));
            c->params.tensors[t].v[i] = 1e-6f * (float)(1 + (i + t) % 5);
            c->params.tensors[t].grad[i] = (float)(0.05 * cos(0.3 * (double)i + (double)t));
        }
    c->params.tensors[c->params.count / 2].grad[3] = poison;
    c->params.step = 4;
    assert_true(train_device_layout(&c->layout, &c->params));
    c->scalars = c->layout.chunks * TRAIN_DEVICE_CHUNK;
    c->flat = host_alloc(c->scalars * 4);
    float **targets[] = {&c->value, &c->m, &c->v};
    train_device_field_t const fields[] = {TRAIN_DEVICE_VALUE, TRAIN_DEVICE_M, TRAIN_DEVICE_V};
    for (size_t f = 0; f < 3; ++f) {
        train_device_pack(&c->layout, &c->params, fields[f], c->flat);
        *targets[f] = device_copy(c->flat, c->scalars * 4);
    }
    memset(c->flat, 0, c->scalars * 4);
    for (size_t t = 0; t < c->params.count; ++t)
        memcpy(c->flat + c->layout.offsets[t], c->params.tensors[t].grad, c->params.tensors[t].count * 4);
    c->grad = device_copy(c->flat, c->scalars * 4);
    c->bf16 = device_alloc(c->scalars * 2);
    c->decay = device_copy(c->layout.decay, c->layout.chunks);
    c->norm_squared = device_alloc(8), c->chunk_sums = device_alloc(c->layout.chunks * 8);
    c->skipped = device_alloc(4);
}

static void optimizer_case_free(optimizer_case_t *c) {
    train_params_free(&c->params);
    train_device_layout_free(&c->layout);
    free(c->flat);
    device_free(c->value), device_free(c->grad), device_free(c->m), device_free(c->v), device_free(c->bf16),
        device_free(c->decay), device_free(c->norm_squared), device_free(c->chunk_sums),
        device_free(c->skipped), device_free(c->loss);
}

/* The device's update of `c` with loss `loss`: the RAM trainer's AdamW settings of its next step. */
static uint32_t device_update(optimizer_case_t *c, double loss) {
    cuda_adamw_t adamw = train_vram_adamw(&c->params.optimizer, c->params.step + 1);
    c->loss = device_copy(&loss, 8);
    ran(cuda_gradient_norm(c->norm_squared, c->chunk_sums, c->grad, c->layout.chunks, stream),
        "cuda_gradient_norm", "a small model");
    ran(cuda_adamw_update(c->value, c->bf16, c->m, c->v, c->grad, c->decay, c->layout.chunks, c->norm_squared,
                          c->loss, c->skipped, &adamw, stream),
        "cuda_adamw_update", "a small model");
    uint32_t *skipped = host_copy(c->skipped, 4), answer = *skipped;
    free(skipped);
    return answer;
}

/* The device's `field` against the host's parameters: bitwise, or within `relative`. */
static void compare_field(optimizer_case_t *c, float const *device, train_device_field_t field,
                          double relative, char const *name) {
    float *got = host_copy(device, c->scalars * 4);
    train_device_pack(&c->layout, &c->params, field, c->flat);
    if (relative == 0.0) {
        check_bits(got, c->flat, c->scalars, 4, TRAIN_DEVICE_CHUNK, name);
    } else {
        check_t check = check_start(TRAIN_DEVICE_CHUNK, "%s", name);
        for (size_t i = 0; i < c->scalars; ++i)
            check_value(&check, i, got[i], c->flat[i], relative * fabs(c->flat[i]) + 1e-9);
        check_end(&check);
    }
    free(got);
}

/* AdamW on the device against the RAM trainer's (train_params_update) from the same stored values: the same
 * bits when the clip does not act, within 1e-6 when it does (the norms' sums differ in order); the BF16 copy
 * the values rounded; a loss or a gradient that is not finite writes nothing and says so. */
static void adamw_matches_ram_trainer(void **state) {
    (void)state;
    double const clips[] = {1e9, 0.1};
    for (size_t k = 0; k < COUNT(clips); ++k) {
        optimizer_case_t c = {0};
        optimizer_case(&c, clips[k], 0.01f);
        assert_int_equal(device_update(&c, 1.5), 0);
        double *norm_squared = host_copy(c.norm_squared, 8);
        double norm = train_params_update(&c.params, NULL, NULL);
        assert_true(fabs(sqrt(*norm_squared) - norm) <= 1e-12 * norm);
        double tolerance = k == 0 ? 0.0 : 1e-6;
        compare_field(&c, c.value, TRAIN_DEVICE_VALUE, tolerance,
                      k ? "cuda_adamw_update values, clipped" : "cuda_adamw_update values");
        compare_field(&c, c.m, TRAIN_DEVICE_M, tolerance,
                      k ? "cuda_adamw_update m, clipped" : "cuda_adamw_update m");
        compare_field(&c, c.v, TRAIN_DEVICE_V, tolerance,
                      k ? "cuda_adamw_update v, clipped" : "cuda_adamw_update v");
        float *values = host_copy(c.value, c.scalars * 4);
        uint16_t *rounded = host_alloc(c.scalars * 2), *copy = host_copy(c.bf16, c.scalars * 2);
        kernels_scalar()->f32_to_bf16(rounded, values, c.scalars);
        check_bits(copy, rounded, c.scalars, 2, TRAIN_DEVICE_CHUNK, "cuda_adamw_update BF16 copy");
        free(norm_squared), free(values), free(rounded), free(copy);
        optimizer_case_free(&c);
    }
    float const poisons[] = {0.01f, INFINITY};
    double const losses[] = {NAN, 1.5};
    for (size_t k = 0; k < 2; ++k) { /* a NaN loss; an infinite gradient */
        optimizer_case_t c = {0};
        optimizer_case(&c, 1.0, poisons[k]);
        assert_int_equal(device_update(&c, losses[k]), 1);
        compare_field(&c, c.value, TRAIN_DEVICE_VALUE, 0.0, "cuda_adamw_update skipped: values");
        compare_field(&c, c.m, TRAIN_DEVICE_M, 0.0, "cuda_adamw_update skipped: m");
        optimizer_case_free(&c);
    }
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
        cmocka_unit_test(conversions_bitwise),
        cmocka_unit_test(gathers_exact),
        cmocka_unit_test(mean_rows_bitwise),
        cmocka_unit_test(rmsnorm_matches_scalar),
        cmocka_unit_test(layernorm_matches_scalar),
        cmocka_unit_test(normalize_matches_scalar),
        cmocka_unit_test(tanh_matches_tanhf),
        cmocka_unit_test(convert_bitwise),
        cmocka_unit_test(choose_matches_scalar),
        cmocka_unit_test(attention_matches_scalar),
        cmocka_unit_test(attention_many_and_long),
        cmocka_unit_test(attention_heads_match_scalar),
        cmocka_unit_test(attention_bias_matches_scalar),
        cmocka_unit_test(attention_probe_matches_host),
        cmocka_unit_test(embed_tokens_and_segment_means_bitwise),
        cmocka_unit_test(linear_matches_scalar),
        cmocka_unit_test(gelu_and_backward_match_scalar),
        cmocka_unit_test(column_sums_match),
        cmocka_unit_test(rmsnorm_backward_matches_scalar),
        cmocka_unit_test(embed_backward_bitwise),
        cmocka_unit_test(assemble_tokens_backward_bitwise),
        cmocka_unit_test(attention_backward_matches_scalar),
        cmocka_unit_test(linear_backward_matches_scalar),
        cmocka_unit_test(linear_jobs_refused),
        cmocka_unit_test(cross_entropy_matches),
        cmocka_unit_test(contrastive_matches),
        cmocka_unit_test(adamw_matches_ram_trainer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
