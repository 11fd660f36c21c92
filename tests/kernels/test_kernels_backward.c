/* The training kernels (kernels.h, "Training"): the scalar backward passes against central finite
 * differences of the forward functions computed in double (gradcheck), the scalar sgemm against a double
 * product and as the gradients of a linear layer, then every SIMD path this CPU runs against the scalar
 * path within the tolerances of kernels.h, and sgemm bitwise unchanged whatever column ranges it is
 * handed. The worst error of each path, as a fraction of its tolerance's scale, is printed. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fixtures.h"
#include "kernel_fixtures.h"
#include "kernels.h"

#define STEP 1e-4 /* of the central differences, on functions computed in double */

static size_t const sizes[] = {1, 3, 15, 16, 17, 63, 64, 65, 100, 768, 1000};

/* ---- Helpers ------------------------------------------------------------------------------------ */

static float *floats_copy(float const *x, size_t n) {
    float *copy = test_malloc(n * sizeof(float));
    memcpy(copy, x, n * sizeof(float));
    return copy;
}

/* The largest |error| / scale seen by one check of one path, printed at the end of the test. */
typedef struct worst {
    double ratio;
} worst_t;

static void worst_note(worst_t *worst, double error, double scale) {
    double ratio = scale > 0 ? error / scale : error;
    if (ratio > worst->ratio) worst->ratio = ratio;
}

/* The SIMD paths this CPU and build run; skips the test when there are none. */
/* ---- Forward functions in double ---------------------------------------------------------------- */

static double gelu_double(double x) {
    double const c = (double)0.797884561f, a = (double)0.044715f;
    return 0.5 * x * (1.0 + tanh(c * (x + a * x * x * x)));
}

/* sum_i dy[i] y[i] for y = rmsnorm(x) * weight over one row of n. */
static double rmsnorm_loss(double const *x, double const *weight, float const *dy, size_t n, double eps) {
    double squares = 0.0, loss = 0.0;
    for (size_t i = 0; i < n; ++i)
        squares += x[i] * x[i];
    double inverse = 1.0 / sqrt(squares / (double)n + eps);
    for (size_t i = 0; i < n; ++i)
        loss += dy[i] * x[i] * inverse * weight[i];
    return loss;
}

/* sum over the rows of the item [first, end) of d_out . out. */
static double attention_loss(double const *q, double const *k, double const *v, float const *d_out,
                             size_t first, size_t end, bool causal, double scale) {
    double loss = 0.0, out[KERNEL_HEAD];
    for (size_t row = first; row < end; ++row) {
        attention_row_double(q, k, v, row, first, causal ? row + 1 : end, scale, NULL, out);
        for (size_t d = 0; d < KERNEL_HEAD; ++d)
            loss += d_out[row * KERNEL_HEAD + d] * out[d];
    }
    return loss;
}

/* ---- Scalar backward passes against finite differences ------------------------------------------ */

static void scalar_rmsnorm_backward_gradcheck(void **state) {
    (void)state;
    size_t const lengths[] = {1, 7, 64, 130};
    size_t const rows = 3;
    float const eps = 1e-6f;
    random_seed(101);
    for (size_t s = 0; s < COUNT(lengths); ++s) {
        size_t n = lengths[s], stride = n + 3;
        float *x = floats_uniform(rows * stride, -2.0f, 2.0f),
              *dy = floats_uniform(rows * stride, -1.0f, 1.0f);
        float *weight = floats_uniform(n, 0.5f, 1.5f), *d_weight = floats_uniform(n, -1.0f, 1.0f);
        float *d_weight_before = floats_copy(d_weight, n), *dx = floats_filled(rows * stride, SENTINEL);
        kernels_scalar()->rmsnorm_backward(dx, stride, d_weight, dy, stride, x, stride, weight, rows, n, eps);
        double *xd = test_malloc(n * sizeof(double)), *wd = test_malloc(n * sizeof(double));
        for (size_t i = 0; i < n; ++i)
            wd[i] = weight[i];
        double *d_weight_fd = test_calloc(n, sizeof(double));
        for (size_t r = 0; r < rows; ++r) {
            float const *row_dy = dy + r * stride;
            for (size_t i = 0; i < n; ++i)
                xd[i] = x[r * stride + i];
            double expected[130], largest = 0.0;
            for (size_t i = 0; i < n; ++i) {
                double kept = xd[i];
                xd[i] = kept + STEP;
                double up = rmsnorm_loss(xd, wd, row_dy, n, eps);
                xd[i] = kept - STEP;
                expected[i] = (up - rmsnorm_loss(xd, wd, row_dy, n, eps)) / (2 * STEP);
                xd[i] = kept;
                largest = fmax(largest, fabs(expected[i]));
            }
            for (size_t i = 0; i < n; ++i)
                check_near(dx[r * stride + i], expected[i], 1e-5 * largest + 1e-6, "rmsnorm dx", r * n + i);
            for (size_t i = n; i < stride; ++i)
                assert_true(dx[r * stride + i] == SENTINEL);
            for (size_t j = 0; j < n; ++j) {
                double kept = wd[j];
                wd[j] = kept + STEP;
                double up = rmsnorm_loss(xd, wd, row_dy, n, eps);
                wd[j] = kept - STEP;
                d_weight_fd[j] += (up - rmsnorm_loss(xd, wd, row_dy, n, eps)) / (2 * STEP);
                wd[j] = kept;
            }
        }
        for (size_t j = 0; j < n; ++j)
            check_near(d_weight[j] - d_weight_before[j], d_weight_fd[j], 1e-5 * fabs(d_weight_fd[j]) + 1e-6,
                       "rmsnorm d_weight", j);
        /* dx may be dy: the same bits */
        float *in_place = floats_copy(dy, rows * stride);
        memcpy(d_weight, d_weight_before, n * sizeof(float));
        kernels_scalar()->rmsnorm_backward(in_place, stride, d_weight, in_place, stride, x, stride, weight,
                                           rows, n, eps);
        for (size_t r = 0; r < rows; ++r)
            assert_memory_equal(in_place + r * stride, dx + r * stride, n * sizeof(float));
        test_free(x), test_free(dy), test_free(weight), test_free(d_weight), test_free(d_weight_before);
        test_free(dx), test_free(xd), test_free(wd), test_free(d_weight_fd), test_free(in_place);
    }
}

static void scalar_gelu_gradcheck(void **state) {
    (void)state;
    size_t const n = 2001;
    random_seed(102);
    float *x = test_malloc(n * sizeof(float)), *dy = floats_uniform(n, -2.0f, 2.0f);
    for (size_t i = 0; i < n; ++i)
        x[i] = -10.0f + 20.0f * (float)i / (float)(n - 1); /* both tails and the dip near -0.75 */
    float *y = floats_copy(x, n), *dx = test_malloc(n * sizeof(float));
    kernels_scalar()->gelu(y, n);
    kernels_scalar()->gelu_backward(dx, dy, x, n);
    for (size_t i = 0; i < n; ++i) {
        check_near(y[i], gelu_double(x[i]), 1e-6 * fabs(x[i]) + 1e-7, "gelu", i);
        double slope = (gelu_double(x[i] + STEP) - gelu_double(x[i] - STEP)) / (2 * STEP);
        check_near(dx[i], dy[i] * slope, 1e-6 * fabs(dy[i]), "gelu_backward", i);
    }
    float *in_place = floats_copy(dy, n);
    kernels_scalar()->gelu_backward(in_place, in_place, x, n);
    assert_memory_equal(in_place, dx, n * sizeof(float));
    test_free(x), test_free(dy), test_free(y), test_free(dx), test_free(in_place);
}

/* The training GELU is the scalar GEMM epilogue's, bitwise: a GEMM of k = 1 against a weight of 1 feeds
 * each value to the epilogue unchanged. */
static void scalar_gelu_is_the_gemm_epilogue(void **state) {
    (void)state;
    size_t const m = 300;
    random_seed(103);
    float *x = floats_uniform(m, -8.0f, 8.0f), *y = test_malloc(m * sizeof(float));
    gemm_activation(kernels_scalar(), KERNEL_EPILOGUE_GELU, x, m, y);
    kernels_scalar()->gelu(x, m);
    assert_memory_equal(x, y, m * sizeof(float));
    test_free(x), test_free(y);
}

/* rope is linear: its gradient is its transpose, <rope(x), y> = <x, rope_backward(y)>, and undoes it. */
static void scalar_rope_backward_is_the_transpose(void **state) {
    (void)state;
    size_t const positions[] = {0, 1, 17, 1000}, heads = 3, n = 3 * KERNEL_HEAD;
    random_seed(104);
    for (size_t p = 0; p < COUNT(positions); ++p) {
        float *x = floats_uniform(n, -1.0f, 1.0f), *y = floats_uniform(n, -1.0f, 1.0f);
        float *rotated = floats_copy(x, n), *back = floats_copy(y, n);
        kernels_scalar()->rope(rotated, heads, positions[p]);
        kernels_scalar()->rope_backward(back, heads, positions[p]);
        double forward = 0.0, transposed = 0.0;
        for (size_t i = 0; i < n; ++i) {
            forward += (double)rotated[i] * y[i];
            transposed += (double)x[i] * back[i];
        }
        check_near(forward, transposed, 1e-5, "rope transpose", positions[p]);
        kernels_scalar()->rope_backward(rotated, heads, positions[p]);
        for (size_t i = 0; i < n; ++i)
            check_near(rotated[i], x[i], 1e-6, "rope_backward(rope)", i);
        if (positions[p] == 0) assert_memory_equal(back, y, n * sizeof(float));
        test_free(x), test_free(y), test_free(rotated), test_free(back);
    }
}

/* Checks of the finite differences on one item: every element of short items, a sample of long ones. */
#define GRADCHECK_SAMPLES 160

static void attention_gradcheck_item(float const *q, float const *k, float const *v, float const *d_out,
                                     float const *const grads[3], size_t first, size_t end, bool causal,
                                     double scale) {
    size_t length = end - first, elements = length * KERNEL_HEAD;
    double *tensors[3];
    for (size_t t = 0; t < 3; ++t) {
        float const *source = t == 0 ? q : t == 1 ? k : v;
        tensors[t] = test_malloc(end * KERNEL_HEAD * sizeof(double));
        for (size_t i = 0; i < end * KERNEL_HEAD; ++i)
            tensors[t][i] = source[i];
    }
    char const *names[3] = {"attention d_q", "attention d_k", "attention d_v"};
    for (size_t t = 0; t < 3; ++t) {
        double largest = 0.0;
        for (size_t i = first * KERNEL_HEAD; i < end * KERNEL_HEAD; ++i)
            largest = fmax(largest, fabs(grads[t][i]));
        size_t checks = elements < GRADCHECK_SAMPLES ? elements : GRADCHECK_SAMPLES;
        for (size_t c = 0; c < checks; ++c) {
            size_t i = first * KERNEL_HEAD + (checks == elements ? c : random_below(elements));
            double kept = tensors[t][i];
            tensors[t][i] = kept + STEP;
            double up = attention_loss(tensors[0], tensors[1], tensors[2], d_out, first, end, causal, scale);
            tensors[t][i] = kept - STEP;
            double down =
                attention_loss(tensors[0], tensors[1], tensors[2], d_out, first, end, causal, scale);
            tensors[t][i] = kept;
            check_near(grads[t][i], (up - down) / (2 * STEP), 1e-4 * largest + 1e-6, names[t], i);
        }
    }
    for (size_t t = 0; t < 3; ++t)
        test_free(tensors[t]);
}

static void scalar_attention_backward_gradcheck(void **state) {
    (void)state;
    size_t const lengths[] = {1, 2, 5, 17, 70};
    size_t offsets[COUNT(lengths) + 1] = {0};
    for (size_t i = 0; i < COUNT(lengths); ++i)
        offsets[i + 1] = offsets[i] + lengths[i];
    size_t tokens = offsets[COUNT(lengths)], n = tokens * KERNEL_HEAD;
    float const amplitudes[] = {1.0f, 4.0f};
    random_seed(105);
    for (size_t m = 0; m < COUNT(amplitudes); ++m) {
        for (int causal = 0; causal < 2; ++causal) {
            float *q = floats_uniform(n, -amplitudes[m], amplitudes[m]);
            float *k = floats_uniform(n, -amplitudes[m], amplitudes[m]), *v = floats_uniform(n, -1.0f, 1.0f);
            float *out = floats_filled(n, 0.0f), *d_out = floats_uniform(n, -1.0f, 1.0f);
            float *d_q = floats_filled(n, SENTINEL), *d_k = floats_filled(n, SENTINEL);
            float *d_v = floats_filled(n, SENTINEL);
            kernel_attention_t forward = {.q = q,
                                          .k = k,
                                          .v = v,
                                          .stride = KERNEL_HEAD,
                                          .out = out,
                                          .out_stride = KERNEL_HEAD,
                                          .head = KERNEL_HEAD,
                                          .offsets = offsets,
                                          .items = COUNT(lengths),
                                          .causal = causal,
                                          .scale = 0.125f};
            kernels_scalar()->attention(&forward, 0, COUNT(lengths));
            kernel_attention_backward_t backward = {.q = q,
                                                    .k = k,
                                                    .v = v,
                                                    .stride = KERNEL_HEAD,
                                                    .out = out,
                                                    .d_out = d_out,
                                                    .out_stride = KERNEL_HEAD,
                                                    .d_q = d_q,
                                                    .d_k = d_k,
                                                    .d_v = d_v,
                                                    .offsets = offsets,
                                                    .items = COUNT(lengths),
                                                    .causal = causal,
                                                    .scale = 0.125f};
            kernels_scalar()->attention_backward(&backward, 0, COUNT(lengths));
            float const *const grads[3] = {d_q, d_k, d_v};
            for (size_t item = 0; item < COUNT(lengths); ++item)
                attention_gradcheck_item(q, k, v, d_out, grads, offsets[item], offsets[item + 1], causal,
                                         0.125);
            test_free(q), test_free(k), test_free(v), test_free(out), test_free(d_out);
            test_free(d_q), test_free(d_k), test_free(d_v);
        }
    }
}

/* ---- sgemm: the scalar path against double, and as a linear layer's gradients --------------------- */

/* op(a) [m, k] and op(b) [k, n] with padded strides, c [m, n] with padding, and a double reference. */
typedef struct product {
    kernel_sgemm_t sgemm;
    float *a, *b, *c, *c_before;
    double *expected, *magnitude; /* op(a) op(b) (+ c before) and sum |a b| (+ |c before|) */
} product_t;

static product_t product_make(size_t m, size_t n, size_t k, bool a_transposed, bool b_transposed,
                              bool accumulate) {
    size_t a_rows = a_transposed ? k : m, a_columns = a_transposed ? m : k;
    size_t b_rows = b_transposed ? n : k, b_columns = b_transposed ? k : n;
    product_t p = {.sgemm = {.m = m,
                             .n = n,
                             .k = k,
                             .a_stride = a_columns + 3,
                             .a_transposed = a_transposed,
                             .b_stride = b_columns + 5,
                             .b_transposed = b_transposed,
                             .c_stride = n + 7,
                             .accumulate = accumulate}};
    p.a = floats_uniform(a_rows * p.sgemm.a_stride + 1, -1.0f, 1.0f);
    p.b = floats_uniform(b_rows * p.sgemm.b_stride + 1, -1.0f, 1.0f);
    p.c_before = floats_uniform(m * p.sgemm.c_stride + 1, -1.0f, 1.0f);
    for (size_t row = 0; row < m; ++row)
        for (size_t column = n; column < p.sgemm.c_stride; ++column)
            p.c_before[row * p.sgemm.c_stride + column] = SENTINEL;
    p.c = floats_copy(p.c_before, m * p.sgemm.c_stride + 1);
    p.sgemm.a = p.a, p.sgemm.b = p.b, p.sgemm.c = p.c;
    p.expected = test_malloc((m * n + 1) * sizeof(double));
    p.magnitude = test_malloc((m * n + 1) * sizeof(double));
    for (size_t row = 0; row < m; ++row)
        for (size_t column = 0; column < n; ++column) {
            double sum = 0.0, magnitude = 0.0;
            for (size_t i = 0; i < k; ++i) {
                double a = a_transposed ? p.a[i * p.sgemm.a_stride + row] : p.a[row * p.sgemm.a_stride + i];
                double b =
                    b_transposed ? p.b[column * p.sgemm.b_stride + i] : p.b[i * p.sgemm.b_stride + column];
                sum += a * b;
                magnitude += fabs(a * b);
            }
            double before = accumulate ? p.c_before[row * p.sgemm.c_stride + column] : 0.0;
            p.expected[row * n + column] = sum + before;
            p.magnitude[row * n + column] = magnitude + fabs(before);
        }
    return p;
}

static void product_free(product_t *p) {
    test_free(p->a), test_free(p->b), test_free(p->c), test_free(p->c_before);
    test_free(p->expected), test_free(p->magnitude);
}

/* c = c before, to run the product again. */
static void product_reset(product_t *p) {
    memcpy(p->c, p->c_before, (p->sgemm.m * p->sgemm.c_stride + 1) * sizeof(float));
}

/* c within kernels.h's tolerance of `expected` (1e-5 of the magnitude + 1e-6), its padding untouched;
 * notes the worst error relative to the magnitude. */
static void product_check(product_t const *p, double const *expected, char const *what, worst_t *worst) {
    kernel_sgemm_t const *s = &p->sgemm;
    for (size_t row = 0; row < s->m; ++row) {
        for (size_t column = 0; column < s->n; ++column) {
            double actual = p->c[row * s->c_stride + column], e = expected[row * s->n + column];
            double magnitude = p->magnitude[row * s->n + column];
            check_near(actual, e, 1e-5 * magnitude + 1e-6, what, row * s->n + column);
            if (worst) worst_note(worst, fabs(actual - e), magnitude);
        }
        for (size_t column = s->n; column < s->c_stride; ++column)
            assert_true(p->c[row * s->c_stride + column] == SENTINEL);
    }
    assert_true(p->c[s->m * s->c_stride] == p->c_before[s->m * s->c_stride]);
}

typedef struct shape {
    size_t m, n, k;
} shape_t;

static shape_t const shapes[] = {{7, 130, 67},   {1, 1, 1},      {3, 5, 0},    {13, 64, 128},
                                 {25, 200, 300}, {50, 257, 129}, {12, 96, 385}};

static void scalar_sgemm_matches_double(void **state) {
    (void)state;
    random_seed(106);
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (int flags = 0; flags < 8; ++flags) {
            product_t p =
                product_make(shapes[s].m, shapes[s].n, shapes[s].k, flags & 1, flags & 2, flags & 4);
            kernels_scalar()->sgemm(&p.sgemm, 0, p.sgemm.n);
            product_check(&p, p.expected, "scalar sgemm", NULL);
            product_free(&p);
        }
}

/* y = x W^T with loss sum dy y: dx = dy W and dW = dy^T x (accumulated onto dW) are the finite differences
 * of the loss, computed as kernels.h pairs the products with sgemm's operands. */
static void scalar_sgemm_linear_layer_gradcheck(void **state) {
    (void)state;
    size_t const m = 7, n = 13, k = 67; /* x [m, k], W [n, k], dy [m, n] */
    random_seed(107);
    float *x = floats_uniform(m * k, -1.0f, 1.0f), *w = floats_uniform(n * k, -1.0f, 1.0f);
    float *dy = floats_uniform(m * n, -1.0f, 1.0f), *dx = floats_filled(m * k, SENTINEL);
    float *dw = floats_uniform(n * k, -1.0f, 1.0f), *dw_before = floats_copy(dw, n * k);
    kernel_sgemm_t const d_input = kernel_sgemm_linear(KERNEL_LINEAR_DX, m, n, k, dy, w, dx);
    kernel_sgemm_t const d_weight = kernel_sgemm_linear(KERNEL_LINEAR_DW, m, n, k, dy, x, dw);
    kernels_scalar()->sgemm(&d_input, 0, k);
    kernels_scalar()->sgemm(&d_weight, 0, k);
    double *xd = test_malloc(m * k * sizeof(double)), *wd = test_malloc(n * k * sizeof(double));
    for (size_t i = 0; i < m * k; ++i)
        xd[i] = x[i];
    for (size_t i = 0; i < n * k; ++i)
        wd[i] = w[i];
    for (size_t which = 0; which < 2; ++which) {
        double *tensor = which ? wd : xd;
        size_t count = which ? n * k : m * k;
        for (size_t i = 0; i < count; ++i) {
            double kept = tensor[i], losses[2];
            for (size_t side = 0; side < 2; ++side) {
                tensor[i] = kept + (side ? -STEP : STEP);
                losses[side] = 0.0;
                for (size_t row = 0; row < m; ++row)
                    for (size_t column = 0; column < n; ++column) {
                        double y = 0.0;
                        for (size_t p = 0; p < k; ++p)
                            y += xd[row * k + p] * wd[column * k + p];
                        losses[side] += dy[row * n + column] * y;
                    }
            }
            tensor[i] = kept;
            double expected = (losses[0] - losses[1]) / (2 * STEP);
            if (which)
                check_near(dw[i] - dw_before[i], expected, 1e-5, "dW", i);
            else
                check_near(dx[i], expected, 1e-5, "dx", i);
        }
    }
    test_free(x), test_free(w), test_free(dy), test_free(dx), test_free(dw), test_free(dw_before);
    test_free(xd), test_free(wd);
}

/* ---- SIMD paths against scalar ------------------------------------------------------------------ */

static void paths_sgemm_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    worst_t worst[SIMD_PATHS] = {{0}};
    random_seed(108);
    for (size_t s = 0; s < COUNT(shapes); ++s)
        for (int flags = 0; flags < 8; ++flags) {
            product_t p =
                product_make(shapes[s].m, shapes[s].n, shapes[s].k, flags & 1, flags & 2, flags & 4);
            kernels_scalar()->sgemm(&p.sgemm, 0, p.sgemm.n);
            double *scalar = test_malloc((p.sgemm.m * p.sgemm.n + 1) * sizeof(double));
            for (size_t row = 0; row < p.sgemm.m; ++row)
                for (size_t column = 0; column < p.sgemm.n; ++column)
                    scalar[row * p.sgemm.n + column] = p.c[row * p.sgemm.c_stride + column];
            for (size_t i = 0; i < path_count; ++i) {
                product_reset(&p);
                paths[i]->sgemm(&p.sgemm, 0, p.sgemm.n);
                product_check(&p, scalar, paths[i]->name, &worst[i]);
            }
            test_free(scalar);
            product_free(&p);
        }
    for (size_t i = 0; i < path_count; ++i)
        print_message("sgemm %s: worst |c - scalar| / (sum |a b| + |c before|) = %.3g\n", paths[i]->name,
                      worst[i].ratio);
}

/* Each path (scalar too), over the whole of [0, n) and over pieces cut at KERNEL_GEMM_TILE multiples:
 * the same bits. */
static void paths_sgemm_deterministic_over_splits(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS + 1] = {kernels_scalar()};
    size_t path_count = 1 + simd_paths_present(paths + 1);
    size_t const cuts[][5] = {{0, 64, 300}, {0, 128, 192, 256, 300}, {0, 64, 128, 192, 300}}; /* n = 300 */
    size_t const cut_counts[] = {3, 5, 5};
    random_seed(109);
    for (int flags = 0; flags < 8; ++flags) {
        product_t p = product_make(37, 300, 290, flags & 1, flags & 2, flags & 4);
        size_t floats = p.sgemm.m * p.sgemm.c_stride + 1;
        for (size_t i = 0; i < path_count; ++i) {
            product_reset(&p);
            paths[i]->sgemm(&p.sgemm, 0, p.sgemm.n);
            float *whole = floats_copy(p.c, floats);
            for (size_t c = 0; c < COUNT(cuts); ++c) {
                product_reset(&p);
                for (size_t piece = cut_counts[c] - 1; piece > 0; --piece) /* last first: order is free */
                    paths[i]->sgemm(&p.sgemm, cuts[c][piece - 1], cuts[c][piece]);
                if (memcmp(p.c, whole, floats * sizeof(float)))
                    fail_msg("%s sgemm (flags %d) differs when split by cuts %zu", paths[i]->name, flags, c);
            }
            test_free(whole);
        }
        product_free(&p);
    }
}

static void paths_rmsnorm_backward_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), rows = 4;
    worst_t worst_dx[SIMD_PATHS] = {{0}}, worst_dw[SIMD_PATHS] = {{0}};
    random_seed(110);
    for (size_t s = 0; s < COUNT(sizes); ++s) {
        size_t n = sizes[s], x_stride = n + 5, dy_stride = n + 3, dx_stride = n + 1;
        float *x = floats_uniform(rows * x_stride, -2.0f, 2.0f), *weight = floats_uniform(n, 0.5f, 1.5f);
        float *dy = floats_uniform(rows * dy_stride, -1.0f, 1.0f);
        float *d_weight_before = floats_uniform(n + 1, -1.0f, 1.0f);
        float *expected = floats_filled(rows * dx_stride, SENTINEL),
              *d_weight_expected = floats_copy(d_weight_before, n + 1);
        kernels_scalar()->rmsnorm_backward(expected, dx_stride, d_weight_expected, dy, dy_stride, x, x_stride,
                                           weight, rows, n, 1e-6f);
        double *magnitude = test_calloc(n, sizeof(double)); /* sum |dy x / r| + |d_weight before| */
        for (size_t r = 0; r < rows; ++r) {
            double squares = 0.0;
            for (size_t i = 0; i < n; ++i)
                squares += (double)x[r * x_stride + i] * x[r * x_stride + i];
            double inverse = 1.0 / sqrt(squares / (double)n + 1e-6);
            for (size_t i = 0; i < n; ++i)
                magnitude[i] += fabs(dy[r * dy_stride + i] * x[r * x_stride + i] * inverse);
        }
        for (size_t i = 0; i < n; ++i)
            magnitude[i] += fabs(d_weight_before[i]);
        for (size_t p = 0; p < path_count; ++p) {
            for (int in_place = 0; in_place < 2; ++in_place) {
                float *dx =
                    in_place ? floats_copy(dy, rows * dy_stride) : floats_filled(rows * dx_stride, SENTINEL);
                size_t stride = in_place ? dy_stride : dx_stride;
                float *d_weight = floats_copy(d_weight_before, n + 1);
                paths[p]->rmsnorm_backward(dx, stride, d_weight, in_place ? dx : dy, dy_stride, x, x_stride,
                                           weight, rows, n, 1e-6f);
                for (size_t r = 0; r < rows; ++r) { /* scale: the largest |weight dy| / r of the row */
                    double squares = 0.0, largest = 0.0;
                    for (size_t i = 0; i < n; ++i)
                        squares += (double)x[r * x_stride + i] * x[r * x_stride + i];
                    for (size_t i = 0; i < n; ++i)
                        largest = fmax(largest, fabs(weight[i] * dy[r * dy_stride + i]) /
                                                    sqrt(squares / (double)n + 1e-6));
                    for (size_t i = 0; i < n; ++i) {
                        double error = fabs(dx[r * stride + i] - expected[r * dx_stride + i]);
                        check_near(dx[r * stride + i], expected[r * dx_stride + i], 1e-5 * largest,
                                   paths[p]->name, r * n + i);
                        worst_note(&worst_dx[p], error, largest);
                    }
                    for (size_t i = n; i < stride; ++i)
                        assert_true(in_place ? dx[r * stride + i] == dy[r * dy_stride + i]
                                             : dx[r * stride + i] == SENTINEL);
                }
                for (size_t i = 0; i < n; ++i) {
                    check_near(d_weight[i], d_weight_expected[i], 1e-5 * magnitude[i], paths[p]->name, i);
                    worst_note(&worst_dw[p], fabs(d_weight[i] - d_weight_expected[i]), magnitude[i]);
                }
                assert_true(d_weight[n] == d_weight_before[n]);
                test_free(dx), test_free(d_weight);
            }
        }
        test_free(x), test_free(weight), test_free(dy), test_free(d_weight_before), test_free(expected);
        test_free(d_weight_expected), test_free(magnitude);
    }
    for (size_t p = 0; p < path_count; ++p)
        print_message(
            "rmsnorm_backward %s: worst dx error / max|weight dy / r| of the row = %.3g, d_weight error / "
            "sum|terms| = %.3g\n",
            paths[p]->name, worst_dx[p].ratio, worst_dw[p].ratio);
}

static void paths_gelu_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), n = 4001;
    worst_t worst_forward[SIMD_PATHS] = {{0}}, worst_backward[SIMD_PATHS] = {{0}};
    random_seed(111);
    float *x = test_malloc((n + 1) * sizeof(float)), *dy = floats_uniform(n + 1, -2.0f, 2.0f);
    for (size_t i = 0; i <= n; ++i)
        x[i] = i % 2 ? random_uniform(-3.0f, 3.0f) : -20.0f + 40.0f * (float)i / (float)n;
    float *y_expected = floats_copy(x, n), *dx_expected = test_malloc(n * sizeof(float));
    kernels_scalar()->gelu(y_expected, n);
    kernels_scalar()->gelu_backward(dx_expected, dy, x, n);
    for (size_t p = 0; p < path_count; ++p) {
        size_t const lengths[] = {n, 17, 5}; /* tails of every width */
        for (size_t l = 0; l < COUNT(lengths); ++l) {
            size_t length = lengths[l];
            float *y = floats_copy(x, n + 1), *dx = floats_filled(n + 1, SENTINEL),
                  *in_place = floats_copy(dy, n + 1);
            paths[p]->gelu(y, length);
            paths[p]->gelu_backward(dx, dy, x, length);
            paths[p]->gelu_backward(in_place, in_place, x, length);
            for (size_t i = 0; i < length; ++i) {
                check_near(y[i], y_expected[i], 1e-6 * fabsf(x[i]) + 1e-7, paths[p]->name, i);
                check_near(dx[i], dx_expected[i], 1e-6 * fabsf(dy[i]), paths[p]->name, i);
                assert_true(in_place[i] == dx[i]);
                worst_note(&worst_forward[p], fabsf(y[i] - y_expected[i]), fabsf(x[i]));
                worst_note(&worst_backward[p], fabsf(dx[i] - dx_expected[i]), fabsf(dy[i]));
            }
            assert_true(y[length] == x[length] && dx[length] == SENTINEL && in_place[length] == dy[length]);
            test_free(y), test_free(dx), test_free(in_place);
        }
    }
    for (size_t p = 0; p < path_count; ++p)
        print_message("gelu %s: worst error / |x| = %.3g; gelu_backward: worst error / |dy| = %.3g\n",
                      paths[p]->name, worst_forward[p].ratio, worst_backward[p].ratio);
    test_free(x), test_free(dy), test_free(y_expected), test_free(dx_expected);
}

static void paths_rope_backward_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths), heads = 5, n = 5 * KERNEL_HEAD;
    random_seed(112);
    float *x = floats_uniform(n, -1.0f, 1.0f);
    for (size_t position = 0; position < 300; position += 37) {
        float *expected = floats_copy(x, n);
        kernels_scalar()->rope_backward(expected, heads, position);
        for (size_t p = 0; p < path_count; ++p) {
            float *rotated = floats_copy(x, n);
            paths[p]->rope_backward(rotated, heads, position);
            for (size_t i = 0; i < n; ++i)
                check_near(rotated[i], expected[i], 1e-5, paths[p]->name, i);
            test_free(rotated);
        }
        test_free(expected);
    }
    test_free(x);
}

/* The packed batch of kernel_fixtures.h, and the gradients likewise; the kernels work on head 1. */
typedef struct attention_batch {
    qkv_batch_t rows; /* offsets, tokens, qkv */
    float *out, *d_out;
} attention_batch_t;

static attention_batch_t attention_batch_make(float amplitude, bool causal) {
    attention_batch_t batch = {.rows = qkv_batch_make(amplitude)};
    batch.out = floats_filled(batch.rows.tokens * HIDDEN, 0.0f);
    batch.d_out = floats_uniform(batch.rows.tokens * HIDDEN, -1.0f, 1.0f);
    kernel_attention_t forward = qkv_batch_head(&batch.rows, 1, causal, batch.out);
    kernels_scalar()->attention(&forward, 0, ITEMS);
    return batch;
}

static void attention_batch_free(attention_batch_t *batch) {
    test_free(batch->rows.qkv), test_free(batch->out), test_free(batch->d_out);
}

static kernel_attention_backward_t attention_backward_of(attention_batch_t const *batch, bool causal,
                                                         float *d_qkv) {
    float const *qkv = batch->rows.qkv + KERNEL_HEAD;
    float *d = d_qkv + KERNEL_HEAD;
    return (kernel_attention_backward_t){.q = qkv,
                                         .k = qkv + HIDDEN,
                                         .v = qkv + 2 * HIDDEN,
                                         .stride = 3 * HIDDEN,
                                         .out = batch->out + KERNEL_HEAD,
                                         .d_out = batch->d_out + KERNEL_HEAD,
                                         .out_stride = HIDDEN,
                                         .d_q = d,
                                         .d_k = d + HIDDEN,
                                         .d_v = d + 2 * HIDDEN,
                                         .offsets = batch->rows.offsets,
                                         .items = ITEMS,
                                         .causal = causal,
                                         .scale = 0.125f};
}

/* Every column of d_qkv outside head 1 of q, k and v still holds the sentinel. */
static void check_other_heads_untouched(float const *d_qkv, size_t tokens) {
    for (size_t row = 0; row < tokens; ++row)
        for (size_t i = 0; i < 3 * HIDDEN; ++i)
            if (i / KERNEL_HEAD % HEADS != 1 && d_qkv[row * 3 * HIDDEN + i] != SENTINEL)
                fail_msg("attention_backward wrote column %zu of row %zu, outside head 1", i, row);
}

/* The largest |d| of head 1 of d_q, d_k and d_v over rows [first, end). */
static double item_largest(float const *d_qkv, size_t first, size_t end) {
    float largest = 0.0f;
    for (size_t row = first; row < end; ++row)
        for (size_t t = 0; t < 3; ++t) {
            float const *d = d_qkv + row * 3 * HIDDEN + t * HIDDEN + KERNEL_HEAD;
            for (size_t i = 0; i < KERNEL_HEAD; ++i)
                if (fabsf(d[i]) > largest) largest = fabsf(d[i]);
        }
    return largest;
}

static void paths_attention_backward_match_scalar(void **state) {
    (void)state;
    kernels_t const *paths[SIMD_PATHS];
    size_t path_count = simd_paths(paths);
    float const amplitudes[] = {1.0f, 6.0f};
    size_t const cuts[] = {0, 2, 3, 3, 5, ITEMS};
    worst_t worst[SIMD_PATHS] = {{0}};
    random_seed(113);
    for (size_t m = 0; m < COUNT(amplitudes); ++m) {
        for (int causal = 0; causal < 2; ++causal) {
            attention_batch_t batch = attention_batch_make(amplitudes[m], causal);
            size_t floats = batch.rows.tokens * 3 * HIDDEN;
            float *expected = floats_filled(floats, SENTINEL);
            kernel_attention_backward_t a = attention_backward_of(&batch, causal, expected);
            kernels_scalar()->attention_backward(&a, 0, ITEMS);
            check_other_heads_untouched(expected, batch.rows.tokens);
            for (size_t p = 0; p < path_count; ++p) {
                float *whole = floats_filled(floats, SENTINEL), *pieces = floats_filled(floats, SENTINEL);
                a = attention_backward_of(&batch, causal, whole);
                paths[p]->attention_backward(&a, 0, ITEMS);
                check_other_heads_untouched(whole, batch.rows.tokens);
                for (size_t item = 0; item < ITEMS; ++item) {
                    double largest =
                        item_largest(expected, batch.rows.offsets[item], batch.rows.offsets[item + 1]);
                    for (size_t t = 0; t < 3; ++t) { /* d_q, d_k, d_v */
                        size_t column = t * HIDDEN + KERNEL_HEAD;
                        for (size_t row = batch.rows.offsets[item]; row < batch.rows.offsets[item + 1]; ++row)
                            for (size_t d = 0; d < KERNEL_HEAD; ++d) {
                                size_t i = row * 3 * HIDDEN + column + d;
                                check_near(whole[i], expected[i], 1e-4 * largest, paths[p]->name, i);
                                worst_note(&worst[p], fabs(whole[i] - expected[i]), largest);
                            }
                    }
                }
                a.d_q = pieces + KERNEL_HEAD, a.d_k = a.d_q + HIDDEN, a.d_v = a.d_q + 2 * HIDDEN;
                for (size_t c = 0; c + 1 < COUNT(cuts); ++c)
                    paths[p]->attention_backward(&a, cuts[c], cuts[c + 1]);
                assert_memory_equal(pieces, whole, floats * sizeof(float));
                test_free(whole), test_free(pieces);
            }
            test_free(expected);
            attention_batch_free(&batch);
        }
    }
    for (size_t p = 0; p < path_count; ++p)
        print_message("attention_backward %s: worst error / max|d| of the item's d_q, d_k, d_v = %.3g\n",
                      paths[p]->name, worst[p].ratio);
}

int main(void) {
    print_simd_paths();
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(scalar_rmsnorm_backward_gradcheck),
        cmocka_unit_test(scalar_gelu_gradcheck),
        cmocka_unit_test(scalar_gelu_is_the_gemm_epilogue),
        cmocka_unit_test(scalar_rope_backward_is_the_transpose),
        cmocka_unit_test(scalar_attention_backward_gradcheck),
        cmocka_unit_test(scalar_sgemm_matches_double),
        cmocka_unit_test(scalar_sgemm_linear_layer_gradcheck),
        cmocka_unit_test(paths_sgemm_match_scalar),
        cmocka_unit_test(paths_sgemm_deterministic_over_splits),
        cmocka_unit_test(paths_rmsnorm_backward_match_scalar),
        cmocka_unit_test(paths_gelu_match_scalar),
        cmocka_unit_test(paths_rope_backward_match_scalar),
        cmocka_unit_test(paths_attention_backward_match_scalar),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
