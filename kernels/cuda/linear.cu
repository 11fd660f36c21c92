/* Linear layers through cuBLASLt (cuda_linear in cuda_kernels.h).
 *
 * Row-major y [m, n] = x [m, k] W [n, k]^T maps onto cuBLASLt's column-major product as
 *   D (n x m, ld y_stride) = op_T(A) B,  A = W stored k x n (ld k),  B = x stored k x m (ld x_stride),
 * with BF16 A and B, CUBLAS_COMPUTE_32F and F32 alpha and beta. Per kind:
 *   BF16:      D BF16, epilogue BIAS (DEFAULT without a bias);
 *   GELU_BF16: D BF16, epilogue GELU_BIAS (GELU without a bias; cuBLASLt's GELU is the tanh form);
 *   GELU_ERF_BF16, GELU_QUICK_BF16: D BF16, epilogue DEFAULT, then epilogue_kernel below (cuBLASLt has
 *              neither activation);
 *   RESIDUAL:  C = D = y F32, beta = 1, epilogue BIAS;
 *   F32:       D F32, beta = 0, epilogue BIAS when there is a bias.
 * The backward products of training (cuda_linear_backward in cuda_train.h), with the default epilogue:
 *   DX:        D (k x m, ld dx_stride) = W (k x n) dy (n x m), F32 or BF16, beta 1 to accumulate;
 *   DW:        D (k x n, ld k) = x (k x m) op_T(dy: n x m), F32, beta = 1 (gradients accumulate).
 * The algorithm comes from cublasLtMatmulAlgoGetHeuristic, once per (product, shape, strides, kind, bias,
 * pointer alignments), and is kept with its descriptors in a small table replaced round-robin.
 *
 * The bias is F32. cuBLASLt is first asked for it as is (BIAS_DATA_TYPE = CUDA_R_32F); beside a BF16 D it
 * wants a BF16 bias (cuBLASLt 13.0 on an H200 refuses the F32 one), so the bias is then rounded into a
 * BF16 copy the gemm owns, by a small kernel before each product, as PyTorch's BF16 layers round theirs.
 *
 * Fallback: when the heuristic offers no algorithm with the epilogue (or the fused call answers
 * NOT_SUPPORTED), the plan is rebuilt with the DEFAULT epilogue and epilogue_kernel below adds the bias
 * and applies the activation after the product. For BF16 outputs that rounds the product to BF16 once more
 * before the bias, well within kernels.h's GEMM tolerance. */
#include <cstdlib>
#include <cstring>

#include <cublasLt.h>

#include "cuda_common.cuh"
#include "cuda_train.h"

#define GEMM_WORKSPACE ((size_t)32 << 20) /* bytes, allocated once per cuda_gemm */
#define GEMM_PLANS     64
#define GEMM_BIAS      65536 /* BF16 copies of biases up to this long; longer ones take the fallback */

/* How a plan applies the bias and the activation: in cuBLASLt's epilogue with the F32 bias or with the gemm's
 * BF16 copy of it, or in epilogue_kernel after the product. */
typedef enum gemm_epilogue { EPILOGUE_F32_BIAS, EPILOGUE_BF16_BIAS, EPILOGUE_OURS } gemm_epilogue_t;

/* Which product of a linear layer y = x W^T: the forward one, or a backward one (dx = dy W, dW += dy^T x). */
typedef enum gemm_product { PRODUCT_FORWARD, PRODUCT_DX, PRODUCT_DW } gemm_product_t;

/* What an algorithm is chosen for. Alignments are the largest power of two, up to 256, dividing each
 * pointer (cuBLASLt's A, B and D): cuBLASLt assumes 256 unless told, and some algorithms need it. For the
 * backward products x_stride is dy's row stride (DX) or x's (DW), y_stride dx's (DX). */
typedef struct gemm_key {
    gemm_product_t product;
    size_t m, n, k, x_stride, y_stride, dy_stride;
    cuda_linear_kind_t kind;
    bool bias, fuse, accumulate;
    uint32_t a_alignment, b_alignment, d_alignment, bias_alignment;
} gemm_key_t;

/* The product of a key in cuBLASLt's column-major terms: D = op(A) op(B), each operand as stored. */
typedef struct gemm_shape {
    cublasOperation_t transa, transb;
    uint64_t a_rows, a_columns, b_rows, b_columns, d_rows, d_columns;
    int64_t a_ld, b_ld, d_ld;
    cudaDataType_t d_type;
} gemm_shape_t;

typedef struct gemm_plan {
    bool used;
    gemm_key_t key;
    gemm_epilogue_t epilogue;
    bool fused; /* cuBLASLt's epilogue does the bias and activation (or there are none): not EPILOGUE_OURS */
    cublasLtMatmulDesc_t operation;
    cublasLtMatrixLayout_t a, b, d; /* d describes C too */
    cublasLtMatmulAlgo_t algo;
} gemm_plan_t;

struct cuda_gemm {
    cublasLtHandle_t handle;
    cudaStream_t stream;
    void *workspace;     /* [GEMM_WORKSPACE] device bytes */
    uint16_t *bias_bf16; /* [GEMM_BIAS] device BF16: the bias of the plans with EPILOGUE_BF16_BIAS */
    bool fuse;           /* ask cuBLASLt for epilogues (tests turn it off to run the fallback) */
    bool last_fused;
    int last_status; /* cublasStatus_t of the last failing cuBLASLt call */
    unsigned next;   /* the plan replaced next */
    gemm_plan_t plans[GEMM_PLANS];
};

/* ---- The fallback epilogue ---------------------------------------------------------------------- */

/* The activation a kind applies after the bias (kernels.h's epilogues). */
typedef enum activation {
    ACTIVATION_NONE,
    ACTIVATION_GELU,
    ACTIVATION_GELU_ERF,
    ACTIVATION_GELU_QUICK
} activation_t;

/* The GELUs of kernels/gelu.h, with its constants: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))),
 * 0.5x(1 + erf(x / sqrt 2)) and x / (1 + exp(-1.702x)). */
static __device__ __forceinline__ float activate(activation_t activation, float x) {
    switch (activation) {
    case ACTIVATION_GELU:
        return 0.5f * x * (1.0f + tanhf(0.797884561f * (x + 0.044715f * x * x * x)));
    case ACTIVATION_GELU_ERF:
        return 0.5f * x * (1.0f + erff(x * 0.707106781f));
    case ACTIVATION_GELU_QUICK:
        return x / (1.0f + expf(-1.702f * x));
    case ACTIVATION_NONE:
        break;
    }
    return x;
}

/* y [m, n] (row stride y_stride): BF16 y = activation(y + bias), or F32 y += bias. */
static __global__ void epilogue_kernel(void *y, size_t y_stride, float const *bias, size_t m, size_t n,
                                       bool bf16, activation_t activation) {
    for (size_t r = blockIdx.x; r < m; r += gridDim.x) {
        for (size_t c = threadIdx.x; c < n; c += blockDim.x) {
            if (bf16) {
                uint16_t *at = (uint16_t *)y + r * y_stride + c;
                float value = bf16_value(*at);
                if (bias) value += bias[c];
                *at = bf16_bits(activate(activation, value));
            } else {
                float *at = (float *)y + r * y_stride + c;
                *at += bias[c];
            }
        }
    }
}

static __global__ void bias_to_bf16_kernel(uint16_t *out, float const *bias, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = bf16_bits(bias[i]);
}

/* ---- Plans -------------------------------------------------------------------------------------- */

static cudaError_t error_of(cublasStatus_t status) {
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return cudaSuccess;
    case CUBLAS_STATUS_ALLOC_FAILED:
        return cudaErrorMemoryAllocation;
    case CUBLAS_STATUS_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return cudaErrorNotSupported;
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return cudaErrorLaunchFailure;
    default:
        return cudaErrorUnknown;
    }
}

static uint32_t alignment_of(void const *pointer) {
    uintptr_t address = (uintptr_t)pointer;
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment)
        alignment >>= 1;
    return alignment;
}

static bool key_equal(gemm_key_t const *a, gemm_key_t const *b) {
    return a->product == b->product && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->x_stride == b->x_stride && a->y_stride == b->y_stride && a->dy_stride == b->dy_stride &&
           a->kind == b->kind && a->bias == b->bias && a->fuse == b->fuse && a->accumulate == b->accumulate &&
           a->a_alignment == b->a_alignment && a->b_alignment == b->b_alignment &&
           a->d_alignment == b->d_alignment && a->bias_alignment == b->bias_alignment;
}

static void plan_release(gemm_plan_t *plan) {
    if (plan->operation) cublasLtMatmulDescDestroy(plan->operation);
    if (plan->a) cublasLtMatrixLayoutDestroy(plan->a);
    if (plan->b) cublasLtMatrixLayoutDestroy(plan->b);
    if (plan->d) cublasLtMatrixLayoutDestroy(plan->d);
    memset(plan, 0, sizeof *plan);
}

/* Whether the kind's activation is cuBLASLt's GELU epilogue. */
static bool kind_gelu(cuda_linear_kind_t kind) {
    return kind == CUDA_LINEAR_GELU_BF16;
}

/* Whether the kind's activation is one cuBLASLt lacks: the plan is always ours. */
static bool kind_ours(cuda_linear_kind_t kind) {
    return kind == CUDA_LINEAR_GELU_ERF_BF16 || kind == CUDA_LINEAR_GELU_QUICK_BF16;
}

static activation_t kind_activation(cuda_linear_kind_t kind) {
    return kind == CUDA_LINEAR_GELU_BF16         ? ACTIVATION_GELU
           : kind == CUDA_LINEAR_GELU_ERF_BF16   ? ACTIVATION_GELU_ERF
           : kind == CUDA_LINEAR_GELU_QUICK_BF16 ? ACTIVATION_GELU_QUICK
                                                 : ACTIVATION_NONE;
}

static bool kind_bf16(cuda_linear_kind_t kind) {
    return kind == CUDA_LINEAR_BF16 || kind == CUDA_LINEAR_GELU_BF16 || kind_ours(kind);
}

/* Row-major y [m, n] = x [m, k] W^T is column-major D (n x m) = op_T(W: k x n) x (k x m); dx [m, k] = dy
 * [m, n] W [n, k] is D (k x m) = W (k x n) dy (n x m); dW [n, k] += dy^T x is D (k x n) = x (k x m) op_T(dy:
 * n x m). */
static gemm_shape_t key_shape(gemm_key_t const *key) {
    gemm_shape_t shape;
    memset(&shape, 0, sizeof shape);
    shape.d_type = kind_bf16(key->kind) ? CUDA_R_16BF : CUDA_R_32F;
    shape.transb = CUBLAS_OP_N;
    shape.transa = key->product == PRODUCT_FORWARD ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (key->product == PRODUCT_FORWARD) {
        shape.a_rows = key->k, shape.a_columns = key->n, shape.a_ld = (int64_t)key->k;
        shape.b_rows = key->k, shape.b_columns = key->m, shape.b_ld = (int64_t)key->x_stride;
        shape.d_rows = key->n, shape.d_columns = key->m, shape.d_ld = (int64_t)key->y_stride;
    } else if (key->product == PRODUCT_DX) {
        shape.a_rows = key->k, shape.a_columns = key->n, shape.a_ld = (int64_t)key->k;
        shape.b_rows = key->n, shape.b_columns = key->m, shape.b_ld = (int64_t)key->dy_stride;
        shape.d_rows = key->k, shape.d_columns = key->m, shape.d_ld = (int64_t)key->y_stride;
    } else {
        shape.transb = CUBLAS_OP_T;
        shape.a_rows = key->k, shape.a_columns = key->m, shape.a_ld = (int64_t)key->x_stride;
        shape.b_rows = key->n, shape.b_columns = key->m, shape.b_ld = (int64_t)key->dy_stride;
        shape.d_rows = key->k, shape.d_columns = key->n, shape.d_ld = (int64_t)key->k;
    }
    return shape;
}

/* Builds `plan` for `key` (pointers from `linear`, for the alignments the heuristic assumes) with the
 * bias and GELU applied as `how` says. Answers CUBLAS_STATUS_NOT_SUPPORTED when the heuristic offers no
 * algorithm, or the status of the cuBLASLt call that failed; *message names it. The plan is released on
 * every answer but success. */
static cublasStatus_t plan_build(cuda_gemm_t *gemm, gemm_plan_t *plan, gemm_key_t const *key,
                                 cuda_linear_t const *linear, gemm_epilogue_t how, char const **message) {
    memset(plan, 0, sizeof *plan);
    bool fused = how != EPILOGUE_OURS;
    void const *bias_pointer =
        how == EPILOGUE_BF16_BIAS ? (void const *)gemm->bias_bf16 : (void const *)linear->bias;
    cublasLtMatmulPreference_t preference = NULL;
    gemm_shape_t shape = key_shape(key);
    bool gelu_wanted = kind_gelu(key->kind), bias = key->bias;
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    if (fused && gelu_wanted)
        epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (fused && bias)
        epilogue = CUBLASLT_EPILOGUE_BIAS;
    int32_t bias_type = how == EPILOGUE_BF16_BIAS ? CUDA_R_16BF : CUDA_R_32F;
    uint64_t workspace = GEMM_WORKSPACE;
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    int results = 0;
    cublasStatus_t status;

    *message = "cublasLtMatmulDescCreate failed";
    if ((status = cublasLtMatmulDescCreate(&plan->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F))) goto fail;
    *message = "cublasLtMatmulDescSetAttribute failed";
    if ((status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSA, &shape.transa,
                                                 sizeof shape.transa)) ||
        (status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_TRANSB, &shape.transb,
                                                 sizeof shape.transb)) ||
        (status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                 sizeof epilogue)))
        goto fail;
    if (epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
        /* A cuBLASLt that refuses this bias type beside this D type refuses it here or in the heuristic,
         * and the caller tries the next way. */
        *message = "cublasLtMatmulDescSetAttribute (bias) failed";
        if ((status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias_pointer, sizeof bias_pointer)) ||
            (status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bias_type, sizeof bias_type)))
            goto fail;
    }
    *message = "cublasLtMatrixLayoutCreate failed";
    if ((status =
             cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, shape.a_rows, shape.a_columns, shape.a_ld)) ||
        (status =
             cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, shape.b_rows, shape.b_columns, shape.b_ld)) ||
        (status =
             cublasLtMatrixLayoutCreate(&plan->d, shape.d_type, shape.d_rows, shape.d_columns, shape.d_ld)))
        goto fail;
    *message = "cublasLtMatmulPreferenceCreate failed";
    if ((status = cublasLtMatmulPreferenceCreate(&preference))) goto fail;
    *message = "cublasLtMatmulPreferenceSetAttribute failed";
    if ((status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace, sizeof workspace)) ||
        (status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                       &key->a_alignment, sizeof key->a_alignment)) ||
        (status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                       &key->b_alignment, sizeof key->b_alignment)) ||
        (status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                       &key->d_alignment, sizeof key->d_alignment)) ||
        (status = cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                       &key->d_alignment, sizeof key->d_alignment)))
        goto fail;
    *message = "cublasLtMatmulAlgoGetHeuristic failed";
    if ((status = cublasLtMatmulAlgoGetHeuristic(gemm->handle, plan->operation, plan->a, plan->b, plan->d,
                                                 plan->d, preference, 1, &result, &results)))
        goto fail;
    *message = "cuBLASLt offers no algorithm for this linear layer";
    if (results < 1 || result.state != CUBLAS_STATUS_SUCCESS) {
        status = CUBLAS_STATUS_NOT_SUPPORTED;
        goto fail;
    }
    cublasLtMatmulPreferenceDestroy(preference);
    plan->used = true;
    plan->key = *key;
    plan->epilogue = how;
    plan->fused = fused || !(bias || kind_activation(key->kind) != ACTIVATION_NONE);
    plan->algo = result.algo;
    return CUBLAS_STATUS_SUCCESS;

fail:
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    plan_release(plan);
    return status;
}

static bool refused(cublasStatus_t status) {
    return status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE;
}

/* Builds `plan` with the first epilogue cuBLASLt accepts: fused with the F32 bias, fused with the BF16
 * copy (BF16 outputs with a bias that fits it), then ours. Without `fuse`, or for an activation cuBLASLt
 * lacks, ours directly. */
static cublasStatus_t plan_make(cuda_gemm_t *gemm, gemm_plan_t *plan, gemm_key_t const *key,
                                cuda_linear_t const *linear, bool fuse, char const **message) {
    if (fuse && !kind_ours(key->kind) && (key->bias || kind_gelu(key->kind))) {
        cublasStatus_t status = plan_build(gemm, plan, key, linear, EPILOGUE_F32_BIAS, message);
        if (!refused(status)) return status;
        if (key->bias && kind_bf16(key->kind) && key->n <= GEMM_BIAS) {
            status = plan_build(gemm, plan, key, linear, EPILOGUE_BF16_BIAS, message);
            if (!refused(status)) return status;
        }
    }
    return plan_build(gemm, plan, key, linear, EPILOGUE_OURS, message);
}

/* Enqueues the product of `plan` and, when its epilogue is not fused, the bias and activation kernel. */
static cublasStatus_t plan_run(cuda_gemm_t *gemm, gemm_plan_t *plan, cuda_linear_t const *linear,
                               cudaError_t *launch, char const **message) {
    float alpha = 1.0f, beta = linear->kind == CUDA_LINEAR_RESIDUAL ? 1.0f : 0.0f;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    *launch = cudaSuccess;
    if (plan->epilogue == EPILOGUE_F32_BIAS && linear->bias &&
        (status = cublasLtMatmulDescSetAttribute(plan->operation, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                 &linear->bias, sizeof linear->bias)))
        return *message = "cublasLtMatmulDescSetAttribute (bias) failed", status;
    if (plan->epilogue == EPILOGUE_BF16_BIAS) { /* the copy's pointer is in the plan already */
        bias_to_bf16_kernel<<<cuda_blocks(linear->n, CUDA_THREADS), CUDA_THREADS, 0, gemm->stream>>>(
            gemm->bias_bf16, linear->bias, linear->n);
        if ((*launch = cuda_launched()))
            return *message = "the bias conversion kernel failed to launch", CUBLAS_STATUS_SUCCESS;
    }
    if ((status = cublasLtMatmul(gemm->handle, plan->operation, &alpha, linear->w, plan->a, linear->x,
                                 plan->b, &beta, linear->y, plan->d, linear->y, plan->d, &plan->algo,
                                 gemm->workspace, GEMM_WORKSPACE, gemm->stream)))
        return *message = "cublasLtMatmul failed", status;
    if (plan->epilogue == EPILOGUE_OURS && !plan->fused) {
        epilogue_kernel<<<cuda_blocks(linear->m, 1), CUDA_THREADS, 0, gemm->stream>>>(
            linear->y, linear->y_stride, linear->bias, linear->m, linear->n, kind_bf16(linear->kind),
            kind_activation(linear->kind));
        if ((*launch = cuda_launched())) *message = "the bias and activation kernel failed to launch";
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The cached plan of `key`, or NULL. */
static gemm_plan_t *plan_find(cuda_gemm_t *gemm, gemm_key_t const *key) {
    for (unsigned i = 0; i < GEMM_PLANS; ++i)
        if (gemm->plans[i].used && key_equal(&gemm->plans[i].key, key)) return &gemm->plans[i];
    return NULL;
}

/* The slot replaced next, released. */
static gemm_plan_t *plan_take(cuda_gemm_t *gemm) {
    gemm_plan_t *plan = &gemm->plans[gemm->next];
    gemm->next = (gemm->next + 1) % GEMM_PLANS;
    plan_release(plan);
    return plan;
}

/* ---- The interface ------------------------------------------------------------------------------ */

extern "C" cudaError_t cuda_gemm_create(cuda_gemm_t **gemm, cudaStream_t stream) {
    *gemm = NULL;
    cuda_gemm_t *created = (cuda_gemm_t *)calloc(1, sizeof *created);
    if (!created) return cudaErrorMemoryAllocation;
    cublasStatus_t status = cublasLtCreate(&created->handle);
    if (status) {
        free(created);
        return error_of(status);
    }
    cudaError_t error = cudaMalloc(&created->workspace, GEMM_WORKSPACE);
    if (!error) error = cudaMalloc((void **)&created->bias_bf16, GEMM_BIAS * sizeof(uint16_t));
    if (error) {
        cudaFree(created->workspace);
        cublasLtDestroy(created->handle);
        free(created);
        return error;
    }
    created->stream = stream;
    created->fuse = true;
    *gemm = created;
    return cudaSuccess;
}

extern "C" void cuda_gemm_destroy(cuda_gemm_t *gemm) {
    if (!gemm) return;
    for (unsigned i = 0; i < GEMM_PLANS; ++i)
        plan_release(&gemm->plans[i]);
    cudaFree(gemm->workspace); /* waits for the work that may still use it */
    cudaFree(gemm->bias_bf16);
    cublasLtDestroy(gemm->handle);
    free(gemm);
}

extern "C" void cuda_gemm_set_fuse(cuda_gemm_t *gemm, bool fuse) {
    gemm->fuse = fuse;
}

extern "C" bool cuda_gemm_last_fused(cuda_gemm_t const *gemm) {
    return gemm->last_fused;
}

extern "C" int cuda_gemm_last_status(cuda_gemm_t const *gemm) {
    return gemm->last_status;
}

extern "C" cudaError_t cuda_linear(cuda_gemm_t *gemm, cuda_linear_t const *linear, char const **answer) {
    char const *ignored, **message = answer ? answer : &ignored;
    if (!gemm || !linear) return *message = "gemm or linear is NULL", cudaErrorInvalidValue;
    cuda_linear_kind_t kind = linear->kind;
    if (kind != CUDA_LINEAR_BF16 && kind != CUDA_LINEAR_GELU_BF16 && kind != CUDA_LINEAR_RESIDUAL &&
        kind != CUDA_LINEAR_F32 && !kind_ours(kind))
        return *message = "unknown linear kind", cudaErrorInvalidValue;
    if (linear->m == 0 || linear->n == 0) return cudaSuccess;
    if (linear->k == 0 || linear->x_stride < linear->k || linear->y_stride < linear->n)
        return *message = "k is 0 or a stride is shorter than its row", cudaErrorInvalidValue;
    if (!linear->x || !linear->w || !linear->y) return *message = "x, w or y is NULL", cudaErrorInvalidValue;

    gemm_key_t key;
    memset(&key, 0, sizeof key);
    key.m = linear->m, key.n = linear->n, key.k = linear->k;
    key.x_stride = linear->x_stride, key.y_stride = linear->y_stride;
    key.kind = kind, key.bias = linear->bias != NULL, key.fuse = gemm->fuse;
    key.b_alignment = alignment_of(linear->x), key.a_alignment = alignment_of(linear->w);
    key.d_alignment = alignment_of(linear->y), key.bias_alignment = alignment_of(linear->bias);

    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    cudaError_t launch = cudaSuccess;
    char const *step = NULL; /* what failed, for *answer; the tries that fell back leave no trace */
    gemm_plan_t *plan = plan_find(gemm, &key);
    if (!plan) {
        plan = plan_take(gemm);
        status = plan_make(gemm, plan, &key, linear, key.fuse, &step);
    }
    if (!status) status = plan_run(gemm, plan, linear, &launch, &step);
    /* A fused epilogue refused at run time: the plan becomes the fallback, kept for the next calls. */
    if (status == CUBLAS_STATUS_NOT_SUPPORTED && plan->fused && (linear->bias || kind_gelu(kind))) {
        status = plan_build(gemm, plan, &key, linear, EPILOGUE_OURS, &step);
        if (!status) status = plan_run(gemm, plan, linear, &launch, &step);
    }
    if (status) {
        gemm->last_status = (int)status;
        *message = step;
        return error_of(status);
    }
    if (launch) return *message = step, launch;
    gemm->last_fused = plan->fused;
    return cudaSuccess;
}

/* ---- Backward products ------------------------------------------------------------------------------ */

/* Enqueues D = op(A) op(B) (+ D when key->accumulate) for a backward key: the default epilogue, the plan
 * cached as the forward ones are. */
static cudaError_t backward_product(cuda_gemm_t *gemm, gemm_key_t const *key, void const *a, void const *b,
                                    void *d, char const **message) {
    cuda_linear_t none;
    memset(&none, 0, sizeof none); /* no bias: plan_build reads nothing else of it */
    gemm_plan_t *plan = plan_find(gemm, key);
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    if (!plan) {
        plan = plan_take(gemm);
        status = plan_build(gemm, plan, key, &none, EPILOGUE_OURS, message);
    }
    float alpha = 1.0f, beta = key->accumulate ? 1.0f : 0.0f;
    if (!status && (status = cublasLtMatmul(gemm->handle, plan->operation, &alpha, a, plan->a, b, plan->b,
                                            &beta, d, plan->d, d, plan->d, &plan->algo, gemm->workspace,
                                            GEMM_WORKSPACE, gemm->stream)))
        *message = "cublasLtMatmul failed";
    if (status) gemm->last_status = (int)status;
    return error_of(status);
}

extern "C" cudaError_t cuda_linear_backward(cuda_gemm_t *gemm, cuda_linear_backward_t const *linear,
                                            char const **answer) {
    char const *ignored, **message = answer ? answer : &ignored;
    if (!gemm || !linear) return *message = "gemm or linear is NULL", cudaErrorInvalidValue;
    if (linear->m == 0 || linear->n == 0 || linear->k == 0) return cudaSuccess;
    if (!linear->dy || linear->dy_stride < linear->n)
        return *message = "dy is NULL or short", cudaErrorInvalidValue;
    if (linear->dx_bf16 && linear->dx_accumulate)
        return *message = "a BF16 dx cannot be accumulated", cudaErrorInvalidValue;
    gemm_key_t key;
    cudaError_t error = cudaSuccess;
    if (linear->dw) {
        if (!linear->x || linear->x_stride < linear->k)
            return *message = "x is NULL or short", cudaErrorInvalidValue;
        memset(&key, 0, sizeof key);
        key.product = PRODUCT_DW, key.m = linear->m, key.n = linear->n, key.k = linear->k;
        key.x_stride = linear->x_stride, key.dy_stride = linear->dy_stride;
        key.kind = CUDA_LINEAR_F32, key.accumulate = true;
        key.a_alignment = alignment_of(linear->x), key.b_alignment = alignment_of(linear->dy);
        key.d_alignment = alignment_of(linear->dw);
        error = backward_product(gemm, &key, linear->x, linear->dy, linear->dw, message);
    }
    if (!error && linear->dx) {
        if (!linear->w || linear->dx_stride < linear->k)
            return *message = "w is NULL or dx short", cudaErrorInvalidValue;
        memset(&key, 0, sizeof key);
        key.product = PRODUCT_DX, key.m = linear->m, key.n = linear->n, key.k = linear->k;
        key.y_stride = linear->dx_stride, key.dy_stride = linear->dy_stride;
        key.kind = linear->dx_bf16 ? CUDA_LINEAR_BF16 : CUDA_LINEAR_F32,
        key.accumulate = linear->dx_accumulate;
        key.a_alignment = alignment_of(linear->w), key.b_alignment = alignment_of(linear->dy);
        key.d_alignment = alignment_of(linear->dx);
        error = backward_product(gemm, &key, linear->w, linear->dy, linear->dx, message);
    }
    return error;
}
