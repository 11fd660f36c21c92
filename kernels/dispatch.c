/* Chooses the kernel path once per process: UFORM_KERNELS when the CPU can run it, else the best one
 * the CPU supports. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"

static kernels_t const scalar_path = {
    .name = "scalar",
    .gemm = kernel_gemm_scalar,
    .gemm_packed_size = kernel_gemm_packed_size_scalar,
    .gemm_pack = kernel_gemm_pack_scalar,
    .rmsnorm = kernel_rmsnorm_scalar,
    .rope = kernel_rope_scalar,
    .attention = kernel_attention_scalar,
    .softmax = kernel_softmax_scalar,
    .normalize = kernel_normalize_scalar,
    .convert = kernel_convert_scalar,
    .bf16_to_f32 = kernel_bf16_to_f32_scalar,
    .f32_to_bf16 = kernel_f32_to_bf16_scalar,
    .sgemm = kernel_sgemm_scalar,
    .rmsnorm_backward = kernel_rmsnorm_backward_scalar,
    .gelu_backward = kernel_gelu_backward_scalar,
    .gelu = kernel_gelu_scalar,
    .rope_backward = kernel_rope_backward_scalar,
    .attention_backward = kernel_attention_backward_scalar,
};

kernels_t const *kernels_scalar(void) {
    return &scalar_path;
}

#if defined(__x86_64__)

static kernels_t const avx2_path = {
    .name = "avx2",
    .gemm = kernel_gemm_avx2,
    .gemm_packed_size = kernel_gemm_packed_size_avx2,
    .gemm_pack = kernel_gemm_pack_avx2,
    .rmsnorm = kernel_rmsnorm_avx2,
    .rope = kernel_rope_scalar,
    .attention = kernel_attention_avx2,
    .softmax = kernel_softmax_avx2,
    .normalize = kernel_normalize_avx2,
    .convert = kernel_convert_scalar,
    .bf16_to_f32 = kernel_bf16_to_f32_avx2,
    .f32_to_bf16 = kernel_f32_to_bf16_avx2,
    .sgemm = kernel_sgemm_avx2,
    .rmsnorm_backward = kernel_rmsnorm_backward_avx2,
    .gelu_backward = kernel_gelu_backward_avx2,
    .gelu = kernel_gelu_avx2,
    .rope_backward = kernel_rope_backward_scalar,
    .attention_backward = kernel_attention_backward_avx2,
};

static kernels_t const avx512_path = {
    .name = "avx512",
    .gemm = kernel_gemm_avx512,
    .gemm_packed_size = kernel_gemm_packed_size_avx512,
    .gemm_pack = kernel_gemm_pack_avx512,
    .rmsnorm = kernel_rmsnorm_avx512,
    .rope = kernel_rope_scalar,
    .attention = kernel_attention_avx512,
    .softmax = kernel_softmax_avx512,
    .normalize = kernel_normalize_avx512,
    .convert = kernel_convert_avx512,
    .bf16_to_f32 = kernel_bf16_to_f32_avx512,
    .f32_to_bf16 = kernel_f32_to_bf16_avx512,
    .sgemm = kernel_sgemm_avx512,
    .rmsnorm_backward = kernel_rmsnorm_backward_avx512,
    .gelu_backward = kernel_gelu_backward_avx512,
    .gelu = kernel_gelu_avx512,
    .rope_backward = kernel_rope_backward_scalar,
    .attention_backward = kernel_attention_backward_avx512,
};

static kernels_t const avx512bf16_path = {
    .name = "avx512bf16",
    .gemm = kernel_gemm_avx512bf16,
    .gemm_packed_size = kernel_gemm_packed_size_avx512bf16,
    .gemm_pack = kernel_gemm_pack_avx512bf16,
    .rmsnorm = kernel_rmsnorm_avx512,
    .rope = kernel_rope_scalar,
    .attention = kernel_attention_avx512,
    .softmax = kernel_softmax_avx512,
    .normalize = kernel_normalize_avx512,
    .convert = kernel_convert_avx512,
    .bf16_to_f32 = kernel_bf16_to_f32_avx512,
    .f32_to_bf16 = kernel_f32_to_bf16_avx512,
    .sgemm = kernel_sgemm_avx512,
    .rmsnorm_backward = kernel_rmsnorm_backward_avx512,
    .gelu_backward = kernel_gelu_backward_avx512,
    .gelu = kernel_gelu_avx512,
    .rope_backward = kernel_rope_backward_scalar,
    .attention_backward = kernel_attention_backward_avx512,
};

static bool cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static bool cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

static bool cpu_has_avx512bf16(void) {
    return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

kernels_t const *kernels_avx2(void) {
    return cpu_has_avx2() ? &avx2_path : NULL;
}

kernels_t const *kernels_avx512(void) {
    return cpu_has_avx512() ? &avx512_path : NULL;
}

kernels_t const *kernels_avx512bf16(void) {
    return cpu_has_avx512bf16() ? &avx512bf16_path : NULL;
}

#else

kernels_t const *kernels_avx2(void) {
    return NULL;
}

kernels_t const *kernels_avx512(void) {
    return NULL;
}

kernels_t const *kernels_avx512bf16(void) {
    return NULL;
}

#endif

#if defined(__aarch64__)

/* Advanced SIMD is part of every ARMv8-A CPU that runs Linux: no run-time check. */
static kernels_t const neon_path = {
    .name = "neon",
    .gemm = kernel_gemm_neon,
    .gemm_packed_size = kernel_gemm_packed_size_neon,
    .gemm_pack = kernel_gemm_pack_neon,
    .rmsnorm = kernel_rmsnorm_neon,
    .rope = kernel_rope_scalar,
    .attention = kernel_attention_neon,
    .softmax = kernel_softmax_neon,
    .normalize = kernel_normalize_neon,
    .convert = kernel_convert_scalar,
    .bf16_to_f32 = kernel_bf16_to_f32_neon,
    .f32_to_bf16 = kernel_f32_to_bf16_neon,
    .sgemm = kernel_sgemm_neon,
    .rmsnorm_backward = kernel_rmsnorm_backward_neon,
    .gelu_backward = kernel_gelu_backward_neon,
    .gelu = kernel_gelu_neon,
    .rope_backward = kernel_rope_backward_scalar,
    .attention_backward = kernel_attention_backward_scalar,
};

kernels_t const *kernels_neon(void) {
    return &neon_path;
}

#else

kernels_t const *kernels_neon(void) {
    return NULL;
}

#endif

kernels_t const *kernels_named(char const *name) {
    if (!name) return NULL;
    if (!strcmp(name, "scalar")) return kernels_scalar();
    if (!strcmp(name, "avx2")) return kernels_avx2();
    if (!strcmp(name, "avx512")) return kernels_avx512();
    if (!strcmp(name, "avx512bf16")) return kernels_avx512bf16();
    if (!strcmp(name, "neon")) return kernels_neon();
    return NULL;
}

static kernels_t const *active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void kernels_choose(void) {
    active = kernels_named(getenv("UFORM_KERNELS"));
    if (active) return;
    kernels_t const *(*const best_first[])(void) = {kernels_avx512bf16, kernels_avx512, kernels_avx2,
                                                    kernels_neon};
    for (size_t i = 0; i < sizeof best_first / sizeof best_first[0] && !active; ++i)
        active = best_first[i]();
    if (!active) active = kernels_scalar();
}

kernels_t const *kernels_active(void) {
    pthread_once(&active_once, kernels_choose);
    return active;
}
